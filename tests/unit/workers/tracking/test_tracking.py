"""Experiment tracking through the trainer-side component (``longtail_workers.tracking``).

A run's realistic step rows go through :class:`~longtail_workers.tracking.sink.Tracker` as the
trainer hands them over, and come back through each tracker's own reader: TensorBoard's event
accumulator, W&B's run file (offline mode). The sink's behaviour with a tracker that is down,
refusing or full is checked with a backend that fails on command. The MLflow server tests are
in ``test_tracking_mlflow.py``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from tracking_helpers import step_rows, tracked_spec, wandb_history, wandb_records

from longtail_workers.drafter.checkpoint import save_drafter
from longtail_workers.drafter.model import EagleDrafter, layout_options
from longtail_workers.tracking import sink, trainer_side
from longtail_workers.tracking.backends import RUN_IDS_FILE, TrackerRefused
from longtail_workers.tracking.sink import BackendSink, Tracker, open_tracker
from longtail_workers.tracking.trainer_side import TrackingMetrics
from longtail_workers.trainer import drafter_artifact


def scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def test_tensorboard_reader_reads_back_every_step(tmp_path: Path) -> None:
    spec = tracked_spec({"tensorboard": {}})
    rows = step_rows(12)
    tracker = open_tracker(spec, tmp_path, tmp_path / "checkpoints")
    tracker.params(spec)
    for row in rows:
        tracker.step(row)
    assert tracker.close("complete", 60)
    got = scalars(tmp_path / "tensorboard")
    assert got["reward/mean"] == pytest.approx({r.step: r.reward_mean for r in rows})
    assert got["reward/std"] == pytest.approx({r.step: r.reward_std for r in rows})
    assert got["train/grad_norm"] == pytest.approx({r.step: r.train["grad_norm"] for r in rows})
    assert got["time/update_s"] == pytest.approx({r.step: r.train_s for r in rows})
    assert got["eval/accuracy"] == pytest.approx({5: rows[4].eval_accuracy,
                                                 10: rows[9].eval_accuracy})  # fmt: skip
    p99 = {r.step: float(sorted(r.response_lengths)[126]) for r in rows}
    assert got["response_length/p99"] == p99
    assert got["response_length/max"] == {r.step: r.max_length for r in rows}
    assert set(got["speculative/accepted_length"]) == set(range(1, 13))
    assert got["drafter/version"][12] == 9
    assert got["policy/entropy"] == pytest.approx({r.step: r.train["entropy"] for r in rows})
    # No figure the rows do not have (they record no sampled eval accuracy).
    assert "eval/sampled_accuracy" not in got


def test_a_resumed_tensorboard_run_replaces_the_steps_it_runs_again(tmp_path: Path) -> None:
    spec = tracked_spec({"tensorboard": {"logDir": str(tmp_path / "tb")}})
    first = open_tracker(spec, tmp_path, tmp_path / "ck")
    for row in step_rows(6, seed=1):  # checkpointed at 4, stopped after 6
        first.step(row)
    assert first.close("stopped", 60)
    again = open_tracker(spec, tmp_path, tmp_path / "ck", purge_step=5)
    rerun = step_rows(8, seed=2)[4:]
    for row in rerun:
        again.step(row)
    assert again.close("complete", 60)
    got = scalars(tmp_path / "tb")["reward/mean"]
    assert sorted(got) == list(range(1, 9))
    assert got[5] == pytest.approx(rerun[0].reward_mean)


def test_wandb_offline_run_is_read_back_from_its_run_file(tmp_path: Path) -> None:
    spec = tracked_spec({"wandb": {"project": "longtail-test", "mode": "offline"}})
    rows = step_rows(6)
    tracker = open_tracker(spec, tmp_path, tmp_path / "ck")
    tracker.params(spec)
    for row in rows:
        tracker.step(row)
    report = tmp_path / "report"
    report.mkdir()
    (report / "summary.md").write_text("# run\n")
    tracker.artifact(report, "run")
    assert tracker.close("complete", 120)
    run_id = json.loads((tmp_path / "ck" / RUN_IDS_FILE).read_text())["wandb"]
    [run_dir] = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}")
    run_file = run_dir / f"run-{run_id}.wandb"
    history = wandb_history(run_file)
    assert sorted(history) == [r.step for r in rows]
    for row in rows:
        assert history[row.step]["reward/mean"] == pytest.approx(row.reward_mean)
        assert history[row.step]["time/step_s"] == pytest.approx(row.step_s)
    configs = [r.config for r in wandb_records(run_file) if r.WhichOneof("record_type") == "config"]
    keys = {item.key or "/".join(item.nested_key): item.value_json
            for c in configs for item in c.update}  # fmt: skip
    assert json.loads(keys["algorithm.groupSize"]) == "8"
    assert (run_dir / "files" / "run" / "summary.md").read_text() == "# run\n"
    # A resumed trainer continues the same W&B run (same id), in a run directory of its own
    # (W&B names them by the second: the pause keeps the two apart).
    time.sleep(1.1)
    again = open_tracker(spec, tmp_path, tmp_path / "ck")
    again.step(step_rows(7)[6])
    assert again.close("complete", 120)
    dirs = sorted((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(dirs) == 2
    assert sorted(wandb_history(dirs[1] / f"run-{run_id}.wandb")) == [7]


class FlakyBackend:
    """A tracker that is down (raises) or hangs on command, and records what it received."""

    name = "flaky"

    def __init__(self) -> None:
        self.down = threading.Event()
        self.up = threading.Event()  # cleared: a call blocks until it is set
        self.up.set()
        self.refuse_steps: set[int] = set()
        self.steps: list[int] = []
        self.artifacts: list[tuple[Path, str]] = []

    def _call(self) -> None:
        assert self.up.wait(60), "test never released the hanging tracker"
        if self.down.is_set():
            raise ConnectionError("tracker down")

    def open(self) -> None:
        self._call()

    def log_params(self, params: dict[str, str]) -> None:
        self._call()

    def log_metrics(self, steps: list[tuple[int, dict[str, float]]]) -> None:
        self._call()
        refused = [step for step, _ in steps if step in self.refuse_steps]
        if refused:
            raise TrackerRefused(f"step {refused[0]} refused")
        self.steps.extend(step for step, _ in steps)

    def log_artifact(self, path: Path, name: str) -> None:
        self._call()
        self.artifacts.append((path, name))

    def finish(self, outcome: str) -> None:
        self._call()


def counter(registry: CollectorRegistry, name: str) -> float:
    return registry.get_sample_value(name, {"backend": "flaky"}) or 0.0


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sink, "RETRY_FIRST_S", 0.01)
    monkeypatch.setattr(sink, "RETRY_MAX_S", 0.05)


def test_a_hanging_or_down_tracker_never_blocks_and_gets_its_buffer_when_back(
    fast_retries: Any,
) -> None:
    registry = CollectorRegistry()
    backend = FlakyBackend()
    tracker = Tracker([BackendSink(backend, 100, TrackingMetrics(registry))])
    rows = step_rows(30)
    backend.up.clear()  # hangs: every call blocks
    for row in rows[:10]:
        tracker.step(row)  # returns although the tracker answers nothing
    backend.down.set()
    backend.up.set()  # answers now, with errors
    for row in rows[10:20]:
        tracker.step(row)
    failing = sink_wait(lambda: tracker.failing().get("flaky"))
    assert "ConnectionError: tracker down" in failing and "record(s) buffered" in failing
    assert counter(registry, "longtail_trainer_tracking_failures_total") >= 1
    assert registry.get_sample_value("longtail_trainer_tracking_buffered",
                                     {"backend": "flaky"}) >= 1  # fmt: skip
    backend.down.clear()  # back
    for row in rows[20:]:
        tracker.step(row)
    assert tracker.close("complete", 30)
    assert backend.steps == list(range(1, 31))  # nothing lost, in order
    assert tracker.failing() == {}


def test_a_full_buffer_drops_its_oldest_records_and_counts_them(fast_retries: Any) -> None:
    registry = CollectorRegistry()
    backend = FlakyBackend()
    backend.down.set()
    tracker = Tracker([BackendSink(backend, 10, TrackingMetrics(registry))])
    for row in step_rows(15):
        tracker.step(row)
    backend.down.clear()
    sink_wait(lambda: tracker.sinks[0].pending() == 0)
    assert tracker.close("complete", 30)
    assert backend.steps == list(range(6, 16))
    assert counter(registry, "longtail_trainer_tracking_dropped_total") == 5


def test_a_refused_record_is_dropped_and_the_rest_go_on(fast_retries: Any) -> None:
    registry = CollectorRegistry()
    backend = FlakyBackend()
    backend.refuse_steps = {3}
    tracker = Tracker([BackendSink(backend, 100, TrackingMetrics(registry))])
    for row in step_rows(5):
        tracker.step(row)
    assert tracker.close("complete", 30)
    assert backend.steps == [1, 2, 4, 5]
    assert counter(registry, "longtail_trainer_tracking_dropped_total") == 1


def test_close_gives_up_on_a_tracker_that_stays_down(fast_retries: Any) -> None:
    backend = FlakyBackend()
    backend.down.set()
    tracker = Tracker([BackendSink(backend, 100, sink.TrackingObserver())])
    tracker.step(step_rows(1)[0])
    assert not tracker.close("complete", 0.5)


@pytest.mark.parametrize("case", ["eagle1", "longtail", "slow"])
def test_the_end_logs_the_drafter_exported_where_it_exports_exactly(
    case: str, target: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    target.save_pretrained(tmp_path / "model")  # the job's model directory
    drafters = tmp_path / "drafters"  # drafter/registry.py's layout, version 2 published
    layout = layout_options("longtail" if case == "longtail" else "eagle1")
    drafter = EagleDrafter(target, target_id="tiny", **layout)
    version = save_drafter(drafter, drafters / "versions" / "000002", version=2)
    (drafters / "LATEST").write_text("2\n")
    release = threading.Event()
    if case == "slow":  # an export that does not end: the wait is bounded
        monkeypatch.setattr(drafter_artifact, "EXPORT_TIMEOUT_S", 0.2)
        monkeypatch.setattr(drafter_artifact, "export_drafter", lambda *a, **k: release.wait(30))
    backend = FlakyBackend()
    tracker = Tracker([BackendSink(backend, 100, sink.TrackingObserver())])
    out = tmp_path / "run" / drafter_artifact.EXPORT_DIR
    with caplog.at_level(logging.INFO, logger=drafter_artifact.__name__):  # as the service does
        chosen = drafter_artifact.drafter_artifact(drafters, str(tmp_path / "model"), out)
        trainer_side.finish(tracker, "complete", chosen)
    [(path, name)] = backend.artifacts
    assert name == "drafter"
    if case == "eagle1":  # exact: the EAGLE-1 draft model SGLang loads
        assert path == out
        info = json.loads((out / "longtail_export.json").read_text())
        assert info["exact"] and info["engine"] == "sglang"
        assert info["source"]["drafter_version"] == 2
        config = json.loads((out / "config.json").read_text())
        assert config["architectures"] == ["Qwen2ForCausalLMEagle"]
        assert (out / "model.safetensors").is_file()
        assert "exported for sglang" in caplog.text
        return
    release.set()
    assert path == version and not out.exists()  # the version's own directory
    assert "not exported" in caplog.text
    why = "input RMSNorm" if case == "longtail" else "the export took over 0.2 s"
    assert why in caplog.text


def sink_wait(value: Any, timeout_s: float = 30.0) -> Any:
    done = threading.Event()
    for _ in range(int(timeout_s / 0.01)):
        got = value()
        if got:
            return got
        done.wait(0.01)
    pytest.fail(f"nothing after {timeout_s}s")
