"""Shared pytest fixtures and paths for the whole suite (and an environment without stray
trainer-rank variables for every test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from longtail_api import rendezvous

REPO = Path(__file__).resolve().parents[1]
# The trainer-group variables (api/longtail_api/rendezvous.py), and the per-rank ones. vLLM's CPU
# platform writes LOCAL_WORLD_SIZE into os.environ when an engine starts in-process (the vLLM
# tests do that); a trainer process a later test starts would inherit it and refuse a partial
# rendezvous. Every test starts without them; a test that wants them sets them.
_RANK_ENV = (
    rendezvous.MASTER_ADDR, rendezvous.MASTER_PORT, rendezvous.NNODES, rendezvous.NODE_RANK,
    rendezvous.LOCAL_WORLD_SIZE, rendezvous.WORLD_SIZE, rendezvous.RANK, rendezvous.LOCAL_RANK,
)  # fmt: skip


@pytest.fixture(autouse=True)
def _no_inherited_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _RANK_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def repo() -> Path:
    """The repository root."""
    return REPO
