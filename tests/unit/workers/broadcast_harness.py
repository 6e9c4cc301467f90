"""The broadcast tests' harness (``test_weight_sync_broadcast*.py``): a world-1 trainer's
store with its two deliveries (:class:`~longtail_workers.weights.http_sync.WeightServer` and
:class:`~longtail_workers.weights.broadcast.Broadcast`) in the test process, and rollout
workers' weight sides as real processes (``ws_receiver.py``), each stopped by the fixture's
finalizer. Imported by name (``conftest.py`` puts this directory on sys.path)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_targets import tiny_qwen2
from ws_receiver import SHAPE

from longtail_workers.weights.broadcast import Broadcast
from longtail_workers.weights.checksum import state_dict_checksum
from longtail_workers.weights.http_sync import WeightServer
from longtail_workers.weights.membership import attempt_key
from longtail_workers.weights.plan import BroadcastConfig
from longtail_workers.weights.records import Go, decode
from longtail_workers.weights.store import WeightStore

HERE = Path(__file__).resolve().parent
PHASE_TIMEOUT_S = 8.0
BUCKET_BYTES = 4096
"""~21 buckets for the tiny policy's 85 KB: faults land mid-broadcast."""


def policy(version: int) -> dict[str, torch.Tensor]:
    """The state dict the tests publish as ``version`` (seeded by it)."""
    return tiny_qwen2(seed=version, **SHAPE).state_dict()


def expected_sha(version: int) -> str:
    return state_dict_checksum(policy(version))


def go(cluster: Cluster, n: int) -> Go:
    """The trainer's go for attempt ``n``: its members and the group they used."""
    key = attempt_key(n, "go")
    return decode(Go, cluster.broadcast.rendezvous.get(key), key)


class Processes:
    """Test processes (``ws_receiver.py`` receivers, ``ws_trainer.py`` trainers) writing their
    logs and events into ``tmp``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, script: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}.log").open("ab")
        cmd = [sys.executable, str(HERE / script), *args]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def receiver(self, name: str, addr: str, url: str, *extra: str) -> subprocess.Popen[bytes]:
        """Start receiver ``name`` on the rendezvous ``addr`` with HTTP catch-up from ``url``."""
        args = ["--name", name, "--addr", addr, "--weights-url", url, "--out", str(self.tmp)]
        return self.start(name, "ws_receiver.py", *args, *extra)

    def events(self, name: str) -> list[dict[str, Any]]:
        path = self.tmp / f"{name}.jsonl"
        text = path.read_text() if path.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def wait_version(self, name: str, version: int, timeout_s: float = 30.0) -> dict[str, Any]:
        """``name``'s event that it holds ``version`` (fails on a load error or timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for event in self.events(name):
                if "error" in event:
                    pytest.fail(f"{name} failed to load: {event['error']}")
                if event["version"] == version:
                    return event
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{name} did not load version {version} in {timeout_s}s:\n{self.logs()}"
                )
            time.sleep(0.1)

    def want(self, name: str, version: int) -> None:
        """Ask ``name`` to load ``version`` (as the trainer's generate call would)."""
        (self.tmp / f"{name}.want").write_text(str(version))

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.tmp.glob("*.log"))
        )

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


class Cluster(Processes):
    """The trainer's store and its deliveries (in this process) plus the receiver processes
    started so far."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        config = BroadcastConfig(bucket_bytes=BUCKET_BYTES, phase_timeout_s=PHASE_TIMEOUT_S)
        self._start(0, 0, config)

    def _start(self, port: int, http_port: int, config: BroadcastConfig) -> None:
        self.store = WeightStore()
        self.server = WeightServer(self.store, port=http_port).start()
        self.broadcast = Broadcast(port, config)
        self.store.attach(self.broadcast)

    def spawn(self, name: str, *extra: str) -> subprocess.Popen[bytes]:
        addr = f"127.0.0.1:{self.broadcast.port}"
        return self.receiver(name, addr, self.server.url, *extra)

    def wait_live(self, names: list[str], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not set(names) <= set(self.broadcast.roster.live()):
            if time.monotonic() > deadline:
                pytest.fail(
                    f"receivers {names} not all registered after {timeout_s}s:\n{self.logs()}"
                )
            time.sleep(0.1)

    def restart_trainer(self) -> None:
        """Stop the trainer's store and its deliveries, then start new ones on the same ports,
        as a restarted trainer pod would (its store and kept group are gone)."""
        port, http_port, config = self.broadcast.port, self.server.port, self.broadcast.config
        self.store.close()
        del self.broadcast, self.store, self.server  # the rendezvous store's last references
        gc.collect()  # (the store and its server refer to each other): its port is free
        self._start(port, http_port, config)

    def close(self) -> None:
        super().close()
        self.store.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()
