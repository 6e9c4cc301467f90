"""The rollout worker's control surface over real HTTP: status, role switches, 409s, metrics."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from httpcall import http

from longtail_api.policies import DrafterTrainingSpec
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.rollout.control import RolloutWorker
from longtail_workers.rollout.http import ControlConfig, ControlServer

SPEC = DrafterTrainingSpec(learning_rate=1e-3, window_tokens=16, max_steps_per_window=100_000)


# conftest.py's ``target`` fixture builds this policy
TARGET = dict(seed=5, vocab_size=32, hidden_size=32, intermediate_size=64)


@pytest.fixture
def served(target) -> Iterator[tuple[RolloutWorker, ControlServer]]:
    worker = RolloutWorker(TorchEngine(target), target_id="tiny-ctl", name="w0", training=SPEC)
    with ControlServer(worker, ControlConfig(port=0)) as server:
        yield worker, server
    if worker.trainer is not None:
        worker.trainer.stop(timeout=5.0)


def call(server: ControlServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    status, headers, raw = http(server.url + path, method, data)
    return status, json.loads(raw) if headers[
        "Content-Type"
    ] == "application/json" else raw.decode()


def put_role(server: ControlServer, role: Any) -> tuple[int, Any]:
    return call(server, "PUT", "/v1/role", {"role": role})


def generate(worker: RolloutWorker, n: int = 4) -> None:
    worker.generate([GenerationRequest([1, 2, i], max_new_tokens=20, seed=i) for i in range(n)])


def test_health_status_and_errors(served) -> None:
    _, server = served
    assert call(server, "GET", "/healthz") == (200, "ok\n")
    assert call(server, "GET", "/readyz") == (200, "ready\n")
    status, body = call(server, "GET", "/v1/status")
    assert status == 200 and body["worker"] == "w0" and body["state"] == "idle"
    assert body["role"]["observed"] == "rollout" and body["idleSince"] is not None
    assert body["versions"] == {"policy": 0, "drafter": -1, "step": 0}
    assert body["buffer"]["tokens"] == 0 and body["trainer"]["state"] == "idle"
    assert call(server, "GET", "/nope")[0] == 404
    assert call(server, "POST", "/v1/role", {"role": "rollout"})[0] == 405
    for bad, field in (
        (b"{not json", "malformed JSON"),
        (b"[1]", "JSON object"),
        (json.dumps({"rol": "rollout"}).encode(), "rol: is not a known field"),
        (json.dumps({}).encode(), "role: is required"),
        (json.dumps({"role": 5}).encode(), "unknown activity"),
        (json.dumps({"role": "fly"}).encode(), "unknown activity"),
    ):
        status, body = call(server, "PUT", "/v1/role", bad)
        assert status == 400 and field in body["error"], (bad, body)
    status, body = put_role(server, "train")  # a real activity, but not a rollout worker's
    assert status == 409 and "cannot take 'train'" in body["error"]


def test_drafter_train_is_refused_before_any_data(served) -> None:
    worker, server = served
    status, body = put_role(server, "drafter-train")
    assert status == 409 and "no rollout data captured yet" in body["error"]
    assert worker.status().role.observed == "rollout"


def test_drafter_train_is_refused_while_generating(served) -> None:
    worker, server = served
    generate(worker)  # data exists now; only the ongoing generation blocks the switch
    inside, release = threading.Event(), threading.Event()
    real = worker.engine.generate

    def slow_generate(requests):  # holds the worker in "generating" until released
        inside.set()
        assert release.wait(10.0)
        return real(requests)

    worker.engine.generate = slow_generate  # type: ignore[method-assign]
    thread = threading.Thread(target=generate, args=(worker,))
    thread.start()
    try:
        assert inside.wait(10.0)
        assert call(server, "GET", "/v1/status")[1]["state"] == "generating"
        status, body = put_role(server, "drafter-train")
        assert status == 409 and "is generating" in body["error"]
    finally:
        release.set()
        thread.join(10.0)
    assert call(server, "GET", "/v1/status")[1]["state"] == "idle"


def test_role_round_trip_over_http(served) -> None:
    worker, server = served
    generate(worker)
    status, body = put_role(server, "drafter-train")
    assert status == 200, body
    ack = body["role"]
    assert ack["desired"] == ack["observed"] == "drafter-train" and not ack["pending"]
    assert ack["switchSeconds"] < 2.0
    assert put_role(server, "drafter-train")[0] == 200  # idempotent
    status, body = call(server, "GET", "/v1/status")
    assert body["role"]["observed"] == "drafter-train" and body["trainer"]["state"] == "training"
    assert body["state"] == "training" and body["buffer"]["tokens"] > 0
    deadline = time.monotonic() + 10.0
    while worker.trainer is not None and worker.trainer.total_steps < 1:
        assert time.monotonic() < deadline, "the trainer took no step in 10 s"
        time.sleep(0.005)

    status, body = put_role(server, "rollout")
    assert status == 200 and body["role"]["observed"] == "rollout", body
    assert body["role"]["switchSeconds"] < 2.0
    status, body = call(server, "GET", "/v1/status")
    assert body["trainer"]["state"] == "idle" and body["trainer"]["totalSteps"] >= 1
    assert worker.trainer is not None and worker.trainer.last_window.stop_reason == "requested"
    generate(worker)  # rollout works again

    status, metrics = call(server, "GET", "/metrics")
    assert status == 200
    assert 'longtail_worker_role{role="rollout"} 1.0' in metrics
    assert 'longtail_worker_role{role="drafter-train"} 0.0' in metrics
    assert "longtail_spot_train_steps_total" in metrics
    assert 'longtail_spot_trainer_state{state="idle"} 1.0' in metrics
    assert 'longtail_worker_control_requests_total{code="409",endpoint="/v1/role"}' not in metrics
    assert 'longtail_worker_control_requests_total{code="200",endpoint="/v1/role"} 3.0' in metrics
    assert 'longtail_worker_role_switch_seconds_count{role="drafter-train"} 2.0' in metrics


def test_worker_builds_its_drafter_in_the_spec_layout(target) -> None:
    spec = dataclasses.replace(SPEC, layout="eagle1")
    worker = RolloutWorker(TorchEngine(target), target_id="tiny-ctl", training=spec)
    assert worker.trainer is not None
    drafter = worker.trainer.drafter_copy()
    assert drafter.fc.bias is None and not drafter.input_norm
