"""The history drafter's index: longest matches over a prompt, its group's answers (running ones
included), its earlier answers and (optionally) the whole step's; bounds and forgetting."""

from __future__ import annotations

from longtail_api.policies import HistorySpec
from longtail_workers.engine.native.history import HistoryAnswer, HistoryIndex

PROMPT = [90, 91, 92, 93]


def _index(**kwargs: object) -> HistoryIndex:
    index = HistoryIndex(HistorySpec(**kwargs))  # type: ignore[arg-type]
    index.begin_call()
    return index


def _answer(index: HistoryIndex, tokens: list[int], prompt: list[int] = PROMPT) -> HistoryAnswer:
    answer = index.admit(prompt)
    for t in tokens:  # committed one step at a time, as the engine does
        index.extend(answer, [t])
    return answer


def test_proposes_what_followed_the_longest_match_in_another_answer() -> None:
    index = _index(min_match=2, max_match=16)
    index.finish(_answer(index, [1, 2, 3, 4, 5, 6, 7]))
    index.finish(_answer(index, [8, 3, 4, 9, 9]))  # newer, but matches "3 4" only
    row = _answer(index, [2, 3, 4])
    assert index.propose(row, 3) == ([5, 6, 7], 3)  # "2 3 4" is the longer match
    assert index.propose(row, 10) == ([5, 6, 7], 3)  # no more than what followed
    other = _answer(index, [7, 3, 4])  # "3 4" only: the newest of the equally long matches
    assert index.propose(other, 2) == ([9, 9], 2)


def test_a_match_may_start_in_the_prompt_and_the_prompt_is_looked_up() -> None:
    index = _index(min_match=2)
    index.finish(_answer(index, [5, 6, 7]))
    first = _answer(index, [5])  # "92 93 5": the prompt's tail and the first answer token
    assert index.propose(first, 2) == ([6, 7], 5)  # the whole prompt matched, then 5
    copy = _answer(index, [91, 92])  # the answer copies part of the prompt
    assert index.propose(copy, 2) == ([93], 2)  # what followed it there


def test_never_proposes_a_rows_own_newest_tokens_but_uses_its_past() -> None:
    index = _index(min_match=2)
    alone = _answer(index, [1, 2, 3])
    assert index.propose(alone, 4) == ([], 0)  # "2 3" occurs only at its own end
    loop = _answer(index, [4, 5, 6, 4, 5])
    assert index.propose(loop, 4) == ([6, 4, 5], 2)  # its own earlier "4 5": committed tokens


def test_answers_still_being_generated_are_looked_up_as_they_grow() -> None:
    index = _index(min_match=2)
    ahead = _answer(index, [1, 2, 3, 4])  # running, not finished
    behind = _answer(index, [1, 2])
    assert index.propose(behind, 5) == ([3, 4], 6)  # only the committed tokens of `ahead`
    index.extend(ahead, [5, 6])
    assert index.propose(behind, 5) == ([3, 4, 5, 6], 6)  # newly committed tokens count


def test_earlier_calls_of_the_same_prompt_only_unless_whole_step() -> None:
    index = _index(min_match=2)
    index.finish(_answer(index, [1, 2, 3, 4]))
    index.finish(_answer(index, [7, 8, 9], prompt=[50, 51]))
    index.begin_call()  # the next RL step
    assert index.propose(_answer(index, [0, 2, 3]), 2) == ([4], 2)  # an earlier step's answer
    assert index.propose(_answer(index, [0, 7, 8]), 2) == ([], 0)  # not another prompt's

    whole = _index(min_match=2, whole_step=True)
    whole.finish(_answer(whole, [7, 8, 9], prompt=[50, 51]))
    row = _answer(whole, [0, 7, 8])
    assert whole.propose(row, 2) == ([9], 2)  # every answer of this call
    whole.begin_call()
    assert whole.propose(_answer(whole, [0, 7, 8]), 2) == ([], 0)  # not another prompt's past


def test_match_bounds() -> None:
    index = _index(min_match=3, max_match=4)
    index.finish(_answer(index, [1, 2, 3, 4, 5, 6, 7, 8]))
    assert index.propose(_answer(index, [0, 4, 5]), 2) == ([], 0)  # 2 tokens < minMatch
    assert index.propose(_answer(index, [0, 3, 4, 5]), 2) == ([6, 7], 3)
    assert index.propose(_answer(index, [1, 2, 3, 4, 5]), 2) == ([6, 7], 4)  # capped


def test_per_prompt_bound_drops_oldest_finished_answers_never_running_ones() -> None:
    # Each answer document holds the prompt's last 4 tokens (maxMatch) and its own.
    index = _index(min_match=2, max_match=4, max_tokens_per_prompt=30, max_tokens_total=1000)
    old = _answer(index, [1, 2, 3, 4, 5, 6])  # 10 tokens
    index.finish(old)
    running = _answer(index, [11, 12, 13, 14, 15, 16])  # running: never dropped
    assert index.tokens == 4 + 10 + 10  # the prompt document too
    newer = _answer(index, [21, 22, 23, 24, 25, 26])  # 34 > 30: `old` goes
    assert index.tokens == 24
    assert index.propose(_answer(index, [0, 2, 3]), 2) == ([], 0)
    assert index.propose(_answer(index, [0, 12, 13]), 2) == ([14, 15], 2)
    assert index.propose(_answer(index, [0, 22, 23]), 2) == ([24, 25], 2)
    index.finish(running)  # now the oldest finished answer: dropped as `newer` grows
    index.extend(newer, [27])
    assert index.propose(_answer(index, [0, 12, 13]), 2) == ([], 0)


def test_total_bound_drops_least_recently_used_prompts() -> None:
    index = _index(min_match=2, max_match=4, max_tokens_per_prompt=1000, max_tokens_total=40)
    index.finish(_answer(index, [1, 2, 3, 4], prompt=[10, 11]))  # 2 + 6 tokens
    index.finish(_answer(index, [5, 6, 7, 8], prompt=[20, 21]))  # 2 + 6
    index.begin_call()
    assert index.propose(_answer(index, [0, 2, 3], prompt=[10, 11]), 1) == ([4], 2)  # used
    assert index.prompts == 2
    for _ in range(2):  # a third prompt grows: [20, 21] was used least recently
        index.finish(_answer(index, [30, 31, 32, 33, 34, 35, 36, 37], prompt=[30, 31]))
    assert index.prompts == 2 and index.tokens <= 40
    assert index.propose(_answer(index, [0, 6, 7], prompt=[20, 21]), 1) == ([], 0)
    assert index.propose(_answer(index, [0, 2, 3], prompt=[10, 11]), 1) == ([4], 2)


def test_new_policy_forgets_earlier_calls_only_when_configured() -> None:
    for clear in (False, True):
        index = _index(min_match=2, clear_on_new_policy=clear)
        index.finish(_answer(index, [1, 2, 3, 4]))
        other = _answer(index, [5, 6, 7])  # still running (a call in flight): kept
        index.finish(_answer(index, [8, 9, 10]))
        index.new_policy()  # between calls: the worker loads the version, then generates
        index.begin_call()
        found = index.propose(_answer(index, [0, 2, 3]), 1)
        assert found == (([], 0) if clear else ([4], 2))
        assert index.propose(_answer(index, [0, 5, 6]), 1) == ([7], 2)
        assert index.propose(_answer(index, [0, 8, 9]), 1) == (([], 0) if clear else ([10], 2))
        del other
