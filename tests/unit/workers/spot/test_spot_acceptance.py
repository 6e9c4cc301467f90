"""Acceptance length per policy and drafter version: the arithmetic, the bound, the metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from longtail_workers.engine.interface import GenerationResult
from longtail_workers.spot.acceptance import AcceptanceTracker


def result(steps: int, accepted: int, drafted: int) -> GenerationResult:
    return GenerationResult(
        request_id=None,
        prompt_token_ids=[1],
        output_token_ids=[2, 3],
        output_logprobs=[0.0, 0.0],
        finish_reason="stop",
        spec_steps=steps,
        drafted_tokens=drafted,
        accepted_tokens=accepted,
    )


def test_mean_accepted_length_per_version_and_metrics() -> None:
    tracker = AcceptanceTracker(keep_versions=2)
    # policy 0 / drafter 5: 4 steps, 6 accepted -> (6 + 4) / 4 = 2.5 tokens per step
    tracker.record([result(3, 5, 12), result(1, 1, 4)], policy_version=0, drafter_version=5)
    # policy 1 / drafter 5: a sequence SD never ran for adds no step
    tracker.record([result(2, 6, 8), result(0, 0, 0)], policy_version=1, drafter_version=5)
    by_policy, by_drafter = tracker.by_policy(), tracker.by_drafter()
    assert by_policy[0].mean_accepted_length == 2.5 and by_policy[0].acceptance_rate == 6 / 16
    assert by_policy[1].mean_accepted_length == 4.0 and by_policy[1].sequences == 2
    assert by_drafter[5].mean_accepted_length == (12 + 6) / 6
    tracker.record([result(0, 0, 0)], policy_version=2, drafter_version=6)
    assert sorted(tracker.by_policy()) == [1, 2]  # keep_versions bounds the label values
    assert tracker.by_policy()[2].mean_accepted_length is None  # SD never ran

    registry = CollectorRegistry()
    registry.register(tracker)
    text = generate_latest(registry).decode()
    assert 'longtail_policy_accepted_length{policy_version="1"} 4.0' in text
    assert 'longtail_drafter_accepted_length{drafter_version="5"} 3.0' in text
    assert 'policy_version="2"' not in text  # no value without a speculative step
    assert tracker.snapshot().by_drafter_version[5].mean_accepted_length == 3.0
