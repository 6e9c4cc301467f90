"""Score a parsed :class:`~longtail_api.protocol.VerifyRequest` with a registered reward.

The HTTP handler (``server.py``) calls :func:`score_request` after it has parsed and validated
the body; code that wants rewards without HTTP (local mode, tests) can call it directly. It
resolves the reward name, runs the reward function on every item in request order, and checks
what a (possibly third-party) reward function returned, so that a buggy plugin produces a clear
error naming the reward and the item rather than a malformed response.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from longtail_api.protocol import VerifyRequest, VerifyResponse, VerifyResult
from longtail_workers.rewards import RewardResult, get_reward


class RewardFailedError(RuntimeError):
    """A reward function raised or returned something invalid for one item (a server bug)."""

    def __init__(self, reward: str, index: int, problem: str) -> None:
        super().__init__(
            f"reward {reward!r} failed on items[{index}]: {problem} "
            f"(this is a bug in the reward function, not in the request)"
        )
        self.reward = reward
        self.index = index


@dataclass(frozen=True)
class ScoredBatch:
    """A scored request: the wire response plus the raw results (for metrics)."""

    reward: str
    results: tuple[RewardResult, ...]

    def to_response(self) -> VerifyResponse:
        mean = sum(r.reward for r in self.results) / len(self.results) if self.results else None
        return VerifyResponse(
            results=tuple(
                VerifyResult(
                    reward=r.reward, correct=r.correct, extracted=r.extracted, formatted=r.formatted
                )
                for r in self.results
            ),
            reward=self.reward,
            reward_mean=mean,
        )


def score_request(request: VerifyRequest, *, default_reward: str = "math") -> ScoredBatch:
    """Score every item of ``request``.

    Raises :class:`~longtail_workers.rewards.UnknownRewardError` (a ``KeyError``) for an unknown
    reward name, and :class:`RewardFailedError` when the reward function misbehaves.
    """
    name = request.reward if request.reward is not None else default_reward
    reward_fn = get_reward(name)
    results: list[RewardResult] = []
    for index, item in enumerate(request.items):
        try:
            result = reward_fn(item.answer, item.gold, format_weight=request.format_weight)
        except Exception as exc:  # plugin boundary: re-raised with context
            raise RewardFailedError(name, index, f"{type(exc).__name__}: {exc}") from exc
        _check_result(name, index, result)
        results.append(result)
    return ScoredBatch(reward=name, results=tuple(results))


def _check_result(name: str, index: int, result: object) -> None:
    if not isinstance(result, RewardResult):
        raise RewardFailedError(
            name, index, f"returned {type(result).__name__}, expected RewardResult"
        )
    reward = result.reward
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise RewardFailedError(name, index, f"returned reward={reward!r}, expected a finite float")
