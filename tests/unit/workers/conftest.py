"""Worker-test helpers: puts this directory and its group folders (the tests grouped by the
package they test: ``engine/``, ``weights/``, ...) on sys.path so helper modules
(``lossless.py``, ``helpers.py``) and a test module reused by another import by name under
--import-mode=importlib, and holds the fixtures several
worker-test modules share: ``model``, the tiny policy the drafter-window tests
(``test_trainer_drafter_window.py``, ``test_drafter_worker.py``) train on, and ``target``, the
policy drafters are fitted and trusted on, which a module sizes with a ``TARGET`` dict of
``tiny_qwen2`` keywords, then ``trainer`` and ``weights`` (a module that defines its own
fixture of one of these names overrides it)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

_HERE = Path(__file__).resolve().parent
# The tests are grouped by the package they test (engine/, weights/, ...); a test module that
# reuses another's fixtures or helpers imports it by name, wherever it sits.
for _path in (_HERE, *sorted(p for p in _HERE.iterdir() if p.is_dir() and p.name[0] != "_")):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


_SET_NUM_THREADS = torch.set_num_threads


@pytest.fixture(scope="module", autouse=True)
def _torch_set_num_threads_restored() -> Iterator[None]:
    """torch's own ``set_num_threads`` back after each module: vLLM's CPU worker replaces it
    with a no-op in the process that builds an engine (``vllm/v1/worker/cpu_worker.py``, after
    it binds its threads), so a module that ran an in-process vLLM engine would leave every
    later module's thread settings silently ignored."""
    yield
    torch.set_num_threads = _SET_NUM_THREADS


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    """A tiny random Qwen2 policy (seed 5, vocabulary 32) with sharp next-token distributions."""
    from tiny_targets import tiny_qwen2

    torch.set_num_threads(1)
    return tiny_qwen2(seed=5, vocab_size=32, hidden_size=32, intermediate_size=64, sharpness=8.0)


@pytest.fixture(scope="module")
def target(request: pytest.FixtureRequest) -> torch.nn.Module:
    """A tiny random Qwen2 policy built with the test module's ``TARGET`` (``tiny_qwen2``'s
    keywords: seed, sizes, sharpness, dtype); by default seed 0, vocabulary 48 and very sharp
    next-token distributions, so a drafter can learn it in a few steps."""
    from tiny_targets import tiny_qwen2

    torch.set_num_threads(1)
    default = {"seed": 0, "vocab_size": 48, "sharpness": 30.0}
    return tiny_qwen2(**getattr(request.module, "TARGET", default))


@pytest.fixture
def weights() -> Iterator[Any]:
    """A started weight server (loopback, any port) over a store that keeps the last three
    versions (``publish_state_dict(weights.store, ...)`` publishes into it)."""
    from longtail_workers.weights.http_sync import WeightServer
    from longtail_workers.weights.store import WeightStore

    with WeightServer(WeightStore(keep_last=3), port=0) as server:
        yield server


@pytest.fixture
def trainer(target, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """A started trainer (app, registry) whose registry checks drafter candidates against the
    job's drafter on ``target``, bound to the test module's ``TID``."""
    from helpers import started_trainer

    with started_trainer(target, tmp_path, request.module.TID) as started:
        yield started
