"""The RLJob's adaptive-SD policy as vLLM's per-batch-size draft schedule (pure, no vLLM import).

Called by :class:`~longtail_workers.engine.vllm.vllm_engine.VllmEngine` when it builds vLLM's
``speculative_config``, and by tests. vLLM picks the number of draft tokens for every engine
step from ``num_speculative_tokens_per_batch_size``: inclusive running-batch ranges, each with a
draft depth, where 0 turns speculation off for that step. The mapping:

* running sequences above ``speculative.batchThreshold`` -> 0 (SD off, as in the torch engine);
* at or below it, one range per ``speculative.selector.buckets`` bound (clipped to the
  threshold), each with one fixed depth: ``strategies[fixedIndex]`` for the ``fixed`` selector;
  for the ``bandit`` selector, whose learning vLLM has no hook for, the strategies' depths from
  deepest (smallest batches) to shallowest (largest), TLT's measured preference.

What the torch engine does that this cannot (warm-up latch, per-bucket bandit) is in
docs/vllm.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from longtail_api.policies import SpeculativeSpec


@dataclass(frozen=True)
class VllmSchedule:
    """What vLLM's ``speculative_config`` needs besides the drafter."""

    num_speculative_tokens: int
    """The largest draft depth of any range (vLLM sizes its buffers for it)."""
    per_batch_size: list[tuple[int, int, int]]
    """``(first, last, depth)`` inclusive running-batch ranges, from 1 to ``max_running``."""

    def depth_at(self, running: int) -> int:
        """Draft depth vLLM uses with ``running`` sequences (0: SD off)."""
        for first, last, depth in self.per_batch_size:
            if first <= running <= last:
                return depth
        raise ValueError(f"running={running} outside the schedule {self.per_batch_size}")


def bucket_depths(spec: SpeculativeSpec, n_buckets: int) -> list[int]:
    """One draft depth per bucket, smallest batches first (see the module text)."""
    depths = [s.draft_depth for s in spec.strategies]
    if spec.selector.type == "fixed":
        if not 0 <= spec.selector.fixed_index < len(depths):
            raise ValueError(
                f"speculative.selector.fixedIndex={spec.selector.fixed_index} but there are "
                f"{len(depths)} strategies; use an index below {len(depths)}"
            )
        return [depths[spec.selector.fixed_index]] * n_buckets
    ordered = sorted(set(depths), reverse=True)
    if n_buckets == 1:
        return [ordered[0]]
    return [ordered[round(i * (len(ordered) - 1) / (n_buckets - 1))] for i in range(n_buckets)]


def vllm_schedule(spec: SpeculativeSpec, max_running: int) -> VllmSchedule:
    """The vLLM schedule of ``spec`` for an engine running at most ``max_running`` sequences."""
    if not spec.enabled:
        raise ValueError("speculative.enabled is false: there is no schedule to build")
    if max_running < 1:
        raise ValueError(f"max_running={max_running}; must be >= 1")
    threshold = min(spec.batch_threshold, max_running)
    bounds = sorted({min(b, threshold) for b in spec.selector.buckets if b >= 1}) or [threshold]
    bounds[-1] = threshold  # as in the torch engine, counts past the last bound use its bucket
    depths = bucket_depths(spec, len(bounds))
    ranges: list[tuple[int, int, int]] = []
    first = 1
    for bound, depth in zip(bounds, depths, strict=True):
        ranges.append((first, bound, depth))
        first = bound + 1
    if threshold < max_running:
        ranges.append((threshold + 1, max_running, 0))
    return VllmSchedule(max(d for _, _, d in ranges), ranges)
