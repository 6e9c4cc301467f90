"""The shared worker wire types read what the real rollout worker serves, and reject bad bodies.

The parser is exercised against a real ``ControlServer`` (tiny torch model, real HTTP), so a
change of the worker's ``GET /v1/status`` or ``PUT /v1/role`` body breaks this test rather than
the operator in production.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from httpcall import http_json

from longtail_api import workerapi
from longtail_api.drafterstatus import (
    AcceptanceStats,
    BufferStats,
    DrafterTrainingStatus,
    SpotTrainerStatus,
)
from longtail_api.protocol import ProtocolError
from longtail_api.wirecodec import from_wire, to_wire
from longtail_api.workerapi import (
    CandidateSummary,
    CheckpointAnswer,
    DrafterWorkerStatus,
    RoleAnswer,
    RoleRequest,
    RolloutWorkerStatus,
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
    from longtail_workers.engine.native.torch_engine import TorchEngine
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


def test_real_worker_status_and_role_round_trip(server: Any) -> None:
    _, raw = http_json(server.url + workerapi.STATUS_PATH)
    status = from_wire(RolloutWorkerStatus, raw, "status")
    assert to_wire(status) == raw  # nothing dropped, nothing renamed
    assert status.worker == "w7" and status.state == "idle" and not status.generating
    assert status.role.observed == "rollout" and status.versions.drafter == -1
    assert status.idle_seconds is not None and status.buffer.tokens > 0

    role = json.dumps(to_wire(RoleRequest("drafter-train"))).encode()
    code, raw_ack = http_json(server.url + workerapi.ROLE_PATH, "PUT", role)
    ack = from_wire(RoleAnswer, raw_ack, "response")
    assert code in (200, 202) and to_wire(ack) == raw_ack
    assert ack.worker == "w7" and ack.role.desired == "drafter-train"
    code, raw_ack = http_json(server.url + workerapi.ROLE_PATH, "PUT", b'{"role": "rollout"}')
    back = from_wire(RoleAnswer, raw_ack, "response")
    assert back.role.desired == "rollout" and back.role.pending == (code == 202)


def test_status_errors_name_the_field() -> None:
    with pytest.raises(ProtocolError, match=r"status\.worker: is required"):
        from_wire(RolloutWorkerStatus, {}, "status")
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
    assert from_wire(RolloutWorkerStatus, good, "status").mean_accepted_length == 3.25
    bad = json.loads(json.dumps(good))
    bad["role"]["observed"] = "dance"
    with pytest.raises(ProtocolError, match=r"status\.role\.observed: must be one of"):
        from_wire(RolloutWorkerStatus, bad, "status")
    bad = {**good, "running": -1}
    with pytest.raises(ProtocolError, match=r"status\.running: must be >= 0, got -1"):
        from_wire(RolloutWorkerStatus, bad, "status")
    with pytest.raises(ProtocolError, match=r"request\.role: must be one of"):
        from_wire(RoleRequest, {"role": "fly"}, "request")
    typed = from_wire(RolloutWorkerStatus, good, "status")
    assert typed.acceptance.by_drafter_version[2] == AcceptanceStats(4, 4, 12, 9)
    assert from_wire(RolloutWorkerStatus, to_wire(typed), "status") == typed
    bad = json.loads(json.dumps(good))
    bad["acceptance"]["byDrafterVersion"]["2"]["specSteps"] = -1
    with pytest.raises(ProtocolError, match=r"status\.acceptance\.byDrafterVersion\.2\.specSteps"):
        from_wire(RolloutWorkerStatus, bad, "status")


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
    assert from_wire(TrainerStatus, to_wire(status), "status") == status
    minimal = {
        "step": 0,
        "totalSteps": 5,
        "phase": "running",
        "policyVersion": 0,
        "drafterVersion": -1,
    }
    parsed = from_wire(TrainerStatus, minimal, "status")
    assert parsed.reward_mean is None and parsed.step_seconds is None and parsed.message == ""
    with pytest.raises(ProtocolError, match=r"status\.phase: must be one of"):
        from_wire(TrainerStatus, {**minimal, "phase": "exploded"}, "status")
    with pytest.raises(ProtocolError, match=r"status\.accuracy: must be <= 1, got 3"):
        from_wire(TrainerStatus, {**minimal, "accuracy": 3}, "status")
    with pytest.raises(ProtocolError, match=r"stepSeconds\.tail: is required"):
        from_wire(TrainerStatus, {**minimal, "stepSeconds": {"rollout": 1, "train": 1}}, "status")
    harvested = dataclasses.replace(
        status,
        rollout_active=True,
        role=workerapi.RoleState("train", "drafter-train", 1700000000.0),
        idle_since=1700000000.0,
        idle_seconds=3.5,
        harvested_seconds=12.0,
        drafter_training=TRAINING,
    )
    assert from_wire(TrainerStatus, to_wire(harvested), "status") == harvested
    assert parsed.role is None and parsed.idle_seconds is None and parsed.harvested_seconds == 0
    with pytest.raises(ProtocolError, match=r"status\.role\.observed: must be one of"):
        from_wire(TrainerStatus, {**minimal, "role": {"desired": "train", "observed": "x",
                                                     "since": 0}}, "status")  # fmt: skip
    with pytest.raises(ProtocolError, match=r"status\.idleSeconds: must be >= 0"):
        from_wire(TrainerStatus, {**minimal, "idleSeconds": -1}, "status")
    answer = CheckpointAnswer(step=4, location="/checkpoints/step-4")
    assert from_wire(CheckpointAnswer, to_wire(answer), "response") == answer


def test_drafter_worker_status_round_trip_and_checks() -> None:
    status = DrafterWorkerStatus(
        worker="drafter-0", state="training", step=3, policy_version=3, drafter_base_version=None,
        windows=2, outcomes={"submitted": 1, "dropped": 0, "stale": 1, "empty": 0},
        last_candidate=CandidateSummary(None, tokens=120, steps=7), last_error=None,
        drafter_training=TRAINING,
    )  # fmt: skip
    raw = json.loads(json.dumps(to_wire(status)))
    assert raw["role"] == "drafter" and from_wire(DrafterWorkerStatus, raw, "status") == status
    with pytest.raises(ProtocolError, match=r"status\.lastCandidate\.tokens: is required"):
        from_wire(DrafterWorkerStatus, {**raw, "lastCandidate": {"steps": 1}}, "status")
    with pytest.raises(ProtocolError, match=r"status\.outcomes\.submitted: must be >= 0"):
        from_wire(DrafterWorkerStatus, {**raw, "outcomes": {"submitted": -1}}, "status")
    with pytest.raises(ProtocolError, match=r"status\.state: must be one of"):
        from_wire(DrafterWorkerStatus, {**raw, "state": "dreaming"}, "status")
    bad = json.loads(json.dumps(raw))
    bad["drafterTraining"]["buffer"]["tokens"] = "many"
    with pytest.raises(ProtocolError, match=r"status\.drafterTraining\.buffer\.tokens: must be an"):
        from_wire(DrafterWorkerStatus, bad, "status")
    bad["drafterTraining"] = {**raw["drafterTraining"], "trainer": {"state": "dozing"}}
    with pytest.raises(ProtocolError, match=r"status\.drafterTraining\.trainer\.state: must be"):
        from_wire(DrafterWorkerStatus, bad, "status")
    diverged = json.loads(json.dumps(raw).replace('"lastLoss": 2.5', '"lastLoss": NaN'))
    assert math.isnan(
        from_wire(DrafterWorkerStatus, diverged, "status").drafter_training.trainer.last_loss
    )
