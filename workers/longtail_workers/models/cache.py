"""Longtail's build cache: where built-in artefacts live and how each is built exactly once.

``builtin:tiny`` (:mod:`longtail_workers.models.builtin`) and its drafter
(:mod:`longtail_workers.warmstart.builtin`) are built on first use by whichever process needs them
first: in local mode the ``longtail run`` launcher, on a cluster every pod. :func:`build_once` is
the one way to do that safely: concurrent callers serialise on a lock file next to the entry, the
build goes to a temporary directory that is renamed into place only when complete, so a directory
that holds its marker file is always a whole artefact.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from longtail_api.podenv import CACHE_DIR

CACHE_ENV = CACHE_DIR  # named in longtail_api.podenv


def cache_root() -> Path:
    """Root of Longtail's cache: ``$LONGTAIL_CACHE_DIR`` or ``~/.cache/longtail``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "longtail"


def build_once(final: Path, marker: str, build: Callable[[Path], object]) -> bool:
    """Make sure ``final`` holds a complete build; return True if this call built it.

    ``build(tmp)`` writes the artefact into the empty directory ``tmp``, ``marker`` (a file name)
    last. A ``final`` without ``marker`` (left by hand, or by an older layout) is replaced.
    """
    if (final / marker).is_file():
        return False
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (final / marker).is_file():  # another process built it while we waited
            return False
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
