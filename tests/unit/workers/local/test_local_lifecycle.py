"""``longtail run``'s children and the parent's end (issue #21 items 5 and 7), without a model.

The child's parent watchdog (``parentwatch.py``) with fakes and with real processes (a parent
killed with SIGKILL), the parent's stop signals (SIGHUP unless ``nohup`` ignores it), the
progress display surviving a closed terminal, and the restart book-keeping of lost rollout
workers (``local/restarts.py``) with fake children. The end-to-end checks with real workers are
in ``tests/e2e_local/test_local_run.py``.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from longtail_workers.local.launcher import free_port
from longtail_workers.local.progress import Progress
from longtail_workers.local.restarts import Restarts
from longtail_workers.local.run import stop_signals
from longtail_workers.parentwatch import ENV, ParentWatchError, parent_pid, watch

REPO = Path(__file__).resolve().parents[4]


def test_parent_pid_is_taken_out_of_the_environment_and_checked() -> None:
    env = {ENV: "4242", "OTHER": "x"}
    assert parent_pid(env) == 4242 and ENV not in env  # a grandchild does not inherit it
    assert parent_pid({}) is None
    with pytest.raises(ParentWatchError, match=r"LONGTAIL_PARENT_PID='abc'.*unset it"):
        parent_pid({ENV: "abc"})


def test_watch_sends_sigterm_to_itself_then_exits_after_the_grace() -> None:
    ppids = iter([100, 100, 1])
    calls: list[Any] = []
    watch(
        100,
        period_s=0.5,
        grace_s=30.0,
        getppid=lambda: next(ppids),
        kill=lambda pid, sig: calls.append(("kill", pid, sig)),
        sleep=lambda s: calls.append(("sleep", s)),
        exit_now=lambda code: calls.append(("exit", code)),
    )
    assert calls == [
        ("sleep", 0.5),
        ("sleep", 0.5),
        ("kill", os.getpid(), signal.SIGTERM),
        ("sleep", 30.0),
        ("exit", 1),
    ]


# A parent that starts one watched child, prints the child's pid, then sleeps until killed.
PARENT = f"""
import os, subprocess, sys, time
env = dict(os.environ, {ENV}=str(os.getpid()))
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env=env, start_new_session=True)
print(child.pid, flush=True)
time.sleep(120)
"""
CHILD = """
import time
from longtail_workers.parentwatch import watch_parent
watch_parent()
print("child ready", flush=True)
time.sleep(120)
"""


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_a_child_stops_when_its_parent_is_killed_with_sigkill() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    time.sleep(1.0)  # the child has imported parentwatch and started watching
    assert not _gone(child)
    parent.kill()
    parent.wait(10)
    deadline = time.monotonic() + 15
    while not _gone(child):
        assert time.monotonic() < deadline, f"child {child} outlived its killed parent by 15 s"
        time.sleep(0.1)


def test_sighup_stops_the_run_unless_nohup_ignores_it() -> None:
    previous = signal.getsignal(signal.SIGHUP)
    try:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        assert signal.SIGHUP in stop_signals()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        assert stop_signals() == [signal.SIGINT, signal.SIGTERM]
    finally:
        signal.signal(signal.SIGHUP, previous)


class ClosedTerminal(io.StringIO):
    def write(self, s: str) -> int:
        raise OSError(5, "Input/output error")


def test_progress_drops_output_once_the_terminal_is_gone() -> None:
    p = Progress(ClosedTerminal())
    p.message("stopping")  # no exception: the run goes on to stop its children
    p.message("report: ...")
    assert p.lost


class FakeProc:
    def __init__(self, code: int | None) -> None:
        self.code = code

    def poll(self) -> int | None:
        return self.code


class FakeChild:
    def __init__(self, name: str, role: str, code: int | None = None) -> None:
        self.name, self.role, self.proc = name, role, FakeProc(code)
        self.restarts = 0

    @property
    def alive(self) -> bool:
        return self.proc.code is None

    def restart(self) -> FakeChild:
        self.restarts += 1
        return FakeChild(self.name, self.role)


def test_a_lost_rollout_worker_is_restarted_up_to_backoff_limit() -> None:
    trainer, verifier = FakeChild("trainer", "trainer"), FakeChild("verifier", "verifier")
    w0, w1 = FakeChild("rollout-0", "rollout"), FakeChild("rollout-1", "rollout", code=-9)
    children: list[Any] = [verifier, w0, w1, trainer]
    written: list[int] = []
    r = Restarts(limit=1, on_restart=lambda: written.append(1))
    lines = r.check(children, trainer)
    assert children[2] is not w1 and children[2].alive and w1.restarts == 1
    assert written == [1], "processes.json is rewritten with the new pid"
    assert lines == [
        "warning: rollout-1 exited with -9; restarted it (restart 1 of spec.backoffLimit=1); "
        "it takes prompts again from the step after it has loaded"
    ]
    assert r.check(children, trainer) == []  # nothing new
    children[2].proc.code = 1  # lost again: past the limit
    (line,) = r.check(children, trainer)
    assert "not restarted: 1 restarts made, spec.backoffLimit=1 (raise it" in line
    assert "the run shrinks to 1 rollout worker(s) (spec.rollout.minReplicas is empty" in line
    assert r.check(children, trainer) == []  # reported once
    verifier.proc.code = 0
    (line,) = r.check(children, trainer)
    assert line == "warning: verifier exited with 0; it is not restarted"
    summary = r.summary()
    assert summary["lost_workers"] == ["rollout-1 (exit -9)", "rollout-1 (exit 1)",
                                       "verifier (exit 0)"]  # fmt: skip
    assert summary["restarted_workers"] == ["rollout-1"]
    (shrink,) = summary["rollout_shrinks"]  # the second loss, past the limit
    assert (shrink["was"], shrink["rollout_workers"]) == (2, 1), shrink


def test_a_run_without_min_replicas_goes_on_down_to_one_worker_and_stops_at_none() -> None:
    """``minReplicas`` empty: the floor is 1, as local mode always had it; with no rollout
    worker left the run stops at once (grace or not: nothing could generate)."""
    trainer = FakeChild("trainer", "trainer")
    w0, w1 = FakeChild("rollout-0", "rollout", code=1), FakeChild("rollout-1", "rollout")
    children: list[Any] = [w0, w1, trainer]
    r = Restarts(limit=0, grace_s=300.0, run_dir="runs/x")
    r.check(children, trainer)
    assert r.below_min(children) is None  # rollout-1 still generates
    assert [(s["was"], s["rollout_workers"]) for s in r.resizes] == [(2, 1)]
    w1.proc.code = 1
    r.check(children, trainer)
    why = r.below_min(children)
    assert why is not None and why.startswith("0 of 2 rollout workers alive, none left")
    assert "lost for good: rollout-0, rollout-1" in why and "spec.backoffLimit=0" in why
    assert "`longtail run --resume runs/x`" in why
    assert Restarts(limit=0).below_min([trainer]) is None  # a run without rollout children
    assert r.summary()["rollout_shrinks"][1]["rollout_workers"] == 0


def test_below_min_replicas_the_run_stops_after_the_grace_and_not_before() -> None:
    now = [0.0]
    trainer = FakeChild("trainer", "trainer")
    w = [FakeChild(f"rollout-{i}", "rollout") for i in range(3)]
    children: list[Any] = [*w, trainer]
    r = Restarts(limit=0, floor=2, min_replicas=2, grace_s=10.0, clock=lambda: now[0])
    w[0].proc.code = -9
    (line,) = r.check(children, trainer)
    assert "the run shrinks to 2 rollout worker(s) (spec.rollout.minReplicas=2)" in line
    assert r.below_min(children) is None  # 2 of 3: at the floor, goes on
    w[1].proc.code = -9
    r.check(children, trainer)
    assert r.below_min(children) is None  # 1 < 2: the grace starts
    now[0] = 9.0
    assert r.below_min(children) is None
    now[0] = 10.5
    why = r.below_min(children)
    assert why is not None and why.startswith(
        "1 of 3 rollout workers alive, fewer than spec.rollout.minReplicas=2 for 10s "
        "(spec.rollout.belowMinGraceSeconds=10)"
    ), why
    assert "lost for good: rollout-0, rollout-1" in why and "--resume RUN_DIR" in why


def test_back_at_min_replicas_within_the_grace_the_run_goes_on() -> None:
    """A worker counted again (a restarted one is alive from its start) ends the grace."""
    now = [0.0]
    trainer = FakeChild("trainer", "trainer")
    w0, w1 = FakeChild("rollout-0", "rollout"), FakeChild("rollout-1", "rollout", code=1)
    children: list[Any] = [w0, w1, trainer]
    r = Restarts(limit=0, floor=2, min_replicas=2, grace_s=5.0, clock=lambda: now[0])
    r.check(children, trainer)
    assert r.below_min(children) is None
    now[0] = 4.0
    children[1] = FakeChild("rollout-1", "rollout")  # alive again
    assert r.below_min(children) is None
    now[0] = 20.0
    children[1].proc.code = 1  # below again: a new grace from here
    assert r.below_min(children) is None
    now[0] = 26.0
    assert r.below_min(children) is not None


def test_free_port_never_hands_out_a_port_twice() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)


def test_two_workers_lost_in_one_poll_are_two_shrinks() -> None:
    trainer = FakeChild("trainer", "trainer")
    w = [FakeChild(f"rollout-{i}", "rollout", code=-9 if i else None) for i in range(3)]
    w[2].proc.code = -9
    r = Restarts(limit=0)
    r.check([*w, trainer], trainer)
    assert [(s["was"], s["rollout_workers"]) for s in r.resizes] == [(3, 2), (2, 1)]
