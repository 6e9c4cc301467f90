"""The ``math`` reward (math-verify behind our final-answer rules), the format component and the
reward registry. Hard cases with hand verdicts: test_reward_hard_cases.py; the checker
processes and their time limit: test_reward_checker.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from longtail_workers.rewards import (
    DEFAULT_TIMEOUT_S,
    MAX_CHECK_CHARS,
    RewardResult,
    UnknownRewardError,
    answers_match,
    answers_match_verdict,
    combine,
    configure_math_checker,
    get_reward,
    known_rewards,
    math_reward,
    register_reward,
    unregister_reward,
)
from longtail_workers.rewards.prepare import prepare_answer


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("42", "42"),
        ("+42", "42"),
        ("0042", "42"),
        ("1,234", "1234"),
        ("-1,234.5", "-1234.5"),
        ("0.50", "0.5"),
        ("5.", "5"),  # a sentence-ending period (prepare.py)
        ("1/2", "0.5"),
        (r"\frac{1}{2}", "0.5"),
        (r"\dfrac{3}{4}", "3/4"),
        (r"-\frac{1}{2}", "-0.5"),
        (r"\left( 3 \right)", "3"),
        ("$42$", "42"),
        (r"\$5", "5"),
        (r"12 \text{ cm}", "12"),
        ("42 dogs", "42"),  # plain words after a number (prepare.py)
        ("21 in total", "21"),
        ("x = 5", "5"),
        (r"90^\circ", "90"),
        ("90°", "90"),  # Unicode look-alikes (prepare.py)
        (r"50\%", "50"),
        ("\u22125", "-5"),  # U+2212 MINUS SIGN
        ("٤٢", "42"),  # Arabic-Indic digits
        ("４２", "42"),  # full-width digits
        ("½", "0.5"),
        ("x²", "x^2"),
        ("x + 1", "1+x"),
        (r"\sqrt{8}", r"2\sqrt{2}"),
        (r"\{2, 1\}", r"\{1, 2\}"),
    ],
)
def test_equivalent_answers_match(answer: str, gold: str) -> None:
    verdict = answers_match_verdict(answer, gold)
    assert verdict.correct and verdict.reason is None, (prepare_answer(answer), verdict)
    assert answers_match(answer, gold)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("0.3333", "1/3"),  # a rounded decimal is not the fraction
        ("42", "43"),
        ("-5", "5"),
        ("1, 234", "1234"),  # a list, not a thousands separator
        (r"2 \pi", "2"),  # pi is not a unit
        ("2 pi", "2"),
        ("2 x", "2"),  # nor is a single letter
        (r"\text{no}", "yes"),
        ("1/0", "0"),
        ("(2, 1)", "(1, 2)"),
    ],
)
def test_different_answers_do_not_match(answer: str, gold: str) -> None:
    verdict = answers_match_verdict(answer, gold)
    assert not verdict.correct and verdict.reason is None, verdict


@pytest.mark.parametrize(
    ("answer", "gold", "reason"),
    [
        ("...", "...", "the answer is empty after clean-up"),  # empty never matches empty
        ("", "", "the answer is empty after clean-up"),
        ("42", " ", "the gold answer is empty after clean-up"),
    ],
)
def test_empty_answers_never_match(answer: str, gold: str, reason: str) -> None:
    assert answers_match_verdict(answer, gold).reason == reason
    assert not answers_match(answer, gold)


def test_long_answers_are_compared_as_text_with_the_reason() -> None:
    long = "word " * (MAX_CHECK_CHARS // 5 + 10)
    verdict = answers_match_verdict(long, long.replace(" ", "  "))
    assert verdict.correct
    assert verdict.reason is not None and "compared as text, not parsed" in verdict.reason
    assert not answers_match(long, long + "x")


def test_answers_from_many_threads() -> None:
    # math-verify's own signal-based timeout raises outside the main thread; ours does not.
    results: list[bool] = []

    def score(i: int) -> None:
        results.append(math_reward(f"Answer: {i}/4", str(i / 4)).correct)

    threads = [threading.Thread(target=score, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == [True] * 12


# --- the math reward -----------------------------------------------------------------------


def test_math_reward_correct_boxed() -> None:
    result = math_reward(r"... so \boxed{\frac{1}{2}}", "0.5")
    assert result == RewardResult(
        reward=1.0, correct=True, extracted=r"\frac{1}{2}", formatted=True, reason=None
    )


def test_math_reward_wrong_but_formatted() -> None:
    result = math_reward("Answer: 41", "42")
    assert result == RewardResult(reward=0.0, correct=False, extracted="41", formatted=True)


def test_math_reward_no_answer() -> None:
    result = math_reward("I think it's 42", "42")
    assert (result.reward, result.correct, result.extracted, result.formatted) == (
        0.0, False, None, False,
    )  # fmt: skip
    assert result.reason is not None and result.reason.startswith("no final answer")


def test_math_reward_unwraps_boxed_gold() -> None:
    assert math_reward("Answer: 7", r"\boxed{7}").correct


@pytest.mark.parametrize(
    ("answer", "weight", "expected"),
    [
        (r"\boxed{42}", 0.1, 1.0),  # correct: (1-w)*1 + w*1
        (r"\boxed{41}", 0.1, 0.1),  # formatted only: w
        ("42", 0.1, 0.0),  # neither
        (r"\boxed{41}", 0.0, 0.0),
        (r"\boxed{41}", 1.0, 1.0),
        (r"\boxed{42}", 0.5, 1.0),
    ],
)
def test_format_weight(answer: str, weight: float, expected: float) -> None:
    assert math_reward(answer, "42", format_weight=weight).reward == pytest.approx(expected)


@pytest.mark.parametrize("weight", [-0.1, 1.5, float("nan")])
def test_format_weight_out_of_range(weight: float) -> None:
    with pytest.raises(ValueError, match=r"format_weight: must be in \[0, 1\]"):
        math_reward("Answer: 1", "1", format_weight=weight)


@pytest.mark.parametrize("weight", [True, "0.1", None])
def test_format_weight_wrong_type(weight: object) -> None:
    with pytest.raises(TypeError, match=r"format_weight: must be a number"):
        math_reward("Answer: 1", "1", format_weight=weight)  # type: ignore[arg-type]


def test_combine_formula() -> None:
    assert combine(correct=False, formatted=True, format_weight=0.25) == 0.25
    assert combine(correct=True, formatted=True, format_weight=0.25) == 1.0


@pytest.mark.parametrize(
    ("answer", "gold", "name"),
    [(None, "1", "answer"), ("1", 1, "gold"), (b"1", "1", "answer")],
)
def test_math_reward_rejects_non_str(answer: object, gold: object, name: str) -> None:
    with pytest.raises(TypeError, match=rf"{name}: must be a str"):
        math_reward(answer, gold)  # type: ignore[arg-type]


@pytest.fixture
def one_second_checker() -> Iterator[None]:
    configure_math_checker(1.0)
    yield
    configure_math_checker(DEFAULT_TIMEOUT_S)


@pytest.mark.parametrize(
    "answer",
    [
        "",
        "x" * 3_000_000,
        "\\boxed{" * 100_000,
        r"\boxed{" + "9" * 4000 + "}",
        r"\boxed{\frac{" + "{" * 2000 + "}",
        r"\boxed{\frac{1}{" * 300 + "}" * 600,
        "Answer: " + "\u2212" * 4000,
        "```\n\n```",
        "\x00\x01\ud800",  # control characters and a lone surrogate
        r"\boxed{9^{9^{9^{9}}}}",  # a number with more digits than atoms in the universe
    ],
)
def test_math_reward_never_raises_on_str(answer: str, one_second_checker: None) -> None:
    result = math_reward(answer, "42", format_weight=0.1)
    assert 0.0 <= result.reward <= 1.0 and not result.correct


def test_math_reward_gives_up_with_the_reason(one_second_checker: None) -> None:
    result = math_reward(r"\boxed{9^{9^{9^{9}}}}", "1")
    assert (result.correct, result.formatted) == (False, True)
    assert result.reason == "math-verify gave up: no verdict within 1 s"
    assert math_reward(r"\boxed{1}", "1").correct  # the next answer is judged as usual


# --- registry ------------------------------------------------------------------------------


@pytest.fixture
def scratch_reward() -> Iterator[str]:
    name = "test.scratch"
    yield name
    if name in known_rewards():
        unregister_reward(name)


def test_builtin_math_is_registered() -> None:
    assert "math" in known_rewards()
    assert get_reward("math") is math_reward


def test_register_and_get(scratch_reward: str) -> None:
    @register_reward(scratch_reward)
    def exact(answer: str, gold: str, *, format_weight: float = 0.0) -> RewardResult:
        ok = answer == gold
        return RewardResult(reward=float(ok), correct=ok, extracted=answer, formatted=True)

    assert get_reward(scratch_reward) is exact
    assert scratch_reward in known_rewards()
    assert get_reward(scratch_reward)("a", "a").correct


def test_duplicate_registration_needs_replace(scratch_reward: str) -> None:
    def other(answer: str, gold: str, *, format_weight: float = 0.0) -> RewardResult:
        raise AssertionError("never called")

    register_reward(scratch_reward)(math_reward)
    register_reward(scratch_reward)(math_reward)  # the same function again is harmless
    with pytest.raises(ValueError, match=r"already registered .*math_reward.*replace=True"):
        register_reward(scratch_reward)(other)
    assert get_reward(scratch_reward) is math_reward
    register_reward(scratch_reward, replace=True)(other)
    assert get_reward(scratch_reward) is other


def test_unknown_reward_lists_known_names() -> None:
    with pytest.raises(UnknownRewardError) as info:
        get_reward("nope")
    assert isinstance(info.value, KeyError)
    assert "unknown reward 'nope'; known rewards: " in str(info.value)
    assert "math" in str(info.value) and "register_reward" in str(info.value)


@pytest.mark.parametrize("name", ["", "Math", "1abc", "has space", "x" * 65])
def test_invalid_reward_names(name: str) -> None:
    with pytest.raises(ValueError, match=r"reward name: must match"):
        register_reward(name)
