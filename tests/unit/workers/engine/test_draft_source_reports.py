"""Speculation reported by draft source (``learned``, ``history``) from the engine's counters to
every place a person reads it: the rollout worker's generate reply and its /metrics, the
trainer's step row, status and metrics, and ``longtail run``'s live line, summary and report.

The engine's per-source counters are driven directly (``RolloutStats.record`` with step records
carrying ``source_*`` figures), so these tests need no history drafter, only a tiny policy for
the worker around it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from prometheus_client import generate_latest

from longtail_api.policies import DrafterTrainingSpec
from longtail_api.steprow import StepRow
from longtail_api.wirecodec import from_wire, to_wire
from longtail_api.workerapi import TrainerStatus
from longtail_workers.engine.interface import GenerationRequest, GenerationResult
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.engine.stats import StepRecord
from longtail_workers.local.coordinator import HarvestBooks
from longtail_workers.local.progress import Progress, live_line
from longtail_workers.local.report import write_report
from longtail_workers.local.run import print_summary
from longtail_workers.rollout.control import RolloutWorker
from longtail_workers.trainer.driver import DriverState, StepDriver
from longtail_workers.trainer.service import TrainerApp, TrainerMetrics
from longtail_workers.trainer.syncbook import SyncBook
from longtail_workers.wire.rollout import (
    EngineDelta,
    GenerateCall,
    GenerateReply,
    Sample,
    SourceDelta,
    source_figures,
)


def sd_step(sources: dict[str, tuple[list[int], list[int]]]) -> StepRecord:
    """An SD step record: per source, (tokens kept per row, accepted length per row)."""
    lengths = [n for _, acc in sources.values() for n in acc]
    return StepRecord(
        mode="sd", batch_size=len(lengths),
        emitted_tokens=sum(sum(keep) for keep, _ in sources.values()), latency_s=0.01,
        draft_depth=4, drafted_tokens=4 * len(lengths), accepted_drafts=sum(lengths) - len(lengths),
        accepted_lengths=lengths,
        source_tokens={s: sum(keep) for s, (keep, _) in sources.items()},
        source_accepted_lengths={s: list(acc) for s, (_, acc) in sources.items()},
    )  # fmt: skip


class StubbedWorker(RolloutWorker):
    """A generating worker whose engine 'generates' by recording the given steps."""

    steps: Sequence[StepRecord] = ()

    def generate(
        self, requests: Sequence[GenerationRequest], *, step: int | None = None
    ) -> list[GenerationResult]:
        for record in self.steps:
            self.engine.stats.record(record)
        return []


@pytest.fixture
def worker(model: torch.nn.Module) -> StubbedWorker:
    training = DrafterTrainingSpec(enabled=False)
    return StubbedWorker(TorchEngine(model), target_id="tiny", training=training, weights=None)


def call() -> GenerateCall:
    return GenerateCall(0, 0, [GenerationRequest([1, 2], 4, request_id="r0")])


def test_the_generate_reply_splits_this_calls_speculation_by_draft_source(
    worker: StubbedWorker,
) -> None:
    worker.engine.stats.record(sd_step({"learned": ([4], [4])}))  # an earlier call's step
    worker.steps = [
        StepRecord(mode="plain", batch_size=3, emitted_tokens=3, latency_s=0.01),
        sd_step({"history": ([3, 2], [3, 4]), "learned": ([1], [1])}),
        sd_step({"history": ([5], [5])}),
    ]
    reply = worker.generate_call(call())
    assert reply.engine.by_source == {
        "history": SourceDelta(sd_tokens=10, accepted_length_sum=12, accepted_rows=3),
        "learned": SourceDelta(sd_tokens=1, accepted_length_sum=1, accepted_rows=1),
    }
    assert reply.engine.sd_tokens == 11 and reply.engine.tokens == 14
    wire = json.loads(json.dumps(to_wire(reply)))
    assert wire["engine"]["bySource"]["history"] == {
        "sdTokens": 10, "acceptedLengthSum": 12, "acceptedRows": 3,
    }  # fmt: skip
    assert from_wire(GenerateReply, wire, "reply") == reply
    worker.steps = [StepRecord(mode="plain", batch_size=1, emitted_tokens=1, latency_s=0.01)]
    assert worker.generate_call(call()).engine.by_source == {}  # nothing speculated


def test_a_reply_from_a_worker_without_the_split_still_reads() -> None:
    wire = to_wire(GenerateReply("w", 1, 0, [], EngineDelta(tokens=8, sd_tokens=4)))
    del wire["engine"]["bySource"]
    assert from_wire(GenerateReply, wire, "reply").engine.by_source == {}
    bad = to_wire(EngineDelta(by_source={"history": SourceDelta(sd_tokens=1)}))
    bad["bySource"]["history"]["sdTokens"] = -1
    with pytest.raises(ValueError, match=r"reply\.engine\.bySource\.history\.sdTokens"):
        from_wire(EngineDelta, bad, "reply.engine")


def test_source_figures_share_all_tokens_and_average_rows() -> None:
    new = EngineDelta(tokens=60, sd_tokens=40, by_source={
        "history": SourceDelta(sd_tokens=30, accepted_length_sum=30, accepted_rows=10),
        "learned": SourceDelta(sd_tokens=10, accepted_length_sum=10, accepted_rows=5),
    })  # fmt: skip
    old = EngineDelta(tokens=40, sd_tokens=20)  # a worker older than the split
    other = EngineDelta(tokens=0, by_source={"history": SourceDelta(10, 14, 2)})
    fractions, lengths = source_figures([new, old, other])
    assert fractions == {"history": 0.4, "learned": 0.1}
    assert lengths == {"history": pytest.approx(44 / 12), "learned": 2.0}
    assert source_figures([old]) == ({}, {})


def test_the_step_row_carries_the_split() -> None:
    sample = Sample("r0", [1, 2], [3, 4, 5], [-0.5, -0.5, -0.5])
    reply = GenerateReply("rollout-0", 1, 0, [sample, sample], EngineDelta(
        tokens=6, sd_tokens=4, mean_accepted_length=2.5, accepted_rows=2,
        by_source={"history": SourceDelta(3, 3, 1), "learned": SourceDelta(1, 2, 1)},
    ))  # fmt: skip
    driver = SimpleNamespace(spec=SimpleNamespace(algorithm=SimpleNamespace(group_size=2)),
                             state=DriverState(), harvest=None)  # fmt: skip
    out = SimpleNamespace(samples=[sample, sample], replies=[reply], seconds=2.0,
                          first_done_s=1.0, redispatched=0, failed_workers={},
                          answered_by=["rollout-0"] * 2, workers_present=1)  # fmt: skip
    row = StepDriver._row(driver, 1, out, [1.0, 0.0], [True, False], {}, 0.5, 0.25)  # type: ignore[arg-type]
    assert row.sd_fraction_by_source == {"history": 0.5, "learned": pytest.approx(1 / 6)}
    assert row.accepted_length_by_source == {"history": 3.0, "learned": 2.0}
    assert StepRow.from_dict(json.loads(json.dumps(row.to_dict()))) == row


def row(step: int, **extra: Any) -> StepRow:
    return StepRow(step=step, policy_version=step, drafter_version=-1, reward_mean=0.5,
                   accuracy=0.5, rollout_s=2.0, tail_s=1.0, train_s=1.0, step_s=3.0,
                   sd_fraction=0.5, mean_accepted_length=2.5, **extra)  # fmt: skip


SPLIT = {
    "sd_fraction_by_source": {"learned": 0.25, "history": 0.25},
    "accepted_length_by_source": {"learned": 2.0, "history": 3.5},
}


def test_the_trainer_status_and_metrics_show_the_last_steps_split() -> None:
    app = TrainerApp("127.0.0.1", 0)
    app.driver = SimpleNamespace(state=DriverState(step=1, last_row=row(1, **SPLIT)),
                                 syncs=SyncBook())  # type: ignore[assignment]  # fmt: skip
    status = app.status()
    assert status.sd_fraction_by_source == {"learned": 0.25, "history": 0.25}
    assert status.accepted_length_by_source == {"learned": 2.0, "history": 3.5}
    assert to_wire(status)["acceptedLengthBySource"] == {"learned": 2.0, "history": 3.5}
    metrics = TrainerMetrics()
    metrics.observe(row(1, **SPLIT))
    value = metrics.registry.get_sample_value
    assert value("longtail_trainer_accepted_length", {"source": "history"}) == 3.5
    assert value("longtail_trainer_sd_fraction", {"source": "learned"}) == 0.25
    metrics.observe(row(2))  # a step without history speculation does not keep the old figure
    assert value("longtail_trainer_accepted_length", {"source": "history"}) == 0.0
    assert value("longtail_trainer_sd_fraction", {"source": "history"}) == 0.0


def test_the_rollout_worker_exports_tokens_and_accepted_lengths_by_source(
    worker: StubbedWorker,
) -> None:
    stats = worker.engine.stats
    stats.record(sd_step({"history": ([3, 2], [3, 4]), "learned": ([1], [1])}))
    stats.record(sd_step({"history": ([5], [5])}))
    value = worker.metrics_registry.get_sample_value
    assert value("longtail_worker_sd_tokens_total", {"source": "history"}) == 10
    assert value("longtail_worker_sd_tokens_total", {"source": "learned"}) == 1
    assert value("longtail_worker_accepted_length_count", {"source": "history"}) == 3
    assert value("longtail_worker_accepted_length_sum", {"source": "history"}) == 12
    assert value("longtail_worker_accepted_length_bucket", {"source": "history", "le": "3.0"}) == 1
    assert value("longtail_worker_accepted_length_bucket", {"source": "history", "le": "4.0"}) == 2
    assert value("longtail_worker_accepted_length_bucket", {"source": "history", "le": "+Inf"}) == 3
    assert "longtail_worker_accepted_length" in generate_latest(worker.metrics_registry).decode()


def status(**split: dict[str, float]) -> TrainerStatus:
    return TrainerStatus(2, 5, "running", 2, 1, sd_fraction=0.5, accepted_length=2.75,
                         figures_step=2, **split)  # type: ignore[arg-type]  # fmt: skip


def test_the_live_line_shows_each_draft_sources_share_and_length() -> None:
    line = live_line(status(**SPLIT), HarvestBooks())
    assert "sd 50%  acc.len 2.75  learned 25% len 2.00  history 25% len 3.50  drafter v1" in line
    learned_only = status(sd_fraction_by_source={"learned": 0.5},
                          accepted_length_by_source={"learned": 2.75})  # fmt: skip
    assert "learned 50%" not in live_line(learned_only, HarvestBooks())  # the totals already
    assert " len " not in live_line(status(), HarvestBooks())  # an older trainer: as before
    out = io.StringIO()
    Progress(out).update(status(**SPLIT), HarvestBooks())
    assert "history 25% len 3.50" in out.getvalue()


def test_the_report_and_summary_show_the_split(tmp_path: Path) -> None:
    rows = [row(1), row(2, **SPLIT),
            row(3, sd_fraction_by_source={"history": 0.5},
                accepted_length_by_source={"history": 4.5})]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rows))
    summary = write_report(tmp_path, None, {"job": "t"})
    assert summary["sd_fraction_mean_history"] == pytest.approx(0.375)
    assert summary["sd_fraction_mean_learned"] == pytest.approx(0.125)
    assert summary["accepted_length_mean_history"] == pytest.approx(4.0)
    assert summary["accepted_length_mean_learned"] == pytest.approx(2.0)
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    third = dict(zip(header, lines[3].split(","), strict=True))
    first = dict(zip(header, lines[1].split(","), strict=True))
    assert third["accepted_length_history"] == "4.5" and third["sd_fraction_history"] == "0.5"
    assert third["sd_fraction_learned"] == "" and first["accepted_length_history"] == ""
    assert "sd_fraction_mean_history | 0.375" in (tmp_path / "report" / "summary.md").read_text()
    out = io.StringIO()
    info = {"outcome": "complete", "wall_s": 10.0, "start_eval_accuracy": None}
    summary = {**summary, **info, "eval_gain_points": None}
    print_summary(Progress(out), summary, tmp_path, 0)
    assert ("speculation by drafter: learned 0.125 of the tokens, accepted length 2.00; "
            "history 0.375 of the tokens, accepted length 4.00") in out.getvalue()  # fmt: skip
    old = tmp_path / "old"  # a run whose rows have no split: no per-source keys at all
    old.mkdir()
    (old / "metrics.jsonl").write_text(json.dumps(row(1).to_dict()) + "\n")
    summary = write_report(old, None, {"job": "t"})
    assert not any(k.startswith(("sd_fraction_mean_", "accepted_length_mean_")) for k in summary)
