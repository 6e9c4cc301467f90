"""The shared worker wire types read what the real rollout worker serves, and reject bad bodies.

The parser is exercised against a real ``ControlServer`` (tiny torch model, real HTTP), so a
change of the worker's ``GET /v1/status`` or ``PUT /v1/role`` body breaks this test rather than
the operator in production.
"""

from __future__ import annotations

import dataclasses
import json
import math
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from longtail_api import workerapi
from longtail_api.protocol import ProtocolError
from longtail_api.workerapi import (
    AcceptanceStats,
    BufferStats,
    CandidateSummary,
    CheckpointAnswer,
    DrafterTrainingStatus,
    DrafterWorkerStatus,
    RoleAnswer,
    RoleRequest,
    RolloutWorkerStatus,
    SpotTrainerStatus,
    TrainerStatus,
)

TRAINING = DrafterTrainingStatus(
    BufferStats(120, 4096, 3, 1000, 1 << 20, (2, 3), (2, 3), {"stale_step": 1}, {}),
    SpotTrainerStatus("training", 3, 8, 40, 960, 2.5, 1, None, rejected_windows=1),
    pending_sequences=2,
    captured_sequences=9,
)


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    torch = pytest.importorskip("torch")
    from tiny_targets import tiny_qwen2

    from longtail_api.policies import DrafterTrainingSpec
    from longtail_workers.engine.interface import GenerationRequest
    from longtail_workers.engine.torch_engine import TorchEngine
    from longtail_workers.rollout import http
    from longtail_workers.rollout.control import RolloutWorker

    torch.set_num_threads(1)
    model = tiny_qwen2(seed=5, vocab_size=32, hidden_size=32, intermediate_size=64)
    spec = DrafterTrainingSpec(learning_rate=1e-3, window_tokens=16, max_steps_per_window=5)
    worker = RolloutWorker(TorchEngine(model), target_id="t", name="w7", training=spec)
    worker.generate([GenerationRequest([1, 2, i], max_new_tokens=12, seed=i) for i in range(3)])
    assert http.STATUS_PATH == workerapi.STATUS_PATH and http.ROLE_PATH == workerapi.ROLE_PATH
    assert http.ControlConfig().port == workerapi.ROLLOUT_PORT
    with http.ControlServer(worker, http.ControlConfig(port=0)) as srv:
        yield srv
    if worker.trainer is not None:
        worker.trainer.stop(timeout=5.0)


