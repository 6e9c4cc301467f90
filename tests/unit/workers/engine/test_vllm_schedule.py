"""The RLJob's adaptive-SD spec mapped onto vLLM's per-batch-size draft schedule (pure)."""

from __future__ import annotations

import pytest

from longtail_api.policies import SelectorSpec, SpeculativeSpec, StrategySpec
from longtail_workers.engine.vllm.vllm_schedule import bucket_depths, vllm_schedule


def test_the_default_spec_speculates_deep_at_batch_1_shallow_near_the_threshold_off_above() -> None:
    schedule = vllm_schedule(SpeculativeSpec(), max_running=256)
    # default buckets 1,2,4,8,16,32 and strategies 2,4,6 (bandit): deepest first
    assert schedule.per_batch_size == [
        (1, 1, 6),
        (2, 2, 6),
        (3, 4, 4),
        (5, 8, 4),
        (9, 16, 2),
        (17, 32, 2),
        (33, 256, 0),
    ]
    assert schedule.num_speculative_tokens == 6
    assert [schedule.depth_at(n) for n in (1, 4, 32, 33, 256)] == [6, 4, 2, 0, 0]


def test_fixed_selector_uses_one_depth_and_buckets_are_clipped_to_the_threshold() -> None:
    spec = SpeculativeSpec(
        batch_threshold=3,
        strategies=[StrategySpec(draft_depth=2), StrategySpec(draft_depth=5)],
        selector=SelectorSpec(type="fixed", fixed_index=1, buckets=[1, 2, 4, 8]),
    )
    schedule = vllm_schedule(spec, max_running=64)
    assert schedule.per_batch_size == [(1, 1, 5), (2, 2, 5), (3, 3, 5), (4, 64, 0)]


def test_a_threshold_at_or_above_max_running_never_turns_sd_off() -> None:
    spec = SpeculativeSpec(batch_threshold=512, selector=SelectorSpec(buckets=[64]))
    schedule = vllm_schedule(spec, max_running=128)
    assert schedule.per_batch_size == [(1, 128, 6)]
    with pytest.raises(ValueError, match="outside the schedule"):
        schedule.depth_at(129)


def test_counts_past_the_last_bucket_use_it_as_in_the_torch_engine() -> None:
    spec = SpeculativeSpec(batch_threshold=40, selector=SelectorSpec(buckets=[1, 8]))
    assert vllm_schedule(spec, 256).per_batch_size == [(1, 1, 6), (2, 40, 2), (41, 256, 0)]


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"speculative\.enabled is false"):
        vllm_schedule(SpeculativeSpec(enabled=False), 8)
    bad = SpeculativeSpec(selector=SelectorSpec(type="fixed", fixed_index=7))
    with pytest.raises(ValueError, match=r"speculative.selector.fixedIndex=7"):
        bucket_depths(bad, 2)
