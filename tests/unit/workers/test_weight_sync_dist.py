"""Policy weight sync by gloo broadcast between two real processes on loopback.

Kept apart from ``test_weight_sync.py`` so the spawned processes import only torch and this
module (no transformers): process start-up is most of this test's time.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from longtail_workers.weights import dist_sync
from longtail_workers.weights.checksum import state_dict_checksum
from longtail_workers.weights.dist_sync import (
    DistWeightPublisher,
    DistWeightReceiver,
    WeightSyncLostRankError,
)
from longtail_workers.weights.sync import WeightIntegrityError, WeightVersionError


class TinyLM(nn.Module):
    """Tied embedding/head plus bf16, int and bool tensors: every byte path of the broadcast."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(16, 8)
        self.proj = nn.Linear(8, 8).to(torch.bfloat16)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight  # tied, as in small Qwen2 models
        self.register_buffer("steps", torch.tensor(seed, dtype=torch.int64))
        self.register_buffer("flags", torch.rand(5) > 0.5)


def checksum_of(seed: int) -> str:
    return state_dict_checksum(TinyLM(seed).state_dict())


def _worker(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=30),  # neither init nor a collective can hang
    )
    try:
        if rank == 0:
            _publish_all()
        else:
            Path(out).write_text(json.dumps(_receive_all()))
    finally:
        dist.destroy_process_group()


def _publish_all() -> None:
    pub = DistWeightPublisher()
    pub.publish(1, TinyLM(1).state_dict())
    real = dist_sync.sha256_hex
    dist_sync.sha256_hex = lambda data: "0" * 64  # advertise a wrong checksum for version 2
    try:
        pub.publish(2, TinyLM(5).state_dict())
    finally:
        dist_sync.sha256_hex = real
    pub.publish(3, TinyLM(6).state_dict())
    pub.publish(4, TinyLM(7).state_dict())


def _receive_all() -> dict[str, Any]:
    rollout = TinyLM(2)
    recv = DistWeightReceiver()
    report: dict[str, Any] = {"v1": recv.load_into(rollout)}
    report["v1_equal"] = state_dict_checksum(rollout.state_dict()) == checksum_of(1)
    report["v1_tied"] = rollout.head.weight is rollout.embed.weight
    try:
        recv.load_into(rollout)
    except WeightIntegrityError as exc:
        report["integrity"] = [exc.version, exc.expected, exc.actual]
    report["kept_v1"] = state_dict_checksum(rollout.state_dict()) == checksum_of(1)
    version, sd = recv.fetch(3)  # still in lockstep with the sender after the failure
    report["v3"] = [version, state_dict_checksum(sd) == checksum_of(6)]
    try:
        recv.fetch(99)
    except WeightVersionError as exc:
        report["mismatch"] = [exc.requested, exc.received]
    return report


def test_gloo_broadcast_round_trip_and_checksum_failure(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spawned children unpickle _worker by module name (tests.unit.workers....); pytest's
    # importlib mode does not put the repository root on sys.path, and spawn copies sys.path.
    monkeypatch.syspath_prepend(str(repo))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    out = tmp_path / "rank1.json"
    ctx = mp.spawn(_worker, args=(2, port, str(out)), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 90
    while not ctx.join(timeout=1):  # raises ProcessRaisedException if a rank failed
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail("gloo weight-sync processes did not finish within 90 s")
    report = json.loads(out.read_text())
    assert report["v1"] == 1 and report["v1_equal"] and report["v1_tied"]
    version, expected, actual = report["integrity"]
    assert version == 2 and expected == "0" * 64 and actual != expected
    assert report["kept_v1"]  # the failed version left the model on version 1, whole
    assert report["v3"] == [3, True]
    assert report["mismatch"] == [99, 4]


def test_publisher_needs_an_initialised_process_group() -> None:
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistWeightPublisher()


def _lost_rank_worker(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=30),
    )
    if rank == 1:
        DistWeightReceiver().fetch(1)
        os._exit(0)  # a rollout worker killed after version 1: no goodbye to the group
    pub = DistWeightPublisher()
    pub.publish(1, TinyLM(1).state_dict())
    started = time.monotonic()
    try:
        pub.publish(2, TinyLM(2).state_dict())
        report: dict[str, Any] = {"raised": None}
    except WeightSyncLostRankError as exc:
        report = {"raised": str(exc), "version": exc.version}
    report["seconds"] = time.monotonic() - started
    Path(out).write_text(json.dumps(report))
    # The group has a dead member: tearing it down at interpreter exit can abort in gloo's
    # destructors ("terminate called without an active exception"); the report is written.
    os._exit(0)


def test_a_lost_rank_fails_the_publish_with_a_message_that_says_how_to_go_on(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(repo))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    out = tmp_path / "rank0.json"
    ctx = mp.spawn(
        _lost_rank_worker, args=(2, port, str(out)), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 90
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail("gloo processes did not finish within 90 s")
    report = json.loads(out.read_text())
    assert report["raised"] is not None, "publishing to a dead rank did not fail"
    assert report["version"] == 2
    assert "--resume" in report["raised"] and "--weight-sync http" in report["raised"]
    assert report["seconds"] < 40  # failed, not hung (the group timeout is 30 s)