def _call(url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, json.loads(resp.read())


def test_real_worker_status_and_role_round_trip(server: Any) -> None:
    _, raw = _call(server.url + workerapi.STATUS_PATH)
    status = RolloutWorkerStatus.from_dict(raw)
    assert status.to_dict() == raw  # nothing dropped, nothing renamed
    assert status.worker == "w7" and status.state == "idle" and not status.generating
    assert status.role.observed == "rollout" and status.versions.drafter == -1
    assert status.idle_seconds is not None and status.buffer.tokens > 0

    code, raw_ack = _call(
        server.url + workerapi.ROLE_PATH, "PUT", RoleRequest("drafter-train").to_dict()
    )
    ack = RoleAnswer.from_dict(raw_ack)
    assert code in (200, 202) and ack.to_dict() == raw_ack
    assert ack.worker == "w7" and ack.role.desired == "drafter-train"
    code, raw_ack = _call(server.url + workerapi.ROLE_PATH, "PUT", {"role": "rollout"})
    back = RoleAnswer.from_dict(raw_ack)
    assert back.role.desired == "rollout" and back.role.pending == (code == 202)


def test_status_errors_name_the_field() -> None:
    with pytest.raises(ProtocolError, match=r"status\.worker: is required"):
        RolloutWorkerStatus.from_dict({})
    good = {
        "worker": "w",
        "state": "idle",
        "role": {"desired": "rollout", "observed": "rollout", "since": 1.0},
        "generating": False,
        "running": 0,
        "waiting": 0,
        "idleSince": 1.0,
        "idleSeconds": 3.5,
        "versions": {"policy": 1, "drafter": 2, "step": 3},
        "acceptance": {
            "byPolicyVersion": {},
            "byDrafterVersion": {
                "2": dict(sequences=4, specSteps=4, draftedTokens=12, acceptedTokens=9)
            },
        },
        "futureField": "ignored: newer workers may add fields",
    }
    assert RolloutWorkerStatus.from_dict(good).mean_accepted_length == 3.25
    bad = json.loads(json.dumps(good))
    bad["role"]["observed"] = "dance"
    with pytest.raises(ProtocolError, match=r"status\.role\.observed: must be an activity"):
        RolloutWorkerStatus.from_dict(bad)
    bad = {**good, "running": -1}
    with pytest.raises(ProtocolError, match=r"status\.running: must be >= 0, got -1"):
        RolloutWorkerStatus.from_dict(bad)
    with pytest.raises(ProtocolError, match="role: must be an activity"):
        RoleRequest.from_dict({"role": "fly"})
    typed = RolloutWorkerStatus.from_dict(good)
    assert typed.acceptance.by_drafter_version[2] == AcceptanceStats(4, 4, 12, 9)
    assert RolloutWorkerStatus.from_dict(typed.to_dict()) == typed
    bad = json.loads(json.dumps(good))
    bad["acceptance"]["byDrafterVersion"]["2"]["specSteps"] = -1
    with pytest.raises(ProtocolError, match=r"status\.acceptance\.byDrafterVersion\.2\.specSteps"):
        RolloutWorkerStatus.from_dict(bad)


def test_trainer_status_round_trip_and_checks() -> None:
    status = TrainerStatus(
        step=4,
        total_steps=20,
        phase="running",
        policy_version=4,
        drafter_version=2,
        reward_mean=0.31,
        accuracy=0.25,
        accepted_length=3.1,
        last_checkpoint_step=0,
        step_seconds=workerapi.StepSeconds(rollout=10.0, tail=6.0, train=2.0),
        figures_step=3,  # step 4 trained, its figures not yet complete
    )
    assert TrainerStatus.from_dict(status.to_dict()) == status
    minimal = {
        "step": 0,
        "totalSteps": 5,
        "phase": "running",
        "policyVersion": 0,
        "drafterVersion": -1,
    }
    parsed = TrainerStatus.from_dict(minimal)
    assert parsed.reward_mean is None and parsed.step_seconds is None and parsed.message == ""
    with pytest.raises(ProtocolError, match=r"status\.phase: must be one of"):
        TrainerStatus.from_dict({**minimal, "phase": "exploded"})
    with pytest.raises(ProtocolError, match=r"status\.accuracy: must be in \[0, 1\]"):
        TrainerStatus.from_dict({**minimal, "accuracy": 3})
    with pytest.raises(ProtocolError, match=r"stepSeconds\.tail: is required"):
        TrainerStatus.from_dict({**minimal, "stepSeconds": {"rollout": 1, "train": 1}})
    harvested = dataclasses.replace(
        status,
        rollout_active=True,
        role=workerapi.RoleState("train", "drafter-train", 1700000000.0),
        idle_since=1700000000.0,
        idle_seconds=3.5,
        harvested_seconds=12.0,
        drafter_training=TRAINING,
    )
    assert TrainerStatus.from_dict(harvested.to_dict()) == harvested
    assert parsed.role is None and parsed.idle_seconds is None and parsed.harvested_seconds == 0
    with pytest.raises(ProtocolError, match=r"status\.role\.observed: must be an activity"):
        TrainerStatus.from_dict({**minimal, "role": {"desired": "train", "observed": "x",
                                                     "since": 0}})  # fmt: skip
    with pytest.raises(ProtocolError, match=r"status\.idleSeconds: must be >= 0"):
        TrainerStatus.from_dict({**minimal, "idleSeconds": -1})
    answer = CheckpointAnswer(step=4, location="/checkpoints/step-4")
    assert CheckpointAnswer.from_dict(answer.to_dict()) == answer


def test_drafter_worker_status_round_trip_and_checks() -> None:
    status = DrafterWorkerStatus(
        worker="drafter-0", state="training", step=3, policy_version=3, drafter_base_version=None,
        windows=2, outcomes={"submitted": 1, "dropped": 0, "stale": 1, "empty": 0},
        last_candidate=CandidateSummary(None, tokens=120, steps=7), last_error=None,
        drafter_training=TRAINING,
    )  # fmt: skip
    raw = json.loads(json.dumps(status.to_dict()))
    assert raw["role"] == "drafter" and DrafterWorkerStatus.from_dict(raw) == status
    with pytest.raises(ProtocolError, match=r"status\.lastCandidate\.tokens: is required"):
        DrafterWorkerStatus.from_dict({**raw, "lastCandidate": {"steps": 1}})
    with pytest.raises(ProtocolError, match=r"status\.outcomes: must map outcomes to window"):
        DrafterWorkerStatus.from_dict({**raw, "outcomes": {"submitted": -1}})
    with pytest.raises(ProtocolError, match=r"status\.state: must be one of"):
        DrafterWorkerStatus.from_dict({**raw, "state": "dreaming"})
    bad = json.loads(json.dumps(raw))
    bad["drafterTraining"]["buffer"]["tokens"] = "many"
    with pytest.raises(ProtocolError, match=r"status\.drafterTraining\.buffer\.tokens: must be an"):
        DrafterWorkerStatus.from_dict(bad)
    bad["drafterTraining"] = {**raw["drafterTraining"], "trainer": {"state": "dozing"}}
    with pytest.raises(ProtocolError, match=r"status\.drafterTraining\.trainer\.state: must be"):
        DrafterWorkerStatus.from_dict(bad)
    diverged = json.loads(json.dumps(raw).replace('"lastLoss": 2.5', '"lastLoss": NaN'))
    assert math.isnan(DrafterWorkerStatus.from_dict(diverged).drafter_training.trainer.last_loss)
