"""The history drafter's host cost for the profile: one row's proposal, timed on a realistic index.

Called by :mod:`longtail_workers.profile.main` (the profile's ``history_propose`` points) and by
the simulator's tests. A history step runs no drafter: what it adds to the verify is the host's
work before the step, :meth:`HistoryIndex.propose
<longtail_workers.engine.native.history.HistoryIndex.propose>` for every running row (hashing the
row's newly committed tokens, walking the hash chain of its newest ``min_match`` tokens and
measuring each candidate's match backwards). That work depends on the index's content, not on the
model, so it is timed here on the real index with synthetic token ids rather than through the
engine, whose random-init model's answers to random prompts share nothing and would be matched only
by chance.

The index is filled as an RL step fills it: one prompt, ``group`` answers from an earlier call
(finished) and ``group`` answers of the current call, all near-copies of one solution (each
token replaced at random with probability ``EDIT_RATE``, and a small bank of phrases repeated
throughout), as a GRPO group's answers to one question share most of their text: lookups then
find matches and walk several candidates, the expensive case. At every (context, depth) each
current answer holds ``context`` tokens; per timed round every answer commits
``COMMITTED_PER_STEP`` more tokens (a speculative step's accepted length) and then every row
proposes; a point is the median over the rounds of a round's seconds divided by its rows.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence

from longtail_api.policies import HistorySpec
from longtail_api.profile import StepPoint
from longtail_workers.engine.native.history import HistoryIndex

EDIT_RATE = 0.1
"""Chance that an answer's token differs from the shared solution's."""
PHRASES = 16
"""Distinct short phrases repeated through every answer (several candidates per lookup)."""
COMMITTED_PER_STEP = 2
"""Tokens every answer commits between two timed rounds (accepted drafts + 1)."""
PROMPT_TOKENS = 128
"""Tokens of the prompt the answers answer."""
VOCAB = 32_000
"""Token ids are drawn below this (a Qwen-sized vocabulary's common range)."""


def _answers(rng: random.Random, solution: Sequence[int], count: int) -> list[list[int]]:
    """``count`` near-copies of ``solution`` (see the module text)."""
    return [
        [t if rng.random() >= EDIT_RATE else rng.randrange(VOCAB) for t in solution]
        for _ in range(count)
    ]


def _solution(rng: random.Random, length: int) -> list[int]:
    """A token sequence of ``length`` in which a few phrases recur, as in worked solutions."""
    bank = [[rng.randrange(VOCAB) for _ in range(rng.randint(3, 8))] for _ in range(PHRASES)]
    out: list[int] = []
    while len(out) < length:
        out += rng.choice(bank) if rng.random() < 0.3 else [rng.randrange(VOCAB)]
    return out[:length]


def propose_seconds(
    context: int, depth: int, group: int, rounds: int, seed: int = 0,
    spec: HistorySpec | None = None,
) -> float:  # fmt: skip
    """Median host seconds of one row's proposal of ``depth`` tokens with ``context`` tokens in
    each of ``group`` answers (one round: every answer commits, then every row proposes)."""
    if context < 1 or depth < 1 or group < 1 or rounds < 1:
        raise ValueError(
            f"context={context}, depth={depth}, group={group}, rounds={rounds}: each must be >= 1"
        )
    rng = random.Random(seed)
    total = context + COMMITTED_PER_STEP * (rounds + 1)
    solution = _solution(rng, total)
    prompt = [rng.randrange(VOCAB) for _ in range(PROMPT_TOKENS)]
    index = HistoryIndex(spec or HistorySpec())
    for tokens in _answers(rng, solution, group):  # an earlier call's answers, finished
        earlier = index.admit(prompt)
        index.extend(earlier, tokens)
        index.finish(earlier)
    index.begin_call()
    planned = _answers(rng, solution, group)
    rows = [index.admit(prompt) for _ in planned]
    for row, tokens in zip(rows, planned, strict=True):
        index.extend(row, tokens[:context])
        index.propose(row, depth)  # the first lookup hashes the whole answer: not a step's cost
    seconds: list[float] = []
    at = context
    for _ in range(rounds):
        for row, tokens in zip(rows, planned, strict=True):
            index.extend(row, tokens[at : at + COMMITTED_PER_STEP])
        at += COMMITTED_PER_STEP
        t0 = time.perf_counter()
        for row in rows:
            index.propose(row, depth)
        seconds.append((time.perf_counter() - t0) / len(rows))
    return statistics.median(seconds)


def propose_points(
    contexts: Sequence[int], depths: Sequence[int], group: int = 16, rounds: int = 20,
    seed: int = 0,
) -> list[StepPoint]:  # fmt: skip
    """The profile's ``history_propose`` points: one row's proposal at every (context, depth),
    ``batch`` 1 (a step pays its rows x this)."""
    return [
        StepPoint(1, c, d, propose_seconds(c, d, group, rounds, seed))
        for c in contexts
        for d in depths
    ]
