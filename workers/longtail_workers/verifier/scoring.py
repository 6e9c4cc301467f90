"""Score a parsed :class:`~longtail_api.protocol.VerifyRequest` with registered rewards.

The HTTP handler (``server.py``) calls :func:`score_request` after it has parsed and validated
the body; code that wants rewards without HTTP (local mode, tests) can call it directly. It
resolves every reward name first (the request's, or an item's own when ``dataset.rewardBySource``
routed it), runs the reward function on every item, and checks what a (possibly third-party)
reward function returned, so that a buggy plugin produces a clear error naming the reward and
the item rather than a malformed response. With ``threads`` > 1 the items are scored by that
many threads at once: the ``math`` reward waits on checker processes (``rewards/checker.py``),
so a batch keeps all of them busy; results stay in request order.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from longtail_api.protocol import VerifyRequest, VerifyResponse, VerifyResult
from longtail_workers.rewards import RewardFn, RewardResult, get_reward


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
    names: tuple[str, ...] = ()
    """Each result's reward name, in order (``reward`` unless the item named its own)."""

    def by_reward(self) -> dict[str, list[RewardResult]]:
        """The results grouped by the reward that scored them (for per-reward metrics)."""
        groups: dict[str, list[RewardResult]] = {}
        for i, result in enumerate(self.results):
            groups.setdefault(self.names[i] if self.names else self.reward, []).append(result)
        return groups

    def to_response(self) -> VerifyResponse:
        mean = sum(r.reward for r in self.results) / len(self.results) if self.results else None
        return VerifyResponse(
            results=tuple(
                VerifyResult(
                    reward=r.reward,
                    correct=r.correct,
                    extracted=r.extracted,
                    formatted=r.formatted,
                    reason=r.reason,
                )
                for r in self.results
            ),
            reward=self.reward,
            reward_mean=mean,
        )


def score_request(
    request: VerifyRequest, *, default_reward: str = "math", threads: int = 1
) -> ScoredBatch:
    """Score every item of ``request``, ``threads`` items at a time.

    Raises :class:`~longtail_workers.rewards.UnknownRewardError` (a ``KeyError``) for an unknown
    reward name, before any item is scored, and :class:`RewardFailedError` when a reward
    function misbehaves.
    """
    name = request.reward if request.reward is not None else default_reward
    names = tuple(item.reward or name for item in request.items)
    functions = {n: get_reward(n) for n in sorted({name, *names})}

    def score(index: int) -> RewardResult:
        return _score_item(names[index], functions[names[index]], index, request)

    indices = range(len(request.items))
    if threads > 1 and len(indices) > 1:
        with ThreadPoolExecutor(min(threads, len(indices)), "verify-item") as pool:
            results = tuple(pool.map(score, indices))
    else:
        results = tuple(score(i) for i in indices)
    return ScoredBatch(reward=name, results=results, names=names)


def _score_item(name: str, reward_fn: RewardFn, index: int, request: VerifyRequest) -> RewardResult:
    item = request.items[index]
    try:
        result = reward_fn(item.answer, item.gold, format_weight=request.format_weight)
    except Exception as exc:  # plugin boundary: re-raised with context
        raise RewardFailedError(name, index, f"{type(exc).__name__}: {exc}") from exc
    _check_result(name, index, result)
    return result


def _check_result(name: str, index: int, result: object) -> None:
    if not isinstance(result, RewardResult):
        raise RewardFailedError(
            name, index, f"returned {type(result).__name__}, expected RewardResult"
        )
    reward = result.reward
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise RewardFailedError(name, index, f"returned reward={reward!r}, expected a finite float")
