"""Engine statistics and their Prometheus metrics agree with what was generated."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest
from tiny_targets import tiny_qwen2

from longtail_api.policies import SelectorSpec, SpeculativeSpec, StrategySpec
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine import stats as stats_mod
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
from longtail_workers.engine.stats import RolloutMetrics, RolloutStats, StepRecord, batch_bucket


def test_stats_and_metrics_of_an_adaptive_run() -> None:
    torch.set_num_threads(1)
    model = tiny_qwen2(seed=6, vocab_size=24, sharpness=10.0)
    spec = SpeculativeSpec(
        enabled=True,
        batch_threshold=3,
        warmup_steps=1,
        strategies=[StrategySpec(draft_depth=2), StrategySpec(draft_depth=4)],
        selector=SelectorSpec(type="bandit", buckets=[1, 2, 4]),
    )
    registry = CollectorRegistry()
    engine = TorchEngine(
        model,
        config=EngineConfig(max_running=4),
        speculative=spec,
        drafter=EagleDrafter(model, target_id="tiny-stats"),
        metrics=RolloutMetrics(registry),
    )
    reqs = [GenerationRequest([1 + i, 2], max_new_tokens=4 + 4 * i, seed=i) for i in range(6)]
    results = engine.generate(reqs)
    st = engine.stats
    generated = sum(len(r.output_token_ids) for r in results)
    assert st.tokens == generated
    assert st.sd_steps > 0 and st.plain_steps > 0 and st.prefill_steps >= 2
    assert st.drafted == sum(r.drafted_tokens for r in results)
    assert st.accepted == sum(r.accepted_tokens for r in results)
    assert 0.0 <= st.acceptance_rate <= 1.0
    assert st.mean_accepted_length >= 1.0 and st.max_batch_size == 4
    snap = st.snapshot()
    assert snap["tokens"] == generated and snap["accepted_length_hist"]

    def value(name: str, labels: dict[str, str] | None = None) -> float:
        v = registry.get_sample_value(name, labels or {})
        assert v is not None, name
        return v

    assert value(stats_mod.METRIC_GENERATED_TOKENS) == generated
    assert value(stats_mod.METRIC_DECODE_STEPS, {"mode": "sd"}) == st.sd_steps
    assert value(stats_mod.METRIC_DECODE_STEPS, {"mode": "plain"}) == st.plain_steps
    assert value(stats_mod.METRIC_DRAFT_TOKENS) == st.drafted
    assert value(stats_mod.METRIC_ACCEPTED_DRAFT_TOKENS) == st.accepted
    assert value(stats_mod.METRIC_ACCEPTED_LENGTH + "_count") == sum(
        st.accepted_length_hist.values()
    )
    assert value(stats_mod.METRIC_ACCEPTANCE_RATE) == pytest.approx(st.acceptance_rate)
    exposition = generate_latest(registry).decode()
    for name in stats_mod.ALL_METRICS:
        assert name.startswith("longtail_rollout_")
        assert name in exposition, name


def test_rollout_stats_accounting() -> None:
    st = RolloutStats()
    st.record(StepRecord(mode="prefill", batch_size=2, emitted_tokens=2, latency_s=0.5))
    st.record(StepRecord(mode="plain", batch_size=2, emitted_tokens=2, latency_s=0.5))
    st.record(
        StepRecord(
            mode="sd",
            batch_size=2,
            emitted_tokens=5,
            latency_s=1.0,
            draft_depth=3,
            drafted_tokens=6,
            accepted_drafts=3,
            accepted_lengths=[1, 4],
        )
    )
    assert (st.steps, st.sd_steps, st.plain_steps, st.prefill_steps) == (3, 1, 1, 1)
    assert st.tokens == 9 and st.tokens_per_second == pytest.approx(4.5)
    assert st.acceptance_rate == pytest.approx(0.5)
    assert st.mean_accepted_length == pytest.approx(2.5)
    st.record(StepRecord(mode="plain", batch_size=3, emitted_tokens=3, latency_s=0.25))
    st.record(StepRecord(mode="plain", batch_size=17, emitted_tokens=17, latency_s=2.0))
    # Buckets: the power of two at or above the running batch; prefill under 0.
    assert st.bucket_seconds == {
        ("prefill", 0): 0.5,
        ("plain", 2): 0.5,
        ("sd", 2): 1.0,
        ("plain", 4): 0.25,
        ("plain", 32): 2.0,
    }
    assert st.bucket_tokens[("sd", 2)] == 5 and st.bucket_tokens[("plain", 32)] == 17
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 33, 64)] == [
        1,
        2,
        4,
        4,
        8,
        8,
        16,
        64,
        64,
    ]
    st.reset()
    assert st.steps == 0 and not st.accepted_length_hist and not st.bucket_seconds


def test_per_sequence_totals_of_the_vllm_engine() -> None:
    stats = RolloutStats()
    # two sequences: one with verify steps of 3, 1 and 2 tokens (+1 plain token), one plain
    stats.add_sequences(
        tokens=12,
        sd_tokens=6,
        drafted=12,
        accepted_lengths=[3, 1, 2],
        seconds=0.5,
        batch_size=2,
        steps=5,
        sd_steps=3,
    )
    assert (stats.steps, stats.sd_steps, stats.plain_steps) == (5, 3, 2)
    assert (stats.tokens, stats.sd_tokens, stats.drafted, stats.accepted) == (12, 6, 12, 3)
    assert stats.mean_accepted_length == 2.0 and stats.acceptance_rate == 0.25
    # vLLM drafts with the learned drafter only: its totals are booked under "learned"
    assert stats.source_sd_tokens == {"learned": 6}
    assert stats.source_accepted_hist == {"learned": {3: 1, 1: 1, 2: 1}}
    assert stats.max_batch_size == 2 and stats.tokens_per_second == 24.0
    registry = CollectorRegistry()
    metrics = RolloutMetrics(registry)
    metrics.observe_sequences(stats, tokens=12, drafted=12, accepted_lengths=[3, 1, 2], seconds=0.5)
    assert registry.get_sample_value(stats_mod.METRIC_GENERATED_TOKENS) == 12
    assert registry.get_sample_value(stats_mod.METRIC_ACCEPTED_DRAFT_TOKENS) == 3
    assert registry.get_sample_value(stats_mod.METRIC_ACCEPTED_LENGTH + "_count") == 3


def test_sd_steps_are_split_by_draft_source() -> None:
    # Four rows of one hybrid step at depth 3: row 1 accepted 3 drafts but its budget kept 2
    # tokens; row 3 accepted 2 drafts and a stop token among them ended it after 2.
    step = StepRecord.speculative(
        latency_s=0.5,
        depth=3,
        keep=[1, 2, 4, 2],
        accepted=[0, 3, 3, 2],
        stopped=[False, False, False, True],
        sources=["learned", "history", "history", "learned"],
        history_propose_s=0.01,
        history_rows=4,
    )
    assert (step.mode, step.batch_size, step.emitted_tokens, step.drafted_tokens) == (
        "sd",
        4,
        9,
        12,
    )
    assert step.accepted_drafts == 8 and step.accepted_lengths == [1, 4, 4, 3]
    assert (step.cut_by_length, step.cut_by_stop) == (1, 1)
    assert step.source_tokens == {"learned": 3, "history": 6}
    assert step.source_accepted_lengths == {"learned": [1, 3], "history": [4, 4]}
    st = RolloutStats()
    st.record(step)
    st.record(
        StepRecord.speculative(
            latency_s=0.1, depth=2, keep=[3], accepted=[2], stopped=[False], sources=["history"]
        )
    )
    assert st.source_sd_tokens == {"learned": 3, "history": 9}
    assert st.source_accepted_hist == {"learned": {1: 1, 3: 1}, "history": {4: 2, 3: 1}}
    assert st.source_mean_accepted_length("history") == pytest.approx(11 / 3)
    assert st.source_mean_accepted_length("learned") == 2.0
    assert st.source_mean_accepted_length("none") == 0.0
    assert (st.history_propose_s, st.history_proposals) == (0.01, 4)
    assert st.sd_tokens == 12 and st.mean_accepted_length == 3.0


def _plain(batch: int, seconds: float) -> StepRecord:
    return StepRecord(mode="plain", batch_size=batch, emitted_tokens=batch, latency_s=seconds)


def _sd(seconds: float, keep: list[int], sources: list[str]) -> StepRecord:
    n = len(keep)
    return StepRecord.speculative(
        latency_s=seconds, depth=3, keep=keep, accepted=[min(k, 3) for k in keep],
        stopped=[False] * n, sources=sources, history_propose_s=0.125, history_rows=n,
    )  # fmt: skip


def test_since_reads_like_the_stats_of_the_later_steps_alone() -> None:
    # Seconds are powers of two so that the differences are exact.
    earlier = [
        StepRecord(mode="prefill", batch_size=9, emitted_tokens=9, latency_s=0.5),
        _plain(9, 0.25),
        _sd(0.5, [2, 4, 1], ["learned", "history", "history"]),
    ]
    later = [_plain(9, 0.25), _plain(3, 0.125), _sd(0.25, [4, 3], ["history", "learned"])]
    stats = RolloutStats()
    for step in earlier:
        stats.record(step)
    before = stats.copy()
    alone = RolloutStats()
    for step in later:
        stats.record(step)
        alone.record(step)
    for st in (stats, alone):  # a vLLM batch too (per-sequence totals)
        st.add_sequences(
            tokens=7, sd_tokens=5, drafted=6, accepted_lengths=[2, 3], seconds=0.5,
            batch_size=2, steps=4, sd_steps=2,
        )  # fmt: skip
    delta = stats.since(before)
    assert delta == dataclasses.replace(alone, max_batch_size=stats.max_batch_size)
    assert delta.mean_accepted_length == alone.mean_accepted_length
    assert before.steps == 3  # the copy did not move on with the stats
    assert stats.since(stats.copy()) == RolloutStats(max_batch_size=9, last=stats.last)


def test_since_subtracts_every_counter_of_the_stats() -> None:
    # A counter added to RolloutStats must be subtracted by since() too (or named here as a
    # value that is not a sum).
    fields = {f.name for f in dataclasses.fields(RolloutStats)}
    by_key = {"accepted_length_hist", "bucket_seconds", "bucket_tokens", "source_sd_tokens"}
    by_key |= {"source_accepted_hist"}
    assert fields == set(stats_mod._SUMS) | by_key | {"max_batch_size", "last"}
