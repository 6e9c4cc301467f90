"""The trainer's own drafter training while it waits for a rollout (``trainer/drafter_window.py``).

Real objects throughout: a tiny random Qwen2 policy, the real rollout engine (for the capture
it must reproduce), a real ``RolloutBuffer``, ``SpotTrainer`` and ``DrafterRegistry``, the real
``TrainerApp`` HTTP surface and the real local ``Coordinator``. Covers: the hidden states the
trainer computes equal what the engine captures for the same answers, and the buffer holds the
same pairs; a window refuses outside a rollout and before any data, trains, stops before the
policy update and submits its drafter as candidate ``trainer``, which the merge publishes;
``PUT /v1/role`` on the trainer answers 200/409/400 and ``GET /v1/status`` reports the role,
idleness and harvested seconds; the coordinator includes the trainer only when it is eligible.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from httpcall import http_json

from longtail_api.policies import DrafterTrainingSpec, HarvestSpec
from longtail_api.steprow import StepRow
from longtail_api.wirecodec import from_wire
from longtail_api.workerapi import RoleAnswer, TrainerStatus
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.registry import DrafterRegistry
from longtail_workers.engine.interface import GenerationRequest, GenerationResult
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.engine.target import response_states
from longtail_workers.local.coordinator import Coordinator
from longtail_workers.spot.buffer import RolloutBuffer
from longtail_workers.spot.cycle import RoleConflictError
from longtail_workers.spot.sequences import SequenceWindows
from longtail_workers.trainer.drafter_window import TrainerHarvestee
from longtail_workers.trainer.driver import DriverState
from longtail_workers.trainer.service import TrainerApp
from longtail_workers.trainer.syncbook import SyncBook
from longtail_workers.wire.rollout import Sample

SPEC = DrafterTrainingSpec(learning_rate=1e-3, window_tokens=16, max_steps_per_window=100_000)


@pytest.fixture(scope="module")
def results(model: torch.nn.Module) -> list[GenerationResult]:
    engine = TorchEngine(model)
    reqs = [
        GenerationRequest([1, 2, 3 + i][: 1 + i % 3], 10 + 3 * i, seed=i,
                          return_hidden_states=True, request_id=f"r{i}")
        for i in range(5)
    ]  # fmt: skip
    return engine.generate(reqs)


def samples(results: list[GenerationResult]) -> list[Sample]:
    return [Sample.of(r) for r in results]  # what the trainer gets back over HTTP


def harvest_on(model: torch.nn.Module, tmp_path: Path, **kwargs: Any) -> TrainerHarvestee:
    drafter = EagleDrafter(model, target_id="tiny").eval()
    registry = DrafterRegistry(tmp_path / "drafters")
    windows = SequenceWindows(model, drafter, registry, target_id="tiny", training=SPEC, **kwargs)
    return TrainerHarvestee(windows)


def wait_until(cond: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_hidden_states_equal_what_the_engine_captures(model, results) -> None:
    seqs = [(r.prompt_token_ids, r.output_token_ids) for r in results]
    states = response_states(model, seqs)
    for r, h in zip(results, states, strict=True):
        assert r.hidden_states is not None and h.shape == r.hidden_states.shape
        torch.testing.assert_close(h, r.hidden_states, rtol=1e-4, atol=1e-5)
    # Off by one position (the classic pairing bug) is far from it: the check can fail.
    first = results[0]
    p = len(first.prompt_token_ids)
    row = torch.tensor([[*first.prompt_token_ids, *first.output_token_ids]])
    shifted = model.get_decoder()(input_ids=row).last_hidden_state[0, p : p + 3]
    assert not torch.allclose(shifted, first.hidden_states[:3], atol=1e-3)


def test_buffer_holds_the_pairs_a_worker_captures(model, results, tmp_path) -> None:
    worker_buffer = RolloutBuffer(10_000, 1 << 30)
    worker_buffer.add_results(results, policy_version=3, step=2)
    h = harvest_on(model, tmp_path, capture_batch=3, capture_tokens=40)  # several batches
    h.set_samples(samples(results), step=2)
    h.begin_rollout(policy_version=3)
    h.role.set_role("drafter-train")
    wait_until(lambda: h.windows.captured_sequences == len(results))
    h.end_rollout()
    mine = sorted(h.windows.buffer.snapshot().sequences, key=lambda s: s.request_id or "")
    theirs = sorted(worker_buffer.snapshot().sequences, key=lambda s: s.request_id or "")
    assert [s.request_id for s in mine] == [s.request_id for s in theirs] and len(mine) == 5
    for a, b in zip(mine, theirs, strict=True):
        assert torch.equal(a.tokens, b.tokens) and a.start_position == b.start_position
        assert (a.policy_version, a.step) == (b.policy_version, b.step) == (3, 2)
        torch.testing.assert_close(a.hidden, b.hidden, rtol=1e-4, atol=1e-5)


def test_window_trains_stops_and_submits_a_trainer_candidate(model, results, tmp_path) -> None:
    h = harvest_on(model, tmp_path)
    with pytest.raises(RoleConflictError, match="cannot take 'rollout'"):
        h.role.set_role("rollout")
    h.begin_rollout(policy_version=1)
    with pytest.raises(RoleConflictError, match="nothing to train on yet"):
        h.role.set_role("drafter-train")  # the first rollout: no step completed yet
    assert h.end_rollout() == 0.0
    h.set_samples(samples(results), step=1)
    with pytest.raises(RoleConflictError, match="not waiting for a rollout"):
        h.role.set_role("drafter-train")  # between rollouts: the policy is being updated
    h.begin_rollout(policy_version=2)
    ack = h.role.set_role("drafter-train")
    assert (ack.desired, ack.observed, ack.pending) == ("drafter-train", "drafter-train", False)
    wait_until(lambda: h.windows.spot.total_steps >= 3)
    assert h.role.activity().observed == "drafter-train" and h.role.harvested_seconds > 0
    seconds = h.end_rollout()  # before the policy update: stopped, candidate submitted
    assert seconds > 0 and h.windows.spot.state == "idle" and h.role.activity().observed == "train"
    steps = h.windows.spot.total_steps
    time.sleep(0.1)
    assert h.windows.spot.total_steps == steps  # really stopped
    (cand,) = h.registry.candidates(None)
    assert cand.worker == "trainer" and cand.tokens > 0 and cand.policy_version == 2
    published = h.registry.merge_candidates(model, target_id="tiny")
    assert published is not None and published.meta.merged_from == ("trainer",)
    # The next window starts from the merged version.
    h.set_samples(samples(results), step=2)
    h.begin_rollout(policy_version=3)
    h.role.set_role("drafter-train")
    wait_until(lambda: h.windows.spot.base_version == published.version)
    assert h.role.set_role("train").observed == "train"  # a switch back mid-rollout submits too
    assert [c.worker for c in h.registry.candidates(published.version)] == ["trainer"]
    h.end_rollout()


class _Driver:
    def __init__(self) -> None:
        self.state = DriverState(total_steps=5)
        self.syncs = SyncBook()  # the status route reports each worker's held version


@pytest.fixture
def app(model: torch.nn.Module, tmp_path: Path) -> Iterator[TrainerApp]:
    server = TrainerApp("127.0.0.1", 0).start()
    server.driver = _Driver()  # type: ignore[assignment]
    server.harvest = harvest_on(model, tmp_path)
    yield server
    server.harvest.close()
    server.stop()


def put_role(url: str, body: bytes) -> tuple[int, Any]:
    return http_json(url + "/v1/role", "PUT", body)


def status(url: str) -> TrainerStatus:
    code, body = http_json(url + "/v1/status")
    assert code == 200, body
    return from_wire(TrainerStatus, body, "status")


def start_rollout(app: TrainerApp, harvest: TrainerHarvestee) -> None:
    harvest.begin_rollout(policy_version=1)
    st = app.driver.state  # type: ignore[union-attr]
    st.rollout_active, st.rollout_started = True, time.time()


def end_rollout(app: TrainerApp, harvest: TrainerHarvestee) -> None:
    st = app.driver.state  # type: ignore[union-attr]
    st.rollout_active, st.rollout_started = False, None
    harvest.end_rollout()


def test_trainer_role_over_http(app: TrainerApp, results) -> None:
    harvest = app.harvest
    assert harvest is not None
    code, body = put_role(app.url, b'{"role": "drafter-train"}')
    assert code == 409 and "not waiting for a rollout" in body["error"]
    code, body = put_role(app.url, b"{nope")  # the body checks: test_rollout_http.py
    assert code == 400 and "malformed JSON" in body["error"], body
    code, body = put_role(app.url, b'{"role": "train"}')
    assert code == 200 and from_wire(RoleAnswer, body, "response").role.observed == "train"
    before = status(app.url)
    assert before.role is not None and before.role.observed == "train"
    assert before.idle_seconds is None and before.drafter_training is not None
    harvest.set_samples(samples(results), step=1)
    start_rollout(app, harvest)
    time.sleep(0.05)
    code, body = put_role(app.url, b'{"role": "drafter-train"}')
    answer = from_wire(RoleAnswer, body, "response")
    assert code == 200 and answer.worker == "trainer" and answer.role.observed == "drafter-train"
    wait_until(lambda: harvest.windows.spot.total_steps > 0)
    now = status(app.url)
    assert now.role is not None and now.role.observed == "drafter-train"
    assert now.rollout_active and now.idle_seconds is not None and now.idle_seconds > 0
    assert now.harvested_seconds > 0
    end_rollout(app, harvest)
    after = status(app.url)
    assert after.role is not None and after.role.observed == "train"
    assert after.idle_seconds is None and after.harvested_seconds >= now.harvested_seconds


def test_trainer_without_harvest_answers_train_only() -> None:
    server = TrainerApp("127.0.0.1", 0).start()
    try:
        code, body = put_role(server.url, b'{"role": "train"}')
        assert code == 200 and from_wire(RoleAnswer, body, "response").role.observed == "train"
        code, body = put_role(server.url, b'{"role": "drafter-train"}')
        assert code == 409 and "trainer harvesting is off" in body["error"]
        code, body = put_role(server.url, b'{"role": "rollout"}')
        assert code == 409 and "cannot take 'rollout'" in body["error"]
        st = status(server.url)
        assert st.role is not None and st.role.observed == "train" and st.harvested_seconds == 0
    finally:
        server.stop()


@pytest.mark.parametrize("eligible", [["rollout"], ["rollout", "trainer"]])
def test_coordinator_harvests_the_trainer_only_when_eligible(app, results, eligible) -> None:
    harvest = app.harvest
    assert harvest is not None
    harvest.set_samples(samples(results), step=1)
    spec = HarvestSpec(idle_seconds=0.0, poll_period_seconds=0.1, eligible_roles=eligible)
    coord = Coordinator(spec, app.url, {})
    assert coord.poll_once() == {}  # no rollout in progress
    start_rollout(app, harvest)
    if "trainer" not in eligible:
        assert coord.poll_once() == {} and harvest.role.activity().observed == "train"
        assert not coord.books.trainer_tracked
        end_rollout(app, harvest)
        return
    assert coord.poll_once() == {"trainer": "drafter-train"}
    assert harvest.role.activity().observed == "drafter-train"
    time.sleep(0.2)
    coord.poll_once()
    assert coord.books.trainer_harvested_total > 0 and coord.books.harvested_total == 0
    end_rollout(app, harvest)  # the driver ends the window itself before the policy update
    assert coord.poll_once() == {"trainer": "train"}  # the books follow; acknowledged at once
    assert coord.assigned["trainer"] == "train"
    assert [c.worker for c in harvest.registry.candidates(None)] == ["trainer"]


def _step_row(step: int, **extra: float) -> StepRow:
    """A driver metrics row (what ``TrainerMetrics.observe`` reads)."""
    row: dict[str, Any] = {"step": step, "step_s": 2.0, "rollout_s": 1.0, "tail_s": 0.25}
    row.update(train_s=0.5, sync_s=0.1, reward_mean=0.5, accuracy=0.5, policy_version=step)
    return StepRow.from_dict({**row, "drafter_version": -1, **extra})


def test_trainer_metrics_count_harvested_seconds() -> None:
    from prometheus_client import generate_latest

    from longtail_workers.trainer.service import TrainerMetrics

    metrics = TrainerMetrics()
    metrics.observe(_step_row(1))  # harvest off: no trainer_harvested_s in the row
    metrics.observe(_step_row(2, trainer_harvested_s=1.5))
    metrics.observe(_step_row(3, trainer_harvested_s=0.25))
    harvested = metrics.registry.get_sample_value("longtail_trainer_harvested_seconds_total")
    assert harvested == pytest.approx(1.75)
    assert b"longtail_trainer_harvested_seconds_total 1.75" in generate_latest(metrics.registry)
