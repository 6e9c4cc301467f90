"""The dedicated drafter worker (``drafter_worker/``) and the window piece it shares with the
trainer's harvest (``spot/sequences.py``).

Real objects throughout: a tiny random Qwen2 policy, the real rollout engine (the answers), the
real ``TrainerApp`` HTTP surface with its drafter exchange over a real ``DrafterRegistry``, the
real ``WeightServer``. Covers: ``StepSamples`` round-trips and refuses malformed answers naming
the field; the trainer's ``GET /v1/samples/latest`` (503 while starting, ``after``, 400); the
shared window captures, trains, gates and submits a named candidate; one drafter-worker turn
loads the step's policy version, trains and sends a candidate the merge publishes; a candidate
whose base was superseded during the window is not sent; an unreachable trainer is a
``TimeoutError`` naming the URL; the worker's ``/readyz`` is 503 once its loop ended or stopping.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from httpcall import http, http_json

from longtail_api.policies import DrafterTrainingSpec
from longtail_api.protocol import ProtocolError
from longtail_api.wirecodec import from_wire, to_wire
from longtail_api.workerapi import DrafterWorkerStatus
from longtail_workers.drafter.exchange import DrafterEndpoints, RemoteDrafterRegistry
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.registry import DrafterRegistry
from longtail_workers.drafter_worker.service import DrafterServer
from longtail_workers.drafter_worker.worker import DrafterWorker, LoopTimes
from longtail_workers.engine.interface import GenerationRequest, GenerationResult
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.spot.sequences import SequenceWindows
from longtail_workers.trainer.driver import DriverState
from longtail_workers.trainer.service import TrainerApp
from longtail_workers.weights.http_sync import HttpWeightClient, WeightServer
from longtail_workers.weights.store import WeightStore, publish_state_dict
from longtail_workers.wire.rollout import Sample
from longtail_workers.wire.samples import (
    SampleFeed,
    StepSamples,
    StepSequence,
    parse_after,
)

SPEC = DrafterTrainingSpec(learning_rate=1e-3, window_tokens=16, max_steps_per_window=4)


@pytest.fixture(scope="module")
def results(model: torch.nn.Module) -> list[GenerationResult]:
    reqs = [GenerationRequest([1, 2, 3][: 1 + i % 3], 12 + 2 * i, seed=i, request_id=f"r{i}")
            for i in range(6)]  # fmt: skip
    return TorchEngine(model).generate(reqs)


def step_samples(results: list[GenerationResult], step: int, version: int) -> StepSamples:
    return StepSamples.of(step, version, [Sample.of(r) for r in results])


# --- the wire type ----------------------------------------------------------------------------


def test_step_samples_round_trip_and_after(results) -> None:
    s = step_samples(results, step=3, version=3)
    back = from_wire(StepSamples, json.loads(json.dumps(to_wire(s))), "body")
    assert back == s and len(back.sequences) == 6 and back.sequences[0].request_id == "r0"
    assert s.after(None) is s and s.after(2) is s
    assert s.after(3) == StepSamples(3, 3) and s.after(7).sequences == ()
    assert parse_after("after=4") == 4 and parse_after("") is None
    with pytest.raises(ProtocolError, match="after='-1'"):
        parse_after("after=-1")


def one(seq: dict[str, Any]) -> dict[str, Any]:
    """A samples answer holding one sequence."""
    return {"step": 1, "policyVersion": 1, "sequences": [seq]}


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ([], "body: must be a mapping"),
        ({"step": 1, "sequences": []}, "body.policyVersion: is required"),
        ({"step": -1, "policyVersion": 0, "sequences": []}, "body.step: must be >= 0"),
        (one({"promptTokenIds": [], "outputTokenIds": [1]}),
         r"body.sequences\[0\].promptTokenIds: must have at least 1 item"),
        (one({"promptTokenIds": [1], "outputTokenIds": [1.5]}),
         r"body.sequences\[0\].outputTokenIds\[0\]: must be an integer"),
        (one({"id": 3, "promptTokenIds": [1], "outputTokenIds": []}),
         r"body.sequences\[0\].id: must be a string"),
    ],
)  # fmt: skip
def test_malformed_step_samples_are_refused_naming_the_field(body: Any, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        from_wire(StepSamples, body, "body")


# --- the trainer's endpoint -------------------------------------------------------------------


class _Driver:
    def __init__(self) -> None:
        self.state = DriverState(total_steps=5)
        self.latest_samples: StepSamples | None = None


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[TrainerApp]:
    app = TrainerApp("127.0.0.1", 0).start()
    registry = DrafterRegistry(tmp_path / "drafters")
    app.drafters = DrafterEndpoints(registry, policy_version=lambda: 3)  # the samples' version
    yield app
    app.stop()


def test_trainer_serves_the_last_steps_samples(trainer: TrainerApp, results) -> None:
    code, body = http_json(trainer.url + "/v1/samples/latest")
    assert code == 503 and "starting" in body["error"]
    driver = _Driver()
    trainer.driver = driver  # type: ignore[assignment]
    code, body = http_json(trainer.url + "/v1/samples/latest")
    assert code == 200 and from_wire(StepSamples, body, "body") == StepSamples(0, 0)
    driver.latest_samples = step_samples(results, step=2, version=2)
    code, body = http_json(trainer.url + "/v1/samples/latest?after=1")
    assert code == 200 and from_wire(StepSamples, body, "body") == driver.latest_samples
    code, body = http_json(trainer.url + "/v1/samples/latest?after=2")
    assert code == 200 and body["step"] == 2 and body["sequences"] == []
    code, body = http_json(trainer.url + "/v1/samples/latest?after=two")
    assert code == 400 and "after='two'" in body["error"]


# --- the shared window and the drafter worker -------------------------------------------------


def windows_on(model: torch.nn.Module, registry: Any) -> SequenceWindows:
    drafter = EagleDrafter(model, target_id="tiny").eval()
    return SequenceWindows(model, drafter, registry, target_id="tiny", training=SPEC,
                           capture_batch=2, capture_tokens=40)  # fmt: skip


def test_shared_window_captures_trains_and_submits(model, results, tmp_path) -> None:
    registry = DrafterRegistry(tmp_path / "drafters")
    w = windows_on(model, registry)
    assert w.cycle.submit("drafter-0", 1, "test") is None  # nothing trained yet
    seqs = [StepSequence(r.request_id, tuple(r.prompt_token_ids), tuple(r.output_token_ids))
            for r in results]  # fmt: skip
    w.set_samples(seqs, step=4)
    assert w.pending == 6
    assert w.capture(policy_version=7) == 6 and w.pending == 0
    stored = w.buffer.snapshot().sequences
    assert {(s.policy_version, s.step) for s in stored} == {(7, 4)}
    assert w.cycle.sync_base() is None and w.start() == SPEC.max_steps_per_window
    assert w.spot.wait_stopped(60.0)
    cand = w.cycle.submit("drafter-0", 1, "test")  # few held-out pairs: the gate keeps it
    assert cand is not None and cand.worker == "drafter-0" and cand.policy_version == 7
    assert cand.tokens > 0 and [c.worker for c in registry.candidates(None)] == ["drafter-0"]
    assert w.cycle.submit("drafter-0", 1, "test") is None  # nothing new since


@pytest.fixture
def weights(model: torch.nn.Module) -> Iterator[WeightServer]:
    server = WeightServer(WeightStore(), "127.0.0.1", 0).start()
    publish_state_dict(
        server.store, 3, {k: v.detach().clone() for k, v in model.state_dict().items()}
    )
    yield server
    server.stop()


def worker_on(model, trainer: TrainerApp, weights: WeightServer) -> DrafterWorker:
    remote = RemoteDrafterRegistry(trainer.url, retries=0)
    feed = SampleFeed(trainer.url, poll_s=0.05)
    source = HttpWeightClient(weights.url, retries=0)
    return DrafterWorker(windows_on(model, remote), feed, source, name="drafter-0",
                         times=LoopTimes(step_wait_s=5.0, window_s=60.0))  # fmt: skip


def test_a_turn_trains_on_the_new_step_and_its_candidate_is_merged(
    model, results, trainer, weights
) -> None:
    driver = _Driver()
    driver.latest_samples = step_samples(results, step=3, version=3)
    trainer.driver = driver  # type: ignore[assignment]
    worker = worker_on(model, trainer, weights)
    cand = worker.turn()  # few held-out pairs: the gate keeps the window (WindowVerdict.keep)
    assert cand is not None and cand.worker == "drafter-0" and cand.policy_version == 3
    assert worker.step == 3 and worker.policy_version == 3
    status = worker.status()  # the body of GET /v1/status survives JSON both ways
    assert status.outcomes["submitted"] == 1 and status.last_candidate is not None
    assert (
        from_wire(DrafterWorkerStatus, json.loads(json.dumps(to_wire(status))), "status") == status
    )
    registry = trainer.drafters.registry  # type: ignore[union-attr]
    published = registry.merge_candidates(model, target_id="tiny")
    assert published is not None and published.meta.merged_from == ("drafter-0",)
    # No newer step: the next wait ends without a window.
    worker.times = LoopTimes(step_wait_s=0.2)
    assert worker.turn() is None and worker.windows_run == 1


def test_a_candidate_whose_base_was_superseded_is_not_sent(model, results, trainer, weights):
    driver = _Driver()
    trainer.driver = driver  # type: ignore[assignment]
    worker = worker_on(model, trainer, weights)
    registry = trainer.drafters.registry  # type: ignore[union-attr]
    registry.publish(EagleDrafter(model, target_id="tiny"), policy_version=0)  # a merge meanwhile
    assert worker._submit(base=None, policy_version=3) is None
    assert worker.outcomes["stale"] == 1 and registry.candidates(0) == []


def test_an_unreachable_trainer_is_a_timeout_naming_the_url() -> None:
    feed = SampleFeed("http://127.0.0.1:9", poll_s=0.05, max_backoff_s=0.1)
    with pytest.raises(TimeoutError, match=r"127.0.0.1:9/v1/samples/latest.*--trainer-url"):
        feed.wait_newer(0, timeout_s=0.3, stop=threading.Event())
    assert feed.last_error is not None


def test_the_workers_readyz_is_503_once_its_loop_ended_or_while_stopping(
    model, trainer, weights
) -> None:
    worker = worker_on(model, trainer, weights)
    with DrafterServer(worker, "127.0.0.1", 0) as server:
        assert http(server.url + "/readyz")[::2] == (200, b"ready\n")
        assert http_json(server.url + "/v1/status")[0] == 200
        code, body = http_json(server.url + "/v1/role")  # not this worker's: the route table's 404
        assert code == 404 and "/v1/status" in body["error"]
        worker.fatal = "drafter training crashed: boom"
        worker.stop.set()  # what the loop does when it crashes
        assert http(server.url + "/readyz")[::2] == (503, b"drafter training crashed: boom\n")
        worker.fatal = None  # asked to stop
        assert http(server.url + "/readyz")[::2] == (503, b"stopping\n")
