"""Faults of issue #21, item 4: a generate call's values are a configuration error, not a crash.

A real :class:`RolloutServer` around a tiny random Qwen2 (512 positions, vocabulary 32) answers
value errors with 400 and a JSON error naming the request and the field, NaN and infinities
included (they used to answer 500, or 200 with NaN log-probs for temperature NaN); the trainer's
:class:`RolloutPool` then fails the rollout with the worker's message and marks no worker down
(it used to declare both workers dead). The job-level checks name ``spec.algorithm.maxNewTokens``
and the fix: at trainer start with the longest prompt, and before anything starts
(``longtail validate``, ``longtail run``) when the model's context is known without loading it.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from httpcall import http_json

from longtail_api.context import BUILTIN_MODEL_POSITIONS, model_positions, spec_context_error
from longtail_workers.data import Example
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.jobspec import load_job_spec
from longtail_workers.models.builtin import TinyRecipe
from longtail_workers.rollout.control import RolloutWorker
from longtail_workers.rollout.http import ControlConfig
from longtail_workers.rollout.service import RolloutServer
from longtail_workers.trainer.dispatch import RolloutPool, RolloutRejected
from longtail_workers.trainer.setup import check_context
from longtail_workers.wire.rollout import GENERATE_PATH

REPO = Path(__file__).resolve().parents[4]
GOOD = {"id": "r0", "promptTokenIds": [1, 2, 3], "maxNewTokens": 4, "temperature": 1.0}


@pytest.fixture(scope="module")
def server(model: torch.nn.Module) -> Iterator[RolloutServer]:
    worker = RolloutWorker(TorchEngine(model), target_id="tiny", name="rollout-0", weights=None)
    srv = RolloutServer(worker, ControlConfig(port=0)).start()
    yield srv
    srv.stop(grace_s=0.5)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"promptTokenIds": []}, "promptTokenIds"),
        ({"promptTokenIds": [1, 99]}, "promptTokenIds"),
        ({"maxNewTokens": 0}, "maxNewTokens"),
        ({"maxNewTokens": -5}, "maxNewTokens"),
        ({"maxNewTokens": 600}, "maxNewTokens"),  # 3 + 600 > 512 positions
        ({"temperature": -1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"topP": 2}, "topP"),
        ({"topP": float("nan")}, "topP"),
    ],
)
def test_value_errors_answer_400_naming_the_field(server, change, field: str) -> None:
    body = json.dumps({"step": 1, "policyVersion": 0, "requests": [GOOD, {**GOOD, **change}]})
    # json.dumps writes NaN / Infinity as JS does
    status, answer = http_json(server.url + GENERATE_PATH, "POST", body.encode(), timeout=30.0)
    assert status == 400, answer
    assert f"body.requests[1].{field}: " in str(answer["error"]), answer


def test_the_pool_fails_the_rollout_with_the_workers_message_and_keeps_it(server) -> None:
    pool = RolloutPool({"rollout-0": server.url, "rollout-1": server.url}, timeout_s=30.0)
    requests = [GenerationRequest([1, 2, 3], 600, request_id=f"r{i}") for i in range(4)]
    with pytest.raises(RolloutRejected) as err:
        pool.run(requests, step=1, policy_version=0, stop=threading.Event())
    text = str(err.value)
    assert "maxNewTokens" in text and "max_position_embeddings (512)" in text
    assert "configuration error" in text and "spec.algorithm" in text
    assert pool.down == {}  # nobody declared dead for a config mistake


class CharTokenizer:
    """Test double: one token per character, no chat template."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % 32 for c in text]


def test_trainer_start_names_max_new_tokens_and_the_fix() -> None:
    spec = load_job_spec(REPO / "examples" / "01-tiny-arith.yaml")
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=100))
    examples = [Example("x" * 30, "1", 0), Example("y" * 40, "2", 1)]
    spec.algorithm = dataclasses.replace(spec.algorithm, max_new_tokens=60)
    check_context(spec, model, CharTokenizer(), examples)  # 40 + 60 fits exactly
    spec.algorithm = dataclasses.replace(spec.algorithm, max_new_tokens=61)
    with pytest.raises(ValueError, match=r"spec\.algorithm\.maxNewTokens") as err:
        check_context(spec, model, CharTokenizer(), examples)
    assert "longest prompt (40 tokens)" in str(err.value) and "at most 60" in str(err.value)


def test_context_known_without_loading_the_model(tmp_path: Path) -> None:
    assert BUILTIN_MODEL_POSITIONS["builtin:tiny"] == TinyRecipe().max_position_embeddings
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    assert model_positions(str(tmp_path)) == 64
    assert model_positions(str(tmp_path / "not-here")) is None
    spec = load_job_spec(REPO / "examples" / "01-tiny-arith.yaml")
    assert spec_context_error(spec) is None
    spec.algorithm = dataclasses.replace(spec.algorithm, max_new_tokens=4000)
    error = spec_context_error(spec)
    assert error is not None and error.path == "spec.algorithm.maxNewTokens"
    assert "max_position_embeddings 2048" in str(error) and "at most 2047" in str(error)
