"""A child of ``longtail run`` stops when its parent dies: a watchdog thread on the parent pid.

``longtail run`` (``local/launcher.py``, :class:`~longtail_workers.local.launcher.Child`) puts
its own pid in ``LONGTAIL_PARENT_PID`` of every child it starts; ``longtail worker`` (the CLI's
``cmd_worker``) calls :func:`watch_parent` first thing, before the role's module (and torch) is
imported. When the parent is gone (``os.getppid()`` is no longer that pid: the child was
reparented to init or a subreaper), the watchdog sends SIGTERM to its own process, which is
exactly what a living parent sends: the services' handlers (``signals.py``) stop cleanly, the
trainer checkpoints the last completed step, and a child still starting up (no handler yet) dies
of the default action. If the process has not exited ``grace_s`` later, it is ended with
``os._exit``. Without the variable (worker pods, hand-started workers, tests) nothing runs.

Why a watchdog and not Linux's ``prctl(PR_SET_PDEATHSIG)``: the death signal fires when the
*thread* that forked the child exits, not the process (``longtail run`` may restart a lost worker
from a thread one day), Python can only set it through ``preexec_fn``, which is unsafe while the
parent runs its log-pump and coordinator threads, and it does not exist on macOS. Polling
``getppid()`` covers SIGKILL of the parent, a crash and the race where the parent died before the
child started (the pid differs at the first look), on every POSIX system, for one cheap syscall
every ``period_s`` (0.5 s: a dead parent's children are told within half a second).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, MutableMapping

from longtail_api.podenv import PARENT_PID

ENV = PARENT_PID  # named in longtail_api.podenv, with every other LONGTAIL_* variable
PERIOD_S = 0.5
GRACE_S = 30.0


class ParentWatchError(ValueError):
    """``LONGTAIL_PARENT_PID`` holds something other than a process id."""


def parent_pid(env: MutableMapping[str, str]) -> int | None:
    """The pid to watch, taken out of ``env`` (a grandchild must not watch its grandparent)."""
    raw = env.pop(ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) <= 1:
        raise ParentWatchError(
            f"environment variable {ENV}={raw!r} is not the pid of a parent process; "
            "`longtail run` sets it for its children: unset it to run a worker by hand"
        )
    return int(raw)


def watch(
    parent: int,
    period_s: float = PERIOD_S,
    grace_s: float = GRACE_S,
    *,
    getppid: Callable[[], int] = os.getppid,
    kill: Callable[[int, int], None] = os.kill,
    sleep: Callable[[float], None] = time.sleep,
    exit_now: Callable[[int], object] = os._exit,
) -> None:
    """Wait while ``parent`` is this process's parent; then SIGTERM self, and exit after grace."""
    while getppid() == parent:
        sleep(period_s)
    with contextlib.suppress(OSError, ValueError):  # the parent held our stderr pipe's other end
        print(f"parent process {parent} is gone: stopping", file=sys.stderr, flush=True)
    kill(os.getpid(), signal.SIGTERM)
    sleep(grace_s)
    exit_now(1)


def watch_parent(env: MutableMapping[str, str] | None = None) -> threading.Thread | None:
    """Start the watchdog (a daemon thread) when ``env`` names a parent; None otherwise."""
    pid = parent_pid(os.environ if env is None else env)
    if pid is None:
        return None
    thread = threading.Thread(target=watch, args=(pid,), name="parent-watch", daemon=True)
    thread.start()
    return thread
