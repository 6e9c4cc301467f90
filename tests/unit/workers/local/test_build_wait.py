"""A process waiting for another one's first-use build stops on SIGINT/SIGTERM at once
(issue #48 item 10).

Real processes: a holder builds a cache entry (``models/cache.py``'s ``build_once``, or the lock
of ``builtin:tiny`` held directly) for far longer than the test runs; a waiter asks for the same
entry and is sent a signal once it says it waits. Before the fix the waiter slept in ``flock``
until the holder finished whenever the signal did not raise (a worker's stop handler, a SIGINT
inherited as ignored), and ``longtail run`` ignored Ctrl-C while another run built the model.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from longtail_workers.models.builtin import policy_dir
from longtail_workers.models.cache import CACHE_ENV, build_holder, lock_path, wait_for_build

REPO = Path(__file__).resolve().parents[4]
HOLD_S = 120.0
"""How long the holder builds: far longer than any wait the test allows."""
SAYS_WAITING_S = 240.0
"""The test's bound for a waiter to reach its wait (a cold ``longtail run`` imports a lot)."""
EXIT_S = 5.0
"""The test's bound for a signalled waiter to exit (it polls the lock five times a second)."""

HOLDER = """
import sys, time
from pathlib import Path
from longtail_workers.models.cache import build_once
def build(tmp):
    print("building", flush=True)
    time.sleep(float(sys.argv[2]))
build_once(Path(sys.argv[1]), "done", build)
"""
WAITER = """
import signal, sys, threading
from pathlib import Path
from longtail_workers.models.cache import build_once
from longtail_workers.signals import install_stop_signals
if sys.argv[2] == "service":
    install_stop_signals(threading.Event())  # what the trainer does before loading its model
build_once(Path(sys.argv[1]), "done", lambda tmp: (tmp / "done").write_text("x"))
print("built", flush=True)
"""


def _python(code: str, *args: str, **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env=env, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def _wait_for_line(proc: subprocess.Popen[str], text: str, timeout_s: float) -> str:
    """The output up to ``text`` (all there was if it never came); read from the pipe itself,
    so nothing waits unseen in a reader's buffer."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    seen = ""
    deadline = time.monotonic() + timeout_s
    while text not in seen and time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            seen += os.read(fd, 65536).decode(errors="replace")
    return seen


def _stop_within(proc: subprocess.Popen[str], sig: signal.Signals) -> tuple[float, str]:
    """Send ``sig``; (seconds to exit, output). Kills it and fails past :data:`EXIT_S`."""
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        out, _ = proc.communicate(timeout=EXIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"still waiting {EXIT_S:.0f}s after {sig.name}")
    return time.monotonic() - sent, out


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Path]:
    """An entry under ``tmp_path`` that another process is building."""
    final = tmp_path / "cache" / "entry"
    proc = _python(HOLDER, str(final), str(HOLD_S))
    try:
        assert "building" in _wait_for_line(proc, "building", SAYS_WAITING_S)
        yield final
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.parametrize(
    ("mode", "sig"),
    [
        ("plain", signal.SIGINT),  # Python's own KeyboardInterrupt
        ("service", signal.SIGTERM),  # a worker's stop handler only sets its stop event
        ("service", signal.SIGINT),
        ("sigint-ignored", signal.SIGINT),  # launched in the background by a shell
    ],
)
def test_a_signal_stops_the_wait_for_another_process_build(
    holder: Path, mode: str, sig: signal.Signals
) -> None:
    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    preexec = ignore_sigint if mode == "sigint-ignored" else None
    waiter = _python(WAITER, str(holder), mode, preexec_fn=preexec)
    try:
        said = _wait_for_line(waiter, "waiting for the build", SAYS_WAITING_S)
        assert f"pid {os.getpid()}" not in said  # it names the holder, not the test
        seconds, out = _stop_within(waiter, sig)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
    print(f"{mode}: exited {seconds:.2f}s after {sig.name}")
    assert waiter.returncode != 0 and "built" not in out
    assert f"stopped by {sig.name} while waiting for the build of entry" in said + out


def test_the_holder_is_named_and_a_finished_build_is_not_waited_for(holder: Path) -> None:
    assert (build_holder(holder) or "").startswith("pid ")
    with pytest.raises(TimeoutError, match=r"waited .* for the build of .*entry.* by pid "):
        wait_for_build(holder, wait_s=0.5)
    free = holder.parent / "other"
    assert build_holder(free) is None
    wait_for_build(free, wait_s=0.5)  # nobody builds it: at once


def test_longtail_run_waiting_for_the_tiny_build_stops_on_ctrl_c(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    tiny = policy_dir()  # under the test's cache: nothing there is built
    tiny.parent.mkdir(parents=True)
    with open(lock_path(tiny), "w") as lock:  # another process (here: the test) builds it
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write("pid 1 (the test) since now\n")
        lock.flush()
        run = subprocess.Popen(
            [sys.executable, "-m", "longtail_cli.main", "run",
             str(REPO / "tests" / "e2e_local" / "ci-tiny.yaml"), "--output",
             str(tmp_path / "run")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        try:
            said = _wait_for_line(run, "waiting for the build", SAYS_WAITING_S)
            assert "pid 1 (the test)" in said
            seconds, out = _stop_within(run, signal.SIGINT)
        finally:
            if run.poll() is None:  # never left waiting for (or building) the model
                run.kill()
                run.communicate()
    print(f"longtail run exited {seconds:.2f}s after SIGINT")
    assert run.returncode == 130
    assert "stopped: stopped by SIGINT while waiting for the build of tiny-" in out
    assert "Traceback" not in said + out


def test_the_e2e_session_waits_once_for_another_build_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The e2e tests' fixture (``tests/e2e_local/conftest.py``): with another process building
    ``builtin:tiny``, a session of two e2e tests waits once, saying for whom, and both tests
    error at once with the reason when the wait runs out (before: each test waited under its
    own timeout)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    tiny = policy_dir()
    tiny.parent.mkdir(parents=True)
    with open(lock_path(tiny), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write("pid 1 (another longtail run) since now\n")
        lock.flush()
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "timeout=60",
             "tests/e2e_local/test_local_run.py", "-k",
             "two_step_run_writes_a_complete_run_dir or two_step_run_with_broadcast"],
            cwd=REPO, capture_output=True, text=True, timeout=600,
            env={**os.environ, "LONGTAIL_E2E_BUILD_WAIT_S": "3"},
        )  # fmt: skip
    out = run.stdout + run.stderr
    said = "builtin:tiny is being built by pid 1 (another longtail run) since now"
    assert out.count(said) == 1, out[-3000:]
    assert "2 errors" in out and "Timeout" not in out, out[-3000:]
    assert out.count("builtin:tiny is not available for the e2e tests: waited") >= 2, out[-3000:]
