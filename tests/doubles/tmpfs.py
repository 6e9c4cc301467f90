"""A real small filesystem for tests that need a full disk: a tmpfs of a given size.

Not a double: writes past its size fail with the kernel's ENOSPC, as on a full disk. Mounting
needs root (CAP_SYS_ADMIN); without it the test is skipped with that reason. Used by
``tests/unit/workers/trainer/test_trainer_checkpoint.py`` and ``tests/e2e_local/test_local_run.py``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (``mount``'s syntax: ``700k``, ``8m``) at ``path`` (created),
    yield it, unmount it. Skips the test when it cannot be mounted."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs (needs root): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True, timeout=30)


def resize(path: Path, size: str) -> None:
    """Grow (or shrink) the tmpfs at ``path`` to ``size``, keeping its files: space freed."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True, timeout=30)
