"""Issue 48, item 7: a hung rollout worker is declared down within seconds, as a dead one is.

Two real rollout worker processes (``rollout_proc.py``: the real HTTP server and torch engine
around a tiny random Qwen2) and the trainer's real :class:`RolloutPool` with its default
``rollout.unresponsiveSeconds``. rollout-1 is stopped with SIGSTOP while it generates its shard
(the process is alive and the kernel still accepts connections, but nothing answers): the step
completes on rollout-0 within seconds, naming rollout-1 in ``failed_workers`` with its requests
counted in ``redispatched`` (the step row's fields), where the generate call used to wait for
the rollout timeout (900 s). After SIGCONT its late answer is dropped and the next step's health
check takes it back, as for a restarted worker. And the probe does not misfire on a worker that
is busy decoding: a tight threshold still sees both workers answer through long shards.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from httpcall import http_json

from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.trainer.dispatch import RolloutOutcome, RolloutPool
from longtail_workers.trainer.liveness import Liveness

HERE = Path(__file__).resolve().parents[1]
STEP_BOUND_S = 40.0
"""How long the test waits for the step with rollout-1 stopped (the default threshold is 6 s;
the old behaviour waits for SIGCONT, which the test then sends itself)."""


def _url(proc: subprocess.Popen[str], name: str, timeout_s: float = 120.0) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            if line.startswith("URL "):
                return line.split()[1]
            if not line and proc.poll() is not None:
                break
    pytest.fail(f"{name} did not start within {timeout_s}s (exit {proc.poll()})")


@pytest.fixture
def workers() -> Iterator[dict[str, subprocess.Popen[str]]]:
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(HERE / "rollout_proc.py"), "--name", name, "--hidden", "64"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for name in ("rollout-0", "rollout-1")
    }
    try:
        yield procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def reqs(step: int, n: int, max_new: int) -> list[GenerationRequest]:
    return [
        GenerationRequest([1, 2, i % 7], max_new, seed=step * 1000 + i, request_id=f"s{step}-r{i}")
        for i in range(n)
    ]


def summary(result: dict[str, Any]) -> str:
    out = result.get("out")
    if out is None:
        return repr(result.get("error"))
    return (
        f"rollout {out.seconds:.1f}s, failed_workers {out.failed_workers}, "
        f"redispatched {out.redispatched}"
    )


def generating(url: str) -> bool:
    status, body = http_json(url + "/v1/status", timeout=5.0)
    return status == 200 and isinstance(body, dict) and body["generating"] is True


def test_a_stopped_worker_is_declared_down_and_its_share_redispatched(
    workers: dict[str, subprocess.Popen[str]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="longtail_workers.trainer.dispatch")
    urls = {name: _url(proc, name) for name, proc in workers.items()}
    pool = RolloutPool(urls, timeout_s=300.0)  # the default liveness: unresponsiveSeconds 6
    stop = threading.Event()
    warm = pool.run(reqs(1, 8, 16), step=1, policy_version=0, stop=stop)
    assert warm.failed_workers == {} and {r.worker for r in warm.replies} == set(urls)

    # Step 2: rollout-1 is stopped while it generates its shard.
    requests = reqs(2, 16, 300)
    result: dict[str, Any] = {}

    def step_two() -> None:
        try:
            result["out"] = pool.run(requests, step=2, policy_version=0, stop=stop)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            result["error"] = exc

    runner = threading.Thread(target=step_two, daemon=True)
    started = time.monotonic()
    runner.start()
    deadline = started + 60.0
    while not generating(urls["rollout-1"]):
        assert runner.is_alive() and time.monotonic() < deadline, "rollout-1 never generated"
        time.sleep(0.02)
    victim = workers["rollout-1"]
    os.kill(victim.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    runner.join(timeout=STEP_BOUND_S)
    step_s = time.monotonic() - stopped
    if runner.is_alive():
        os.kill(victim.pid, signal.SIGCONT)  # let the old code's call end, then fail
        runner.join(timeout=120.0)
        pytest.fail(
            f"the step did not complete within {STEP_BOUND_S:g}s of rollout-1's SIGSTOP; "
            f"after SIGCONT it ended with {summary(result)}"
        )
    assert "error" not in result, summary(result)
    out: RolloutOutcome = result["out"]
    print(
        f"\nstep 2 completed {step_s:.1f}s after rollout-1's SIGSTOP (rollout {out.seconds:.1f}s)"
    )
    assert list(out.failed_workers) == ["rollout-1"], out.failed_workers
    assert "unresponsive" in out.failed_workers["rollout-1"], out.failed_workers
    assert out.redispatched == len(requests) // 2 > 0  # rollout-1's whole shard
    assert [s.request_id for s in out.samples] == [r.request_id for r in requests]
    assert {r.worker for r in out.replies} == {"rollout-0"}
    assert pool.down.keys() == {"rollout-1"}

    # A later step while it is still stopped: left out after the start's health check.
    pool.revive()
    out3 = pool.run(reqs(3, 4, 8), step=3, policy_version=0, stop=stop)
    assert out3.failed_workers == {} and {r.worker for r in out3.replies} == {"rollout-0"}

    # SIGCONT: its late answer is dropped, and the next step start takes it back.
    os.kill(victim.pid, signal.SIGCONT)
    late = "answered its abandoned call of step 2 late; the answer is dropped"
    deadline = time.monotonic() + 60.0
    while late not in caplog.text:
        assert time.monotonic() < deadline, "rollout-1 never answered its abandoned call"
        time.sleep(0.1)
    pool.revive(timeout_s=10.0)
    assert pool.down == {}
    out4 = pool.run(reqs(4, 8, 16), step=4, policy_version=0, stop=stop)
    assert out4.failed_workers == {} and {r.worker for r in out4.replies} == set(urls)


def test_busy_workers_answer_their_probes_through_long_shards(
    workers: dict[str, subprocess.Popen[str]],
) -> None:
    """A tight threshold (a quarter of the default) through shards that take seconds of
    decoding on a shared 2-core machine: no worker is declared down."""
    urls = {name: _url(proc, name) for name, proc in workers.items()}
    pool = RolloutPool(urls, timeout_s=300.0, liveness=Liveness(unresponsive_s=1.5))
    out = pool.run(reqs(1, 64, 480), step=1, policy_version=0, stop=threading.Event())
    print(f"\nrollout of 64 x 480 tokens: {out.seconds:.1f}s, no worker declared down")
    assert out.failed_workers == {} and out.redispatched == 0
    assert {r.worker for r in out.replies} == set(urls)
