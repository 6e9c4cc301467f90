"""The RL loop's rollout side over real HTTP: generate calls, policy versions, dispatch, harvest.

In-process :class:`RolloutServer` instances around a tiny random Qwen2 (real engine, real
spot trainer), a real :class:`WeightServer` for policy versions, a real :class:`TrainerApp`
status surface for the coordinator. Covers: the wire format round trip; a generate call loads
exactly the version it names (and refuses one that was never published); the pool spreads
requests, keeps request order and re-dispatches a dead worker's shard; the coordinator harvests
an idle worker with the shared ``decide`` and hands it back when the rollout ends, submitting
its drafter candidate, which the pool's bounded wait before the merge sees.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tiny_targets import tiny_qwen2

from longtail_api.policies import DrafterTrainingSpec, HarvestSpec
from longtail_api.wirecodec import from_wire, to_wire
from longtail_workers.drafter.registry import DrafterRegistry
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.local.coordinator import Coordinator
from longtail_workers.rollout.control import RolloutWorker
from longtail_workers.rollout.http import ControlConfig
from longtail_workers.rollout.service import RolloutServer
from longtail_workers.shards import shard_round_robin
from longtail_workers.trainer.dispatch import RolloutFailed, RolloutPool
from longtail_workers.trainer.driver import DriverState
from longtail_workers.trainer.service import TrainerApp
from longtail_workers.trainer.syncbook import SyncBook
from longtail_workers.weights.http_sync import HttpWeightClient, WeightServer
from longtail_workers.weights.store import publish_state_dict
from longtail_workers.wire.rollout import EngineDelta, GenerateCall, GenerateReply, Sample

SPEC = DrafterTrainingSpec(learning_rate=1e-3, window_tokens=16, max_steps_per_window=100_000)


def model() -> torch.nn.Module:
    torch.set_num_threads(1)
    return tiny_qwen2(seed=5, vocab_size=32, hidden_size=32, intermediate_size=64)


def reqs(n: int, max_new: int = 12) -> list[GenerationRequest]:
    return [GenerationRequest([1, 2, i % 7], max_new, seed=i, request_id=f"r{i}") for i in range(n)]


@pytest.fixture
def servers(weights: WeightServer, tmp_path: Path) -> Iterator[list[RolloutServer]]:
    registry = DrafterRegistry(tmp_path / "drafters")
    out = []
    for i in range(2):
        engine = TorchEngine(model())
        worker = RolloutWorker(
            engine, target_id="tiny", name=f"rollout-{i}", training=SPEC,
            registry=registry, weights=HttpWeightClient(weights.url, retries=1, backoff_s=0.01),
        )  # fmt: skip
        out.append(RolloutServer(worker, ControlConfig(port=0)).start())
    yield out
    for s in out:
        s.stop(grace_s=0.5)
        if s.worker.trainer is not None:
            s.worker.trainer.stop(timeout=5.0)


def test_wire_round_trip() -> None:
    call = GenerateCall(3, 7, reqs(2))
    back = from_wire(GenerateCall, json.loads(json.dumps(to_wire(call))), "body")
    assert back.step == 3 and back.policy_version == 7
    assert [r.prompt_token_ids for r in back.requests] == [[1, 2, 0], [1, 2, 1]]
    assert [r.seed for r in back.requests] == [0, 1]
    sample = Sample("a", [1], [4, 5], [-0.5, -0.25], "stop", 1, 2, 1)
    reply = GenerateReply("w", 7, 2, [sample], EngineDelta(tokens=2, policy_load_seconds=0.5))
    assert from_wire(GenerateReply, to_wire(reply), "reply") == reply


def test_shards_are_balanced_round_robin() -> None:
    assert shard_round_robin(5, 2) == [[0, 2, 4], [1, 3]]
    assert shard_round_robin(2, 4) == [[0], [1]]
    assert shard_round_robin(8, 2, group=2) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert shard_round_robin(5, 2, group=2) == [[0, 1, 4], [2, 3]]
    with pytest.raises(ValueError, match="at least one worker"):
        shard_round_robin(3, 0)


def test_generate_loads_the_named_policy_version(servers, weights) -> None:
    worker = servers[0].worker
    changed = {k: v + 0.5 for k, v in worker.engine.target.model.state_dict().items()}
    publish_state_dict(weights.store, 1, changed)
    reply = worker.generate_call(GenerateCall(1, 1, reqs(3)))
    assert reply.policy_version == 1 and worker.policy_version == 1
    assert torch.equal(worker.engine.target.model.state_dict()["lm_head.weight"],
                       changed["lm_head.weight"])  # fmt: skip
    before = {k: v.clone() for k, v in worker.engine.target.model.state_dict().items()}
    pool = RolloutPool({"rollout-0": servers[0].url}, timeout_s=30)
    with pytest.raises(RolloutFailed, match="503"):  # version 9 was never published
        pool.run(reqs(2), step=2, policy_version=9, stop=threading.Event())
    after = worker.engine.target.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing half-loaded


def test_pool_keeps_order_and_redispatches_a_dead_workers_shard(servers, weights) -> None:
    publish_state_dict(weights.store, 0, servers[0].worker.engine.target.model.state_dict())
    pool = RolloutPool({s.worker.name: s.url for s in servers}, timeout_s=30)
    out = pool.run(reqs(6), step=1, policy_version=0, stop=threading.Event())
    assert [s.request_id for s in out.samples] == [f"r{i}" for i in range(6)]
    assert {r.worker for r in out.replies} == {"rollout-0", "rollout-1"}
    assert 0 <= out.first_done_s <= out.seconds
    servers[1].stop(grace_s=0.1)  # the process is gone: connection refused
    out = pool.run(reqs(6), step=2, policy_version=0, stop=threading.Event())
    assert [s.request_id for s in out.samples] == [f"r{i}" for i in range(6)]
    assert out.redispatched == 3 and set(out.failed_workers) == {"rollout-1"}
    assert {r.worker for r in out.replies} == {"rollout-0"}
    servers[0].stop(grace_s=0.1)
    with pytest.raises(RolloutFailed, match="no live rollout worker"):
        pool.run(reqs(2), step=3, policy_version=0, stop=threading.Event())


def test_prompts_reaching_a_harvested_worker_end_its_window(servers, weights) -> None:
    """A re-dispatched shard reaching a worker in drafter-train: the worker ends its window
    itself (candidate submitted) and answers; the pool sends no role change."""
    publish_state_dict(weights.store, 0, servers[0].worker.engine.target.model.state_dict())
    worker = servers[0].worker
    worker.generate(reqs(4, max_new=20))
    assert worker.role.set_role("drafter-train").observed == "drafter-train"
    deadline = time.monotonic() + 30.0
    while worker.trainer is not None and worker.trainer.total_steps < 1:  # something to submit
        assert time.monotonic() < deadline, "the spot trainer took no step in 30 s"
        time.sleep(0.01)
    pool = RolloutPool({"rollout-0": servers[0].url}, timeout_s=30)
    out = pool.run(reqs(3), step=1, policy_version=0, stop=threading.Event())
    assert [s.request_id for s in out.samples] == ["r0", "r1", "r2"]
    role = worker.role.activity()
    assert role.desired == role.observed == "rollout"
    assert worker.registry is not None and worker.registry.candidates(None)


class _Driver:
    def __init__(self) -> None:
        self.state = DriverState(total_steps=5)
        self.syncs = SyncBook()  # the status route reports each worker's held version


def test_coordinator_harvests_idle_worker_and_returns_it(servers, weights) -> None:
    publish_state_dict(weights.store, 0, servers[0].worker.engine.target.model.state_dict())
    for s in servers:
        s.worker.generate(reqs(4, max_new=20))  # captured data: the drafter can train
    app = TrainerApp("127.0.0.1", 0).start()
    driver = _Driver()
    app.driver = driver  # type: ignore[assignment]
    try:
        spec = HarvestSpec(idle_seconds=0.0, poll_period_seconds=0.1)
        coord = Coordinator(spec, app.url, {s.worker.name: s.url for s in servers})
        assert coord.poll_once() == {}  # no rollout in progress: nothing to harvest
        driver.state.rollout_active = True
        driver.state.pending_workers = {"rollout-1"}  # still generating its share
        assert coord.poll_once() == {"rollout-0": "drafter-train"}
        assert coord.trainer == app.status()  # the wire type round-trips the real answer
        assert coord.trainer.pending_workers == ("rollout-1",) and coord.trainer.rollout_active
        assert servers[0].worker.role.activity().observed == "drafter-train"
        assert servers[1].worker.role.activity().observed == "rollout"
        pool = RolloutPool({s.worker.name: s.url for s in servers})
        assert pool.wait_windows_ended(0.3, poll_s=0.1) == ["rollout-0"]  # bounded
        time.sleep(0.3)
        coord.poll_once()
        assert coord.books.harvested_total > 0 and coord.books.idle_total > 0
        driver.state.rollout_active = False
        assert coord.poll_once() == {"rollout-0": "rollout"}  # the loop alone ends the window
        assert servers[0].worker.role.activity().observed == "rollout"
        assert pool.wait_windows_ended(0.3) == []
        registry = servers[0].worker.registry
        assert registry is not None and registry.candidates(None)  # window's drafter submitted
    finally:
        app.stop()
