"""``longtail run``'s progress line and report (CSV, PNG plots, Markdown/HTML summary)."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest

from longtail_api.wirecodec import from_wire, to_wire
from longtail_api.workerapi import StepSeconds, TrainerStatus
from longtail_workers.local.coordinator import HarvestBooks
from longtail_workers.local.progress import Progress, bar, live_line
from longtail_workers.local.report import write_report


def _row(step: int, **extra: float) -> dict[str, object]:
    return {
        "step": step, "policy_version": step, "drafter_version": step - 1,
        "reward_mean": 0.1 * step, "accuracy": 0.1 * step, "answers": 8, "mean_length": 30.0,
        "max_length": 64,
        "rollout_s": 4.0, "tail_s": 1.5, "train_s": 2.0, "sync_s": 0.1, "step_s": 6.1,
        "sd_fraction": 0.25, "mean_accepted_length": 1.5 + step, "redispatched": 0,
        "failed_workers": [], **extra,
    }  # fmt: skip


def test_bar_and_live_line() -> None:
    assert bar(0, 10, width=10) == "[..........]"
    assert bar(5, 10, width=10) == "[#####.....]"
    assert bar(3, 0, width=4) == "[....]"
    status = TrainerStatus(2, 5, "running", 2, 1, reward_mean=0.25, accuracy=0.5,
                           accepted_length=2.5, eval_accuracy=0.4, sd_fraction=0.3,
                           eval_sampled_accuracy=0.35)  # fmt: skip
    books = HarvestBooks()
    books.idle[1], books.harvested[1] = 3.0, 2.0
    line = live_line(status, books)
    for part in ("reward 0.250", "acc 0.500", "eval 0.400/0.350", "sd 30%", "acc.len 2.50",
                 "drafter v1", "idle 3.0s", "harvested 2.0s"):  # fmt: skip
        assert part in line
    assert "WARNING" not in line
    collapsed = dataclasses.replace(status, accepted_length=1.0, acceptance_collapsed=True)
    assert "WARNING: SD accepts almost nothing (stale drafter)" in live_line(collapsed, books)


def test_progress_prints_one_line_per_completed_step_off_a_terminal() -> None:
    out = io.StringIO()
    progress = Progress(out)
    status = TrainerStatus(1, 3, "running", 1, -1, step_seconds=StepSeconds(4.0, 1.0, 2.0),
                           figures_step=1)  # fmt: skip
    progress.update(status, HarvestBooks())
    progress.update(status, HarvestBooks())  # same step again: nothing new
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("step    1/3")
    assert "rollout 4.0s (tail 1.0s) train 2.0s" in lines[0]


def _polled(
    step: int,
    done: int | None,
    reward: float | None = None,
    accuracy: float | None = None,
    eval_acc: float | None = None,
) -> TrainerStatus:
    """A status as the trainer answers it: ``step`` trained, ``done`` complete with figures."""
    seconds = None if done is None else StepSeconds(float(done), 0.5, 1.0)
    return TrainerStatus(step, 3, "running", step, -1, reward_mean=reward, accuracy=accuracy,
                         eval_accuracy=eval_acc, step_seconds=seconds,
                         figures_step=done)  # fmt: skip


def test_each_step_line_carries_that_steps_own_figures_once() -> None:
    # The trainer's order (trainer/driver.py): the step counter moves when the policy is
    # updated; the step's figures follow once its weights are published and its eval is done.
    polls = [
        _polled(0, None),  # step 1's rollout
        _polled(1, None),  # step 1 trained, publishing: no figures yet
        _polled(1, 1, 0.25, 0.25),  # step 1 complete
        _polled(1, 1, 0.25, 0.25),  # step 2's rollout
        _polled(2, 1, 0.25, 0.25),  # step 2 trained; the status still has step 1's row
        _polled(2, 1, 0.25, 0.25, eval_acc=0.6),  # step 2's eval done, row not yet
        _polled(2, 2, 0.5, 0.5, eval_acc=0.6),  # step 2 complete
        _polled(3, 3, 0.7, 0.625, eval_acc=0.6),  # step 3: a format reward (0.7 != 0.625)
        _polled(3, 3, 0.7, 0.625, eval_acc=0.6),
    ]
    out = io.StringIO()
    progress = Progress(out)
    for status in polls:
        progress.update(status, HarvestBooks())
    lines = out.getvalue().splitlines()
    assert [ln[:12] for ln in lines] == ["step    1/3 ", "step    2/3 ", "step    3/3 "], lines
    assert "reward=acc 0.250" in lines[0] and "rollout 1.0s" in lines[0]
    assert "reward=acc 0.500" in lines[1] and "eval 0.600" in lines[1], lines[1]
    assert "rollout 2.0s" in lines[1]
    assert "reward 0.700  acc 0.625" in lines[2] and "reward=acc" not in lines[2]


def test_a_step_completed_between_two_polls_is_named() -> None:
    out = io.StringIO()
    progress = Progress(out)
    for status in (_polled(1, 1, 0.25, 0.25), _polled(3, 3, 0.5, 0.5)):
        progress.update(status, HarvestBooks())
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("step    3/3")
    assert "(step 2 completed between two polls: see metrics.jsonl)" in lines[1]


def test_write_report(tmp_path: Path) -> None:
    rows = [_row(1), _row(2, eval_accuracy=0.5, eval_sampled_accuracy=0.45)]
    rows[1]["acceptance_collapsed"] = True
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    books = HarvestBooks()
    books.idle[2], books.harvested[2] = 4.0, 3.0
    info = {"job": "t", "start_eval_accuracy": 0.25, "start_eval_sampled_accuracy": 0.2}
    summary = write_report(tmp_path, books, info)
    assert summary["steps_completed"] == 2
    assert abs(summary["eval_gain_points"] - 25.0) < 1e-9
    assert abs(summary["eval_sampled_gain_points"] - 25.0) < 1e-9
    assert summary["acceptance_collapsed_steps"] == [2]
    assert summary["harvested_s_total"] == 3.0 and summary["idle_s_total"] == 4.0
    csv = (tmp_path / "metrics.csv").read_text().splitlines()
    assert len(csv) == 3 and csv[0].startswith("step,policy_version")
    for name in ("reward_accuracy.png", "step_time.png", "accepted_length.png"):
        assert (tmp_path / "report" / name).read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "eval_gain_points | 25.000" in md and "![step_time.png](step_time.png)" in md
    assert "<img" in (tmp_path / "report" / "summary.html").read_text()
    assert json.loads((tmp_path / "summary.json").read_text())["steps_completed"] == 2


def test_summary_reports_the_last_five_steps_and_the_rollout_share(tmp_path: Path) -> None:
    rows = [_row(i) for i in range(1, 8)]  # accepted length 1.5 + step
    rows[6]["mean_accepted_length"] = None  # a step without speculation does not count
    rows[0].update(rollout_s=1.0, step_s=5.0)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = write_report(tmp_path, None, {"job": "t"})
    assert summary["accepted_length_last5"] == pytest.approx((4.5 + 5.5 + 6.5 + 7.5) / 4)
    assert summary["rollout_share"] == pytest.approx((1.0 + 6 * 4.0) / (5.0 + 6 * 6.1))
    assert summary["train_share"] == pytest.approx(7 * 2.0 / (5.0 + 6 * 6.1))


def test_trainer_harvest_in_the_live_line_and_the_report(tmp_path: Path) -> None:
    status = TrainerStatus(2, 5, "running", 2, 1)
    books = HarvestBooks()
    assert "trainer" not in live_line(status, books)  # not a harvest target: as before
    books = HarvestBooks(trainer_tracked=True)
    books.trainer_harvested[2] = 1.5
    assert "trainer 1.5s" in live_line(status, books)
    rows = [_row(1), _row(2, trainer_harvested_s=2.5)]  # the trainer's own figure wins
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = write_report(tmp_path, books, {"job": "t"})
    assert summary["trainer_harvested_s_total"] == 2.5
    header, first, second = (tmp_path / "metrics.csv").read_text().splitlines()
    column = header.split(",").index("trainer_harvested_s")
    assert first.split(",")[column] == "0.0" and second.split(",")[column] == "2.5"
    plain = write_report(tmp_path, HarvestBooks(), {"job": "t"})
    assert "trainer_harvested_s_total" in plain  # rows carry it; without them it is absent
    (tmp_path / "metrics.jsonl").write_text(json.dumps(_row(1)) + "\n")
    assert "trainer_harvested_s_total" not in write_report(tmp_path, HarvestBooks(), {"job": "t"})


def test_weight_sync_in_the_step_line_the_csv_and_the_summary(tmp_path: Path) -> None:
    out = io.StringIO()
    seconds = StepSeconds(4.0, 1.0, 2.0, sync_pause=0.75, sync_gb_per_s=1.25)
    Progress(out).update(TrainerStatus(2, 3, "running", 2, -1, step_seconds=seconds,
                                       figures_step=2), HarvestBooks())  # fmt: skip
    assert "train 2.0s sync 0.75s, 1.25 GB/s" in out.getvalue()
    assert from_wire(StepSeconds, to_wire(seconds), "stepSeconds") == seconds
    sync = {"sync_version": 1, "sync_transport": "broadcast", "sync_gather_s": 0.25,
            "sync_pack_s": 0.125, "sync_wire_s": 0.5, "sync_load_s": 0.125, "sync_pause_s": 1.0,
            "sync_bytes": 2_000_000_000, "sync_gb_per_s": 2.0}  # fmt: skip
    rows = [_row(1), _row(2, **sync), _row(3, **{**sync, "sync_pause_s": 2.0,
                                                  "sync_gb_per_s": 1.0})]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = write_report(tmp_path, None, {"job": "t"})
    assert summary["weight_sync_transport"] == "broadcast"
    assert summary["weight_sync_pause_s_mean"] == 1.5 and summary["weight_sync_wire_s_mean"] == 0.5
    assert summary["weight_sync_gb_per_s_mean"] == 1.5  # step 1 had no booked sync: left out
    header, first, second, _ = (tmp_path / "metrics.csv").read_text().splitlines()
    columns = header.split(",")
    assert dict(zip(columns, second.split(","), strict=True))["sync_pause_s"] == "1.0"
    assert dict(zip(columns, first.split(","), strict=True))["sync_pause_s"] == ""
    (tmp_path / "old").mkdir()  # rows of older versions: no weight-sync figures
    (tmp_path / "old" / "metrics.jsonl").write_text(json.dumps(_row(1)) + "\n")
    assert "weight_sync" not in json.dumps(write_report(tmp_path / "old", None, {}))


def test_the_report_says_when_the_rollout_shrank_and_grew(tmp_path: Path) -> None:
    """Elastic rollout: each row's ``rollout_workers`` is a CSV column, and the summary lists
    the steps whose count changed (rows written before the count are skipped)."""
    counts = [None, 2, 1, 1, 2]
    lines = [_row(i, **({} if n is None else {"rollout_workers": n}))
             for i, n in enumerate(counts, 1)]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    summary = write_report(tmp_path, None, {"job": "t", "wall_s": 1.0})
    assert summary["rollout_resizes"] == [
        {"step": 3, "was": 2, "rollout_workers": 1},
        {"step": 5, "was": 1, "rollout_workers": 2},
    ]
    header, *csv_rows = (tmp_path / "metrics.csv").read_text().splitlines()
    column = header.split(",").index("rollout_workers")
    assert [r.split(",")[column] for r in csv_rows] == ["", "2", "1", "1", "2"]
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "| rollout_resizes | step 3, was 2, rollout_workers 1; step 5, was 1, " in md
