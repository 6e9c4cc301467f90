"""Shared pytest fixtures and paths for the whole suite (and an environment without stray
trainer-rank variables for every test); puts ``tests/doubles`` (the test doubles ``fakeworker``
and ``tiny_targets``) on sys.path so tests import them by name under --import-mode=importlib."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from longtail_api import rendezvous

REPO = Path(__file__).resolve().parents[1]
DOUBLES = str(REPO / "tests" / "doubles")
if DOUBLES not in sys.path:
    sys.path.insert(0, DOUBLES)
# The trainer-group variables (api/longtail_api/rendezvous.py), and the per-rank ones. vLLM's CPU
# platform writes LOCAL_WORLD_SIZE into os.environ when an engine starts in-process (the vLLM
# tests do that); a trainer process a later test starts would inherit it and refuse a partial
# rendezvous. Every test starts without them; a test that wants them sets them.
_RANK_ENV = (
    rendezvous.MASTER_ADDR, rendezvous.MASTER_PORT, rendezvous.NNODES, rendezvous.NODE_RANK,
    rendezvous.LOCAL_WORLD_SIZE, rendezvous.WORLD_SIZE, rendezvous.RANK, rendezvous.LOCAL_RANK,
)  # fmt: skip
MIN_FREE_TMP = 2 << 30
"""Free bytes the suite needs in the temp directory: its runs and checkpoints take ~1 GB there
(pytest keeps the last three sessions' ``tmp_path`` trees)."""


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop before the first test when the temp directory is nearly full: otherwise every test
    that writes a file errors in setup with ENOSPC and the real cause drowns in the output."""
    tmp = tempfile.gettempdir()
    free = shutil.disk_usage(tmp).free
    if free < MIN_FREE_TMP:
        pytest.exit(
            f"only {free / 2**30:.2f} GiB free in the temp directory {tmp} (the suite needs "
            f"{MIN_FREE_TMP / 2**30:.0f} GiB): free space there or point TMPDIR at a larger disk",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


@pytest.fixture(autouse=True)
def _no_inherited_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _RANK_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def repo() -> Path:
    """The repository root."""
    return REPO
