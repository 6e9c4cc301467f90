"""Checker processes for the ``math`` reward: math-verify with a time limit that holds in threads.

``math_reward.py`` calls :func:`math_checker` ``.check(gold, answer)`` once per answer; the
verifier calls :func:`configure_math_checker` at start-up with its flags. math-verify limits its
own work with ``signal.alarm``, which raises ``ValueError`` outside a process's main thread, and
the verifier scores answers in its HTTP threads (and ``score_request`` fans a batch out over
threads). So the work runs in child processes (``python -m longtail_workers.rewards.mathcheck``),
each judging one answer at a time in its main thread under its own alarm of ``timeout_s``
(``mathcheck.py``). The parent waits ``timeout_s`` plus :data:`KILL_GRACE_S` for the reply; a
child that is still silent then (stuck in C code the alarm cannot interrupt) is killed and
replaced. Either way the answer is scored incorrect with a :attr:`Verdict.reason` that says why,
and nothing stalls for longer than that bound.

Up to ``processes`` children run at once (default: the CPUs this process may use, its
cgroup's CPU limit included, at most :data:`MAX_DEFAULT_PROCESSES`); they start on first use
and are reused. A child reads its requests from a pipe and exits when the pipe closes, so none
outlives its parent.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_TIMEOUT_S = 5.0
"""Per-answer limit on parsing both sides and comparing them (math-verify's own default)."""
KILL_GRACE_S = 5.0
"""How long past ``timeout_s`` a child may take to reply before it is killed (default)."""
START_TIMEOUT_S = 120.0
"""How long a child may take to import math-verify (sympy) and say it is ready."""
MAX_DEFAULT_PROCESSES = 4
MODULE = "longtail_workers.rewards.mathcheck"


@dataclass(frozen=True)
class Verdict:
    """math-verify's judgement of one answer."""

    correct: bool
    reason: str | None = None
    """Why no verdict was reached (timeout, crash), or ``None`` when math-verify gave one."""


class CheckerUnavailable(RuntimeError):
    """No checker process could be started or freed in time; the message says why."""


class _ProcessDied(RuntimeError):
    pass


class _Process:
    """One checker child and the reply bytes read from it so far."""

    def __init__(self, command: Sequence[str], start_timeout_s: float) -> None:
        self.proc = subprocess.Popen(
            list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None
        )
        self._buffer = b""
        try:
            ready = self._read_reply(time.monotonic() + start_timeout_s)
        except _ProcessDied as exc:
            raise CheckerUnavailable(
                f"the math checker process exited during start-up ({exc}; its error is in the "
                f"log above); is math-verify installed? (`make install`)"
            ) from None
        if ready != {"ready": True}:
            self.kill()
            raise CheckerUnavailable(
                f"the math checker process did not start within {start_timeout_s:g} s"
            )

    def ask(self, gold: str, answer: str, budget_s: float, wait_s: float) -> dict[str, Any] | None:
        """Send one request and wait up to ``wait_s`` for the reply (``None``: no reply)."""
        assert self.proc.stdin is not None
        line = json.dumps({"gold": gold, "answer": answer, "budget": budget_s}) + "\n"
        try:
            self.proc.stdin.write(line.encode("ascii"))  # json.dumps escapes non-ASCII
            self.proc.stdin.flush()
        except OSError as exc:  # BrokenPipeError: the child is gone
            raise _ProcessDied(f"{exc}; exit code {self.proc.poll()}") from exc
        return self._read_reply(time.monotonic() + wait_s)

    def _read_reply(self, deadline: float) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        poller = select.poll()  # not select.select: fds above 1023 in a busy trainer
        poller.register(fd, select.POLLIN)
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(remaining * 1000):
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise _ProcessDied(f"exit code {self.proc.wait(timeout=10)}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


class MathChecker:
    """A pool of checker processes; :meth:`check` is safe to call from any thread."""

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        processes: int | None = None,
        *,
        start_timeout_s: float = START_TIMEOUT_S,
        kill_grace_s: float = KILL_GRACE_S,
        command: Sequence[str] | None = None,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: must be > 0 seconds, got {timeout_s!r}")
        if processes is not None and processes < 1:
            raise ValueError(f"processes: must be >= 1, got {processes!r}")
        self.timeout_s = float(timeout_s)
        self.processes = processes if processes is not None else default_processes()
        self.start_timeout_s = start_timeout_s
        self.kill_grace_s = kill_grace_s
        self.command = list(command) if command is not None else [sys.executable, "-m", MODULE]
        self._cond = threading.Condition()
        self._idle: list[_Process] = []
        self._count = 0  # started and not discarded, idle or busy
        self._closed = False

    def check(self, gold: str, answer: str) -> Verdict:
        """math-verify's verdict on ``answer`` against ``gold`` (both final-answer texts)."""
        try:
            proc = self._acquire()
        except CheckerUnavailable as exc:
            return Verdict(False, f"no math check: {exc}")
        healthy = False
        try:
            wait_s = self.timeout_s + self.kill_grace_s
            reply = proc.ask(gold, answer, self.timeout_s, wait_s)
            if reply is None:
                proc.kill()
                return Verdict(
                    False,
                    f"math check killed: no reply within {wait_s:g} s (the {self.timeout_s:g} s "
                    f"alarm did not interrupt it); a new checker process will start",
                )
            healthy = True
            return Verdict(bool(reply["correct"]), reply["reason"])
        except _ProcessDied as exc:
            return Verdict(False, f"math checker process died ({exc}); a new one will start")
        finally:
            self._release(proc, healthy)

    def start(self) -> None:
        """Start one checker process now (raises :class:`CheckerUnavailable`): a start-up probe
        for services, so a missing math-verify stops them before any answer is scored."""
        self._release(self._acquire(), healthy=True)

    def close(self) -> None:
        """Stop the idle processes now and the busy ones when they finish."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            self._cond.notify_all()
        for proc in idle:
            proc.kill()

    def _acquire(self) -> _Process:
        wait_s = self.start_timeout_s + self.timeout_s + self.kill_grace_s
        deadline = time.monotonic() + wait_s
        with self._cond:
            while self._closed or (not self._idle and self._count >= self.processes):
                if self._closed:
                    raise CheckerUnavailable("the checker is closed")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CheckerUnavailable(
                        f"all {self.processes} checker processes stayed busy for {wait_s:g} s"
                    )
                self._cond.wait(remaining)
            if self._idle:
                return self._idle.pop()
            self._count += 1
        try:
            return _Process(self.command, self.start_timeout_s)
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def _release(self, proc: _Process, healthy: bool) -> None:
        with self._cond:
            keep = healthy and not self._closed
            if keep:
                self._idle.append(proc)
            else:
                self._count -= 1
            self._cond.notify()
        if not keep and proc.proc.poll() is None:
            proc.kill()


def default_processes() -> int:
    """The CPUs this process may use (its affinity and its cgroup's CPU limit: a verifier pod
    with ``cpu: 500m`` gets one), at most :data:`MAX_DEFAULT_PROCESSES`."""
    cpus: float = len(os.sched_getaffinity(0))
    quota = cgroup_cpu_limit()
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, min(MAX_DEFAULT_PROCESSES, int(cpus)))


def cgroup_cpu_limit(path: str = "/sys/fs/cgroup/cpu.max") -> float | None:
    """CPUs the cgroup (v2) quota allows, ``None`` when unlimited or not readable."""
    try:
        with open(path) as handle:
            quota, period = handle.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


_default: MathChecker | None = None
_default_lock = threading.Lock()


def math_checker() -> MathChecker:
    """The process-wide checker the ``math`` reward uses (created with defaults on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = MathChecker()
        return _default


def configure_math_checker(timeout_s: float, processes: int | None = None) -> MathChecker:
    """Replace the process-wide checker with one of these settings (the old one is closed)."""
    global _default
    checker = MathChecker(timeout_s, processes)
    with _default_lock:
        old, _default = _default, checker
    if old is not None:
        old.close()
    return checker


@atexit.register
def _close_default() -> None:
    if _default is not None:
        _default.close()
