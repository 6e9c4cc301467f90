"""Child processes of ``longtail run``: start, read their URL, log, stop cleanly.

:class:`Child` starts one ``longtail worker ROLE ...`` command (``python -m longtail_cli.main``
with the same interpreter) in its own session, so a Ctrl-C in the terminal reaches only the
parent, which then stops the children in order; each child also stops by itself when the
parent dies (``LONGTAIL_PARENT_PID``, see ``parentwatch.py``), so a SIGKILL of ``longtail run``
orphans nothing. :meth:`Child.restart` starts the same command again (``local/restarts.py``,
for a lost rollout worker). Stdout and stderr go to
``RUN_DIR/logs/<name>.log``; a reader thread also looks for the ``... listening on URL`` line.
:func:`free_port` picks loopback ports up front so every process can be given every URL at
start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from longtail_api.podenv import PARENT_PID as PARENT_PID_ENV

_HANDED_OUT: set[int] = set()
"""Ports :func:`free_port` already gave this process: never given twice."""
_PORT_TRIES = 64


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago and that this process was not given
    before: the kernel can hand the same ephemeral port to two successive ``bind(0)`` calls
    once the first socket is closed, and two children given one port meet at the wrong URL
    (seen in CI: a rollout worker's URL answered by the trainer)."""
    held: list[socket.socket] = []  # kept bound until the end, so each try gets a new port
    try:
        for _ in range(_PORT_TRIES):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(s)
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
    finally:
        for s in held:
            s.close()
    raise OSError(f"no new loopback port in {_PORT_TRIES} tries ({len(_HANDED_OUT)} handed out)")


class ChildFailed(RuntimeError):
    """A child process exited or never became ready (message carries its log tail)."""


class Child:
    """One worker process."""

    def __init__(
        self,
        name: str,
        role: str,
        args: list[str],
        log_dir: Path,
        prefix: str,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.name, self.prefix, self.role, self.args = name, prefix, role, list(args)
        self.extra_env = dict(extra_env or {})
        """Set on top of this process's environment (a trainer rank's rendezvous)."""
        self.log_path = log_dir / f"{name}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **self.extra_env)
        env[PARENT_PID_ENV] = str(os.getpid())  # the child's watchdog: parentwatch.py
        cmd = [sys.executable, "-m", "longtail_cli.main", "worker", role, *args]
        self._log = self.log_path.open("ab")
        self._log_start = self._log.tell()  # a resumed run appends: this process's lines follow
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        self.url: str | None = None
        self._ready = threading.Event()
        self._pump_thread = threading.Thread(target=self._pump, name=f"log-{name}", daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._log.write(raw)
            self._log.flush()
            line = raw.decode("utf-8", "replace").strip()
            if self.url is None and line.startswith(self.prefix):
                self.url = line[len(self.prefix) :].strip()
                self._ready.set()
        self._ready.set()  # EOF: the process is gone; wait_ready reports it

    def wait_ready(self, timeout_s: float) -> str:
        if not self._ready.wait(timeout_s):
            raise ChildFailed(f"{self.name} printed no URL in {timeout_s:g}s\n{self.tail()}")
        if self.url is None:
            raise ChildFailed(f"{self.name} exited with {self.proc.poll()}\n{self.tail()}")
        return self.url

    def error_line(self) -> str | None:
        """Why it exited: its last ``error: ...`` line without the prefix (each worker's ``main``
        prints its fatal error so), else its last line; None when it printed nothing. Call once
        it has exited: waits up to 2 s for the rest of its output to reach the log."""
        self._pump_thread.join(timeout=2.0)
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_start)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return None
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        errors = [ln.removeprefix("error: ") for ln in lines if ln.startswith("error: ")]
        return errors[-1] if errors else (lines[-1] if lines else None)

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return "(no log)"
        return "\n".join(f"  {self.name}| {ln}" for ln in text)

    def restart(self) -> Child:
        """The same command as a new process (same name, port and log, appended to)."""
        self._pump_thread.join(timeout=2.0)
        self._log.close()
        parent = self.log_path.parent
        return Child(self.name, self.role, self.args, parent, self.prefix, self.extra_env)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; returns the exit code."""
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5.0)
        finally:
            self._pump_thread.join(timeout=2.0)  # the last lines reach the log before closing
            self._log.close()


def stop_all(children: list[Child], timeout_s: float = 10.0) -> None:
    """Stop children concurrently (SIGTERM to all, then wait, SIGKILL stragglers)."""
    for c in children:
        c.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for c in children:
        c.stop(max(0.1, deadline - time.monotonic()))
