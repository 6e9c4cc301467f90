"""The trainer reports a rollout as active only once its workers are marked busy.

The harvest loop (operator or ``longtail run``'s coordinator) harvests a worker that is idle with
no pending work while the trainer says its rollout is active. The trainer used to set
``rollout_active`` before its pool had handed out a shard, so a poll landing in between saw the
rollout active and every worker idle and unmarked. Now :meth:`RolloutPool.run` calls
``started`` once the first shards are out (each worker holding one marked through
``on_assign``), and the driver turns the rollout active there. Real rollout servers around a
tiny random Qwen2 for the pool; the driver with a pool double that looks at its state.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tiny_targets import tiny_qwen2

from longtail_workers.data.records import Example
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.jobspec import load_job_spec
from longtail_workers.models.tokenizer import build_char_tokenizer
from longtail_workers.rollout.control import RolloutWorker
from longtail_workers.rollout.http import ControlConfig
from longtail_workers.rollout.service import RolloutServer
from longtail_workers.trainer.dispatch import RolloutOutcome, RolloutPool
from longtail_workers.trainer.driver import DriverConfig, StepDriver
from longtail_workers.weights.store import WeightStore
from longtail_workers.wire.rollout import Sample

REPO = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def servers(model: torch.nn.Module) -> Iterator[list[RolloutServer]]:
    started = []
    for i in range(2):
        worker = RolloutWorker(
            TorchEngine(model), target_id="tiny", name=f"rollout-{i}", weights=None
        )
        started.append(RolloutServer(worker, ControlConfig(port=0)).start())
    yield started
    for srv in started:
        srv.stop(grace_s=0.5)


def test_the_pool_says_started_once_every_worker_with_a_shard_is_marked(servers) -> None:
    pending: set[str] = set()
    seen_at_start: list[set[str]] = []

    def on_assign(name: str, busy: bool) -> None:
        (pending.add if busy else pending.discard)(name)

    urls = {f"rollout-{i}": srv.url for i, srv in enumerate(servers)}
    pool = RolloutPool(urls, timeout_s=30.0, on_assign=on_assign)
    requests = [GenerationRequest([1, 2, 3], 4, request_id=f"r{i}") for i in range(4)]
    out = pool.run(
        requests, step=1, policy_version=0, stop=threading.Event(), group=2,
        started=lambda: seen_at_start.append(set(pending)),
    )  # fmt: skip
    assert len(out.samples) == 4
    assert seen_at_start == [{"rollout-0", "rollout-1"}]  # once, both already marked
    assert pending == set()  # and released when their calls ended


class LookingPool:
    """A pool double that answers at once and records the trainer's state as the pool sees it."""

    def __init__(self) -> None:
        self.driver: StepDriver | None = None
        self.seen: list[tuple[str, bool]] = []

    def revive(self) -> None:
        """Every worker is always up here: nothing to health-check."""

    def run(self, requests: list[Any], step: int, version: int, stop: threading.Event,
            group: int = 1, started: Any = None) -> RolloutOutcome:  # fmt: skip
        assert self.driver is not None
        self.seen.append(("before shards", self.driver.state.rollout_active))
        self.driver.state.pending_workers.add("rollout-0")  # what on_assign does
        assert started is not None, "the driver must let the pool say when shards are out"
        started()
        self.seen.append(("after shards", self.driver.state.rollout_active))
        samples = [Sample(r.request_id, list(r.prompt_token_ids), [50, 51], [-1.0, -1.2])
                   for r in requests]  # fmt: skip
        return RolloutOutcome(samples, [], 0.01, 0.01)


def test_the_driver_turns_the_rollout_active_only_when_the_pool_says_so(tmp_path: Path) -> None:
    torch.manual_seed(0)
    spec = load_job_spec(str(REPO / "tests" / "e2e_local" / "ci-tiny.yaml"))
    spec = dataclasses.replace(
        spec, algorithm=dataclasses.replace(spec.algorithm, total_steps=1, kl_coef=0.0)
    )
    tok = build_char_tokenizer()
    train = [Example(f"What is {i} plus one? Answer:", str(i + 1), i) for i in range(8)]
    verifier = SimpleNamespace(verify=lambda pairs, **_: SimpleNamespace(results=[
        SimpleNamespace(reward=float(i % 2), correct=bool(i % 2)) for i in range(len(pairs))
    ]))  # fmt: skip
    pool = LookingPool()
    config = DriverConfig(run_dir=tmp_path, checkpoint_dir=tmp_path / "checkpoints")
    driver = StepDriver(spec, tiny_qwen2(vocab_size=len(tok)), tok, train, [], pool,  # type: ignore[arg-type]
                        verifier, WeightStore(keep_last=2), config)  # type: ignore[arg-type]  # fmt: skip
    pool.driver = driver
    assert driver.run(0) == "complete"
    assert pool.seen == [("before shards", False), ("after shards", True)]
    assert not driver.state.rollout_active and not driver.state.pending_workers  # step over
