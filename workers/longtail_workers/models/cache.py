"""Longtail's build cache: where built-in artefacts live and how each is built exactly once.

``builtin:tiny`` (:mod:`longtail_workers.models.builtin`) and its drafter
(:mod:`longtail_workers.warmstart.builtin`) are built on first use by whichever process needs them
first: in local mode the ``longtail run`` launcher, on a cluster every pod. :func:`build_once` is
the one way to do that safely: concurrent callers serialise on a lock file next to the entry, the
build goes to a temporary directory that is renamed into place only when complete, so a directory
that holds its marker file is always a whole artefact.

A caller that finds another process building waits for it (:func:`wait_for_build`), bounded
(:data:`BUILD_WAIT_S`), saying once which process it waits for; SIGINT and SIGTERM end that wait
at once (:class:`BuildWaitStopped`), whatever handler the process had for them: a ``longtail
run`` or a worker that installed its stop handler would otherwise sleep through Ctrl-C until the
other build ends. The lock file holds its holder's pid and start time for that message. The
tests' session fixture (``tests/e2e_local/conftest.py``) uses :func:`wait_for_build` and
:func:`build_holder` to wait once for a build another process is doing.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from longtail_api.podenv import CACHE_DIR

CACHE_ENV = CACHE_DIR  # named in longtail_api.podenv
BUILD_WAIT_S = 6 * 3600.0
"""Longest wait for another process's build (``builtin:small`` on a CPU takes hours)."""
POLL_S = 0.2
"""How often a waiting caller tries the lock again (and sees a stop signal)."""

log = logging.getLogger(__name__)


class BuildWaitStopped(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived while this process waited for another one's build."""


def cache_root() -> Path:
    """Root of Longtail's cache: ``$LONGTAIL_CACHE_DIR`` or ``~/.cache/longtail``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "longtail"


def lock_path(final: Path) -> Path:
    """The lock file of the cache entry ``final``."""
    return final.parent / f"{final.name}.lock"


def build_once(
    final: Path, marker: str, build: Callable[[Path], object], *, wait_s: float = BUILD_WAIT_S
) -> bool:
    """Make sure ``final`` holds a complete build; return True if this call built it.

    ``build(tmp)`` writes the artefact into the empty directory ``tmp``, ``marker`` (a file name)
    last. A ``final`` without ``marker`` (left by hand, or by an older layout) is replaced.
    Another process's build in progress is waited for (:func:`wait_for_build`, ``wait_s``).
    """
    if (final / marker).is_file():
        return False
    final.parent.mkdir(parents=True, exist_ok=True)
    with _locked(final, wait_s) as lock:  # released when the file closes
        if (final / marker).is_file():  # another process built it while we waited
            return False
        lock.truncate(0)
        lock.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.ctime()}\n")
        lock.flush()
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        try:
            build(tmp)
            if not (tmp / marker).is_file():
                raise RuntimeError(f"build of {final.name} finished without writing {marker}")
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    return True


def build_holder(final: Path) -> str | None:
    """Who is building ``final`` now (the lock file's ``pid ... since ...``), None if nobody."""
    path = lock_path(final)
    if not path.is_file():
        return None
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            return lock.read().strip() or "another process"
    return None


def wait_for_build(final: Path, wait_s: float = BUILD_WAIT_S) -> None:
    """Return once nobody builds ``final`` (at once when nobody does). Raises
    :class:`TimeoutError` after ``wait_s``, :class:`BuildWaitStopped` on SIGINT or SIGTERM."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with _locked(final, wait_s):
        pass


@contextlib.contextmanager
def _locked(final: Path, wait_s: float) -> Iterator[IO[str]]:
    """The entry's lock file, held exclusively (waiting for a holder: module text)."""
    path = lock_path(final)
    with open(path, "a+") as lock:  # not "w": the holder's line stays for the waiters
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _wait(lock, path, final, wait_s)
        yield lock


def _wait(lock: IO[str], path: Path, final: Path, wait_s: float) -> None:
    lock.seek(0)
    holder = lock.read().strip() or "another process"
    started = time.monotonic()
    with _stop_signals() as stopped:  # before the message: a signal may follow it at once
        log.warning(
            "waiting for the build of %s by %s (lock %s; up to %.0f min; Ctrl-C stops waiting)",
            final.name, holder, path, wait_s / 60,
        )  # fmt: skip
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass
            else:
                log.info("the build of %s is done (waited %.0f s)", final.name,
                         time.monotonic() - started)  # fmt: skip
                return
            if stopped:
                name = signal.Signals(stopped[0]).name
                raise BuildWaitStopped(
                    f"stopped by {name} while waiting for the build of {final.name} by {holder}"
                )
            waited = time.monotonic() - started
            if waited > wait_s:
                raise TimeoutError(
                    f"waited {waited:.0f}s for the build of {final} by {holder} (lock {path}); "
                    "it is still running: wait for it to finish or stop that process, then retry"
                )
            time.sleep(POLL_S)


@contextlib.contextmanager
def _stop_signals() -> Iterator[list[int]]:
    """While the wait runs, SIGINT and SIGTERM are recorded into the list it yields (then the
    process's own handler, if it is a Python function, runs too: a service's stop event is
    set). Off the main thread Python cannot install handlers: only the timeout ends the wait."""
    stopped: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield stopped
        return
    sigs = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.getsignal(sig) for sig in sigs}

    def on_signal(signum: int, frame: object) -> None:
        stopped.append(signum)
        own = previous[signal.Signals(signum)]
        if callable(own) and own is not signal.default_int_handler:
            own(signum, frame)  # type: ignore[arg-type]

    for sig in sigs:
        signal.signal(sig, on_signal)
    try:
        yield stopped
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
