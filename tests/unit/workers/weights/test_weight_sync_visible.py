"""Weight sync made visible: each rollout worker's load of a policy version, over real HTTP.

Two in-process :class:`RolloutServer` workers around a tiny random Qwen2 pull versions from a
real :class:`WeightServer` through a real :class:`RolloutPool`. A generate call that loads a
new version reports the seconds it spent (``policyLoadSeconds``: the rollout pause it caused)
and the version it holds; a call on a held version reports 0. The trainer's
:class:`SyncBook` turns that and the publisher's phases into the step row's ``sync_*`` figures,
the trainer's Prometheus series (``longtail_weight_sync_*``) and its status's held versions.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch
from prometheus_client import generate_latest
from tiny_targets import tiny_qwen2

from longtail_api.steprow import StepRow
from longtail_api.wirecodec import from_wire, to_wire
from longtail_api.workerapi import TrainerStatus
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.rollout.control import RolloutWorker
from longtail_workers.rollout.http import ControlConfig
from longtail_workers.rollout.service import RolloutServer
from longtail_workers.spot.cycle import RoleConflictError
from longtail_workers.trainer.dispatch import RolloutPool
from longtail_workers.trainer.service import TrainerMetrics
from longtail_workers.trainer.syncbook import SyncBook
from longtail_workers.weights.http_sync import HttpWeightClient, WeightServer
from longtail_workers.weights.store import publish_state_dict
from longtail_workers.weights.sync import SyncPhases
from longtail_workers.wire.rollout import GenerateCall


@pytest.fixture
def workers(weights: WeightServer) -> Iterator[list[RolloutServer]]:
    torch.set_num_threads(1)
    out = []
    for i in range(2):
        engine = TorchEngine(tiny_qwen2(seed=5, vocab_size=32, hidden_size=32))
        worker = RolloutWorker(
            engine, target_id="tiny", name=f"rollout-{i}", training=None,
            weights=HttpWeightClient(weights.url, retries=1, backoff_s=0.01),
        )  # fmt: skip
        out.append(RolloutServer(worker, ControlConfig(port=0)).start())
    yield out
    for s in out:
        s.stop(grace_s=0.5)


def requests(n: int) -> list[GenerationRequest]:
    return [GenerationRequest([1, 2, i % 5], 4, seed=i, request_id=f"r{i}") for i in range(n)]


def row(step: int) -> StepRow:
    return StepRow(step=step, policy_version=step, drafter_version=-1, reward_mean=0.0,
                   accuracy=0.0, rollout_s=1.0, tail_s=0.0, train_s=1.0, step_s=2.0)  # fmt: skip


def test_a_loaded_version_is_booked_per_phase_in_the_row_metrics_and_status(
    workers: list[RolloutServer], weights: WeightServer
) -> None:
    state = workers[0].worker.engine.target.model.state_dict()
    manifest = publish_state_dict(weights.store, 1, {k: v + 0.25 for k, v in state.items()})
    book = SyncBook()
    # The publisher's split of its 0.5 s (what ``manifest.phases`` carries once it times them).
    book.published(1, 0.5, SyncPhases("http", gather_s=0.125, pack_s=0.25, bytes=manifest.size))
    pool = RolloutPool({s.worker.name: s.url for s in workers}, timeout_s=60)

    first = pool.run(requests(4), step=1, policy_version=1, stop=threading.Event())
    loads = {r.worker: r.engine.policy_load_seconds for r in first.replies}
    assert set(loads) == {"rollout-0", "rollout-1"} and all(s > 0 for s in loads.values())
    assert {r.policy_version for r in first.replies} == {1}
    book.replied(first.replies)
    again = pool.run(requests(4), step=1, policy_version=1, stop=threading.Event())
    assert all(r.engine.policy_load_seconds == 0.0 for r in again.replies)  # held: no pause
    book.replied(again.replies)  # a held version's 0 does not overwrite the load

    r = row(2)
    book.fill(r, 1)
    slowest = max(loads.values())
    assert (r.sync_version, r.sync_transport, r.sync_bytes) == (1, "http", manifest.size)
    assert (r.sync_gather_s, r.sync_pack_s, r.sync_wire_s) == (0.125, 0.25, 0.0)
    assert r.sync_load_s == slowest and r.worker_load_s == dict(sorted(loads.items()))
    assert r.sync_pause_s == pytest.approx(0.5 + slowest)
    assert r.sync_gb_per_s == pytest.approx(manifest.size / (0.5 + slowest) / 1e9)
    assert StepRow.from_dict(r.to_dict()) == r

    metrics = TrainerMetrics()
    metrics.observe(r)
    text = generate_latest(metrics.registry).decode()
    for phase in ("gather", "pack", "wire", "load", "pause"):
        assert f'longtail_weight_sync_seconds_count{{phase="{phase}",transport="http"}} 1.0' in text
    assert f'longtail_weight_sync_bytes{{transport="http"}} {float(manifest.size)}' in text
    assert 'longtail_weight_sync_bytes_per_second{transport="http"}' in text

    held = book.held_versions()
    assert held == {"rollout-0": 1, "rollout-1": 1}
    status = TrainerStatus(1, 3, "running", 2, -1, worker_policy_versions=held)
    assert to_wire(status)["workerPolicyVersions"] == held
    assert from_wire(TrainerStatus, to_wire(status), "status").worker_policy_versions == held


def test_a_version_nobody_loaded_yet_has_the_trainers_side_only() -> None:
    book = SyncBook()
    book.published(3, 0.75, None)  # a publisher that does not time its phases
    r = row(4)
    book.fill(r, 3)
    assert r.sync_version == 3 and r.sync_pause_s == 0.75 and r.sync_load_s is None
    assert r.sync_transport is None and r.sync_gb_per_s is None and r.worker_load_s == {}
    untouched = row(5)
    book.fill(untouched, 9)  # never published by this trainer process
    assert untouched == row(5)
    text = generate_latest(_observed(r).registry).decode()
    assert 'longtail_weight_sync_seconds_count{phase="pause",transport="unknown"} 1.0' in text
    assert 'phase="load"' not in text  # not measured: no sample, rather than a made-up 0


def _observed(r: StepRow) -> TrainerMetrics:
    metrics = TrainerMetrics()
    metrics.observe(r)
    return metrics


def test_a_malformed_held_version_map_is_refused_naming_the_key() -> None:
    body = to_wire(TrainerStatus(1, 3, "running", 2, -1))
    body["workerPolicyVersions"] = {"rollout-0": "2"}
    named = r"status\.workerPolicyVersions\.rollout-0: must be an integer, got .2."
    with pytest.raises(ValueError, match=named):
        from_wire(TrainerStatus, body, "status")


def test_a_load_before_a_refused_call_is_reported_by_the_retried_call(
    workers: list[RolloutServer], weights: WeightServer
) -> None:
    """A worker harvested between loading the called version and generating refuses the call
    (409); the trainer retries, and that reply must still carry the load's pause (once)."""
    worker = workers[0].worker
    state = worker.engine.target.model.state_dict()
    publish_state_dict(weights.store, 1, {k: v + 0.25 for k, v in state.items()})
    real, calls = worker.generate, []

    def harvested_once(reqs, *, step=None):  # type: ignore[no-untyped-def]
        calls.append(step)
        if len(calls) == 1:
            raise RoleConflictError("worker rollout-0 is assigned 'drafter-train'")
        return real(reqs, step=step)

    worker.generate = harvested_once  # type: ignore[method-assign]
    call = GenerateCall(step=1, policy_version=1, requests=requests(2))
    with pytest.raises(RoleConflictError):
        worker.generate_call(call)
    assert worker.policy_version == 1  # loaded before the refusal
    assert worker.generate_call(call).engine.policy_load_seconds > 0
    assert worker.generate_call(call).engine.policy_load_seconds == 0.0  # reported once
