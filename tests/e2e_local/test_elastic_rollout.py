"""Elastic rollout in ``longtail run`` (issue #52): real workers, real processes, builtin:tiny.

``ci-tiny.yaml`` cut to the least that shows it (no eval, 6 prompts x 2 answers a step):

- ``minReplicas: 1``, ``backoffLimit: 0``: rollout-1 killed (SIGKILL) while it generates is
  not restarted; the step in flight re-dispatches its share to rollout-0, the run shrinks to one
  worker and completes. The rows' per-answer records (``answer_ids``, ``answer_workers``) show
  every request of every step answered exactly once, the killed step's answers all from
  rollout-0, and ``rollout_workers`` going 2 -> 1; ``summary.json`` says when it shrank.
- ``minReplicas: 2`` of 2, ``belowMinGraceSeconds: 2``: the same loss stops the run after the
  grace with a checkpoint of the last completed step, exit 75, and a reason naming
  ``minReplicas``, the counts and the resume command.
- ``backoffLimit: 1``: the killed worker is restarted and rejoins: it gets prompts from the step
  after it answers again (never the step in flight), loading that step's policy version at its
  first call (the row's ``worker_load_s``), and ``rollout_workers`` goes back to 2.

The harness is ``tests/doubles/localrun.py``, shared with ``test_local_run.py`` (a subprocess
per run, the run directory's files read back); the trainer's pool alone, with stub workers:
``tests/unit/workers/trainer/test_elastic_pool.py``.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from httpcall import http_json
from localrun import finish, longtail_run, rows, wait_for

JOB = Path(__file__).resolve().parent / "ci-tiny.yaml"
pytestmark = pytest.mark.slow
PROMPTS, GROUP = 6, 2


def elastic_job(tmp_path: Path, total_steps: int, backoff: int, **rollout: Any) -> Path:
    doc = yaml.safe_load(JOB.read_text())
    spec = doc["spec"]
    spec["algorithm"].update(
        totalSteps=total_steps, promptsPerStep=PROMPTS, groupSize=GROUP, maxNewTokens=160
    )
    spec["dataset"]["evalSize"] = 0  # no eval: the steps are the test
    spec["rollout"].update(rollout)
    spec["backoffLimit"] = backoff
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def kill_rollout_1_while_it_generates(run_dir: Path) -> int:
    """SIGKILL rollout-1 once step 1 is done and it generates a later step; returns the number
    of rows written before the kill (the killed step is a later one)."""
    wait_for(lambda: len(rows(run_dir)) >= 1, 200, "step 1 to complete")
    victim = next(
        p for p in json.loads((run_dir / "processes.json").read_text()) if p["name"] == "rollout-1"
    )

    def generating() -> bool:
        status, body = http_json(victim["url"] + "/v1/status", timeout=5.0)
        return status == 200 and isinstance(body, dict) and body["generating"] is True

    wait_for(generating, 120, "rollout-1 to generate")
    before = len(rows(run_dir))
    os.kill(victim["pid"], signal.SIGKILL)
    return before


def assert_every_request_answered_once(got: list[dict[str, Any]]) -> None:
    for row in got:
        want = [f"s{row['step']}-p{p}-g{g}" for p in range(PROMPTS) for g in range(GROUP)]
        assert row["answer_ids"] == want, row  # in request order: none lost, none twice
        assert len(row["answer_workers"]) == row["answers"] == len(want), row


def test_a_killed_worker_past_its_restarts_shrinks_the_run_which_completes(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    # Steps after the kill: one that lands as rollout-1 ends its shard shows at the next step.
    job = elastic_job(tmp_path, total_steps=8, backoff=0, minReplicas=1)
    proc = longtail_run(str(job), "--output", str(run_dir))
    try:
        kill_rollout_1_while_it_generates(run_dir)
    finally:
        code, out = finish(proc)
    assert code == 0, out
    got = rows(run_dir)
    assert [r["step"] for r in got] == list(range(1, 9)), out
    assert_every_request_answered_once(got)
    (killed,) = [r for r in got if "rollout-1" in r["failed_workers"]]
    assert killed["redispatched"] > 0 and killed["rollout_workers"] == 1, killed
    assert set(killed["answer_workers"]) == {"rollout-0"}, killed  # its share re-dispatched
    after = [r for r in got if r["step"] > killed["step"]]
    assert all(r["rollout_workers"] == 1 and set(r["answer_workers"]) == {"rollout-0"}
               for r in after), after  # fmt: skip
    assert all(r["rollout_workers"] == 2 for r in got if r["step"] < killed["step"])
    assert "the run shrinks to 1 rollout worker(s) (spec.rollout.minReplicas=1)" in out, out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "complete" and summary["restarted_workers"] == [], summary
    assert summary["rollout_resizes"] == [
        {"step": killed["step"], "was": 2, "rollout_workers": 1}
    ], summary
    (shrink,) = summary["rollout_shrinks"]
    assert (shrink["was"], shrink["rollout_workers"]) == (2, 1), shrink
    assert "rollout workers per step changed: step " in out


def test_below_min_replicas_past_the_grace_the_run_checkpoints_and_stops(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = elastic_job(tmp_path, total_steps=500, backoff=0, minReplicas=2, belowMinGraceSeconds=2)
    proc = longtail_run(str(job), "--output", str(run_dir))
    try:
        kill_rollout_1_while_it_generates(run_dir)
    finally:
        code, out = finish(proc)
    assert code == 75, out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "stopped", summary
    reason = summary["reason"]
    assert reason.startswith(
        "1 of 2 rollout workers alive, fewer than spec.rollout.minReplicas=2 for "
    ), reason
    assert "(spec.rollout.belowMinGraceSeconds=2)" in reason and "rollout-1" in reason
    assert f"longtail run --resume {run_dir}" in reason
    assert f"resume with: longtail run --resume {run_dir}" in out
    got = rows(run_dir)
    assert got and got[-1]["step"] < 500
    assert_every_request_answered_once(got)
    state = run_dir / "checkpoints" / f"step-{got[-1]['step']:06d}" / "state.json"
    assert state.is_file(), f"no checkpoint of the last completed step: {out}"


def test_a_restarted_worker_gets_prompts_from_the_step_after_it_is_back(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = elastic_job(tmp_path, total_steps=500, backoff=1)
    proc = longtail_run(str(job), "--output", str(run_dir))
    back = "rollout worker rollout-1 answers again; back in the pool"
    trainer_log = run_dir / "logs" / "trainer.log"
    try:
        kill_rollout_1_while_it_generates(run_dir)
        wait_for(lambda: back in trainer_log.read_text(), 180, "the restarted rollout-1")
        done = len(rows(run_dir))
        wait_for(lambda: len(rows(run_dir)) > done, 60, "the step it rejoined")
    finally:
        proc.send_signal(signal.SIGINT)
        code, out = finish(proc)
    assert code == 130, out
    got = rows(run_dir)
    assert_every_request_answered_once(got)
    (killed,) = [r for r in got if "rollout-1" in r["failed_workers"]]
    rejoined = next(r for r in got if r["step"] > killed["step"] and r["rollout_workers"] == 2)
    between = [r for r in got if killed["step"] <= r["step"] < rejoined["step"]]
    assert all("rollout-1" not in r["answer_workers"] for r in between), between
    assert "rollout-1" in rejoined["answer_workers"], rejoined  # prompts from its first step
    # It loaded the version that step generated with at its first call (HTTP catch-up).
    assert rejoined["sync_version"] == rejoined["policy_version"] - 1, rejoined
    assert "rollout-1" in rejoined["worker_load_s"], rejoined
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [(r["was"], r["rollout_workers"]) for r in summary["rollout_resizes"]]
    assert steps == [(2, 1), (1, 2)], summary
    assert summary["restarted_workers"] == ["rollout-1"] and summary["rollout_shrinks"] == []
