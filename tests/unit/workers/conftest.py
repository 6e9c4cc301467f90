"""Worker-test helpers: puts this directory on sys.path so helper modules (``lossless.py``)
import by name under --import-mode=importlib, and holds the fixtures several worker-test modules
share: ``model``, the tiny policy the drafter-window tests (``test_trainer_harvest.py``,
``test_drafter_worker.py``) train on (a module that defines its own ``model`` overrides it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    """A tiny random Qwen2 policy (seed 5, vocabulary 32) with sharp next-token distributions."""
    from tiny_targets import tiny_qwen2

    torch.set_num_threads(1)
    return tiny_qwen2(seed=5, vocab_size=32, hidden_size=32, intermediate_size=64, sharpness=8.0)
