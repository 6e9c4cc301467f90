"""When to speculate and how deep: the adaptive SD policy of the rollout engine (pure Python).

Called by the native torch engine once per decode step (``native/torch_engine.py``) and by the
rollout simulator (``sim/worker.py``); the vLLM engine maps the same spec to vLLM's own
per-batch-size schedule instead (``vllm/vllm_schedule.py``). Two parts:

1. **Switch (latch).** SD is off while more than ``batch_threshold`` sequences run (big batches
   are compute-bound; verifying k extra tokens per row costs real time). Once the running count
   has been at or below the threshold for ``warmup_steps`` consecutive decode steps, SD switches
   on and stays on while the count stays at or below the threshold. If the batch grows past the
   threshold again (e.g. continuous admission refills it), SD switches OFF at once and the
   warm-up count restarts: speculation at large batch is exactly what the threshold forbids. The
   latch is reset at the start of every rollout (:meth:`SpecDecodePolicy.reset`).
2. **Strategy selection.** The running count falls into a bucket (``selector.buckets`` are upper
   bounds; counts above the last bound use the last bucket). Each bucket independently picks a
   strategy (what drafts, ``learned``/``history``/``hybrid``, and the draft depth k): ``fixed``
   always uses ``strategies[fixed_index]``; ``bandit`` is epsilon-greedy over a sliding window
   of rewards, trying every strategy once first. The reward of a step is accepted tokens per
   second: tokens emitted by all rows (accepted drafts plus the correction/bonus token, i.e.
   mean accepted length x batch size) divided by the step latency (the history drafter's host
   work included).

Without a learned drafter (an engine made with none) the strategies that need one (``learned``
and ``hybrid``) are skipped: the bandit chooses among the ``history`` ones, and a ``fixed``
selector on a skipped strategy does not speculate. An engine refuses a spec under which nothing
could speculate without a drafter (:meth:`SpecDecodePolicy.eligible`).
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from dataclasses import dataclass
from typing import Literal, overload

from longtail_api.policies import DrafterKind, SpeculativeSpec


@dataclass(frozen=True)
class StrategyChoice:
    """The strategy picked for one speculative step."""

    bucket: int
    strategy: int
    draft_depth: int
    explored: bool
    drafter: DrafterKind = "learned"
    """What proposes this step's drafts (the strategy's ``drafter``)."""


def validate_speculative_spec(spec: SpeculativeSpec) -> None:
    """Raise ``ValueError`` naming the field when the native engine cannot run ``spec``."""
    buckets = spec.selector.buckets
    if not buckets or any(b < 1 for b in buckets):
        raise ValueError(f"speculative.selector.buckets={buckets}: need >= 1 positive bounds")
    if any(b2 <= b1 for b1, b2 in itertools.pairwise(buckets)):
        raise ValueError(
            f"speculative.selector.buckets={buckets}: bounds must be strictly increasing"
        )
    if not spec.strategies:
        raise ValueError("speculative.strategies is empty; give at least one draftDepth")
    if spec.selector.type == "fixed" and not 0 <= spec.selector.fixed_index < len(spec.strategies):
        raise ValueError(
            f"speculative.selector.fixedIndex={spec.selector.fixed_index} is out of range for "
            f"{len(spec.strategies)} strategies"
        )
    history = spec.history
    if history.max_match < history.min_match:
        raise ValueError(
            f"speculative.history.maxMatch={history.max_match} is below minMatch="
            f"{history.min_match}; set maxMatch >= minMatch"
        )
    for i, s in enumerate(spec.strategies):
        if s.drafter not in ("learned", "history", "hybrid"):
            raise ValueError(
                f"speculative.strategies[{i}].drafter={s.drafter!r}; use learned, history or hybrid"
            )
        if s.draft_depth < 1:
            raise ValueError(f"speculative.strategies[{i}].draftDepth={s.draft_depth}; need >= 1")
        if s.verify_tokens is not None and s.verify_tokens != s.draft_depth:
            raise ValueError(
                f"speculative.strategies[{i}].verifyTokens={s.verify_tokens} differs from "
                f"draftDepth={s.draft_depth}: that is tree drafting, which this engine does not "
                "implement (chain drafting only); leave verifyTokens empty"
            )


class SpecDecodePolicy:
    """SD on/off latch plus per-bucket strategy selection (see module text)."""

    def __init__(self, spec: SpeculativeSpec, seed: int = 0) -> None:
        validate_speculative_spec(spec)
        self.spec = spec
        self._rng = random.Random(seed)
        n_buckets, n_strategies = len(spec.selector.buckets), len(spec.strategies)
        window = spec.selector.window
        self._rewards: list[list[deque[float]]] = [
            [deque(maxlen=window) for _ in range(n_strategies)] for _ in range(n_buckets)
        ]
        self.active = False
        self._streak = 0

    def reset(self) -> None:
        """Start of a rollout: SD off, warm-up count zero (learned rewards are kept)."""
        self.active = False
        self._streak = 0

    def observe(self, running: int) -> bool:
        """Account one decode step with ``running`` sequences; True when it should use SD."""
        if not self.spec.enabled or running > self.spec.batch_threshold:
            self.active = False
            self._streak = 0
            return False
        if not self.active:
            self._streak += 1
            self.active = self._streak > self.spec.warmup_steps
        return self.active

    def bucket_of(self, running: int) -> int:
        for i, bound in enumerate(self.spec.selector.buckets):
            if running <= bound:
                return i
        return len(self.spec.selector.buckets) - 1

    def eligible(self, learned: bool) -> list[int]:
        """Indices of the strategies the selector may pick; ``learned``: a learned drafter is
        there (without one, only ``history`` strategies can run)."""
        sel = self.spec.selector
        pool = [sel.fixed_index] if sel.type == "fixed" else range(len(self.spec.strategies))
        return [i for i in pool if learned or self.spec.strategies[i].drafter == "history"]

    @overload
    def choose(self, running: int, learned: Literal[True] = True) -> StrategyChoice: ...

    @overload
    def choose(self, running: int, learned: bool) -> StrategyChoice | None: ...

    def choose(self, running: int, learned: bool = True) -> StrategyChoice | None:
        """Pick the strategy for a step with ``running`` sequences (``learned``: a learned
        drafter is there); ``None`` when no strategy can run (never with ``learned``)."""
        arms = self.eligible(learned)
        if not arms:
            assert not learned, "a spec without strategies passed validation"
            return None
        bucket = self.bucket_of(running)
        if self.spec.selector.type == "fixed":
            idx, explored = arms[0], False
        else:
            idx, explored = self._bandit(bucket, arms)
        strategy = self.spec.strategies[idx]
        return StrategyChoice(
            bucket=bucket,
            strategy=idx,
            draft_depth=strategy.draft_depth,
            explored=explored,
            drafter=strategy.drafter,
        )

    def _bandit(self, bucket: int, arms: list[int]) -> tuple[int, bool]:
        rewards = self._rewards[bucket]
        for i in arms:
            if not rewards[i]:  # every strategy gets tried once before exploiting
                return i, True
        if self._rng.random() < self.spec.selector.epsilon:
            return arms[self._rng.randrange(len(arms))], True
        means = {i: sum(rewards[i]) / len(rewards[i]) for i in arms}
        return max(arms, key=lambda i: (means[i], -i)), False

    def record(self, choice: StrategyChoice, emitted_tokens: float, latency_s: float) -> float:
        """Feed back a step's outcome; returns the reward (accepted tokens per second)."""
        reward = float(emitted_tokens) / max(float(latency_s), 1e-9)
        self._rewards[choice.bucket][choice.strategy].append(reward)
        return reward

    def mean_rewards(self, bucket: int) -> list[float | None]:
        """Current windowed mean reward per strategy of ``bucket`` (None if never tried)."""
        return [sum(r) / len(r) if r else None for r in self._rewards[bucket]]
