"""The cost of a membership epoch change in the broadcast weight sync (#52), on CPU with gloo.

Run by hand (``python bench/broadcast_epoch.py [--mb 64] [--rounds 5]``); docs/performance.md
records its figures. A world-1 trainer (the tree's ``WeightStore`` with its ``WeightServer``
and ``Broadcast``, in this process) publishes a synthetic bf16 policy of ``--mb`` MB in
``--tensors`` tensors to two rollout workers' weight sides (``BroadcastSource``, each its own
process, started with ``--receiver``) on real gloo groups over loopback. Each round times four
versions: ``steady`` (the same two members: the kept group), ``add`` (a third worker registered
since the last version: a fresh group of three), ``steady+1`` (the three on their kept group)
and ``remove`` (the third worker killed and gone from the roster: a fresh group of two). A
version's time is the trainer's publish, which returns once every member verified it (what a
step waits for); ``group`` is the trainer's part of building the fresh group (itself a
rendezvous of every member). The epoch change's cost is ``add`` - ``steady+1`` and ``remove`` -
``steady``, each within its round (the same members on a kept group against a fresh one). The
joiner is started and up before its round, waiting on a gate file, so its interpreter start is
neither timed nor loading the CPU meanwhile (a real joiner registers once up, as here); the
remove round waits for the roster to see the worker gone (``STALE_S``) before publishing, as a
trainer whose worker went away between versions does. The receivers load each version (copy
every tensor once) and report it on stdout. Prints each round and the median [min - max] per
kind.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import longtail_workers.weights.broadcast as broadcast_module
from longtail_workers.weights.broadcast import Broadcast
from longtail_workers.weights.broadcast_source import BroadcastSource
from longtail_workers.weights.http_sync import HttpWeightClient, WeightServer
from longtail_workers.weights.membership import attempt_group
from longtail_workers.weights.pieces import canonical_layout
from longtail_workers.weights.plan import BroadcastConfig
from longtail_workers.weights.store import WeightStore
from longtail_workers.weights.sync import TensorMeta

MEMBERS = ("rollout-0", "rollout-1")
KINDS = ("steady", "add", "steady+1", "remove")
SAME_MEMBERS = {"add": "steady+1", "remove": "steady"}
"""The version with the same members on a kept group that each epoch change compares with."""


def policy(mb: float, tensors: int) -> tuple[list[TensorMeta], torch.Tensor]:
    """A canonical bf16 layout of ``tensors`` equal square-ish tensors totalling ``mb`` MB,
    and the one random tensor every streamed tensor is a view of."""
    per = max(int(mb * 1e6 / 2 / tensors), 1)
    cols = 1024 if per >= 1024 else 1
    rows = max(per // cols, 1)
    metas = [TensorMeta(f"layer.{i}.weight", torch.bfloat16, (rows, cols)) for i in range(tensors)]
    ordered, _ = canonical_layout(metas)
    return ordered, torch.empty(rows * cols, dtype=torch.bfloat16).uniform_(-0.05, 0.05)


def receiver(addr: str, name: str, url: str, gate: str) -> None:
    """A rollout worker's weight side: waits for ``gate`` (when given), then loads every
    version it receives by broadcast and prints it as one JSON line."""
    torch.set_num_threads(1)
    if gate:
        Path(f"{gate}.waiting").touch()  # up: the interpreter's start is over
    while gate and not Path(gate).exists():
        time.sleep(0.01)
    source = BroadcastSource(addr, name, HttpWeightClient(url, timeout_s=120.0), timeout_s=120)
    held = 0
    while True:
        time.sleep(0.005)
        version = source.received()
        if version is None or version <= held:
            continue
        held, state = source.fetch(version)
        for tensor in state.values():
            tensor.clone()  # the load: every byte copied once
        del state
        source.loaded(held)
        print(json.dumps({"name": name, "version": held}), flush=True)


class Bench:
    """The trainer's store and deliveries here, the receivers as child processes."""

    def __init__(self, mb: float, tensors: int, bucket_bytes: int) -> None:
        self.ordered, self.scratch = policy(mb, tensors)
        self.store = WeightStore(keep_last=1)
        self.server = WeightServer(self.store).start()
        self.broadcast = Broadcast(0, BroadcastConfig(bucket_bytes, phase_timeout_s=60))
        self.store.attach(self.broadcast)
        self.addr = f"127.0.0.1:{self.broadcast.port}"
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.gates = Path(tempfile.mkdtemp(prefix="bench-epoch-"))
        self.version = 0
        self.builds: dict[int, float] = {}  # attempt -> the trainer's group build (s)

        def timed_build(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return attempt_group(*args)
            finally:
                self.builds[args[1]] = time.perf_counter() - t0

        vars(broadcast_module)["attempt_group"] = timed_build  # the one it calls

    def start(self, name: str, gated: bool) -> None:
        gate = str(self.gates / name) if gated else ""
        args = ["--receiver", self.addr, name, self.server.url, gate]
        self.procs[name] = subprocess.Popen(
            [sys.executable, __file__, *args], stdout=subprocess.DEVNULL,
            stderr=(self.gates / f"{name}.log").open("w"), text=True, preexec_fn=_die_with_parent,
        )  # fmt: skip

    def ready(self, name: str) -> None:
        """Wait until the gated ``name`` is up (so its start does not load the next versions)."""
        self.wait(lambda: (self.gates / f"{name}.waiting").exists(), f"{name} started")

    def admit(self, name: str) -> None:
        (self.gates / name).touch()
        self.wait(lambda: name in self.broadcast.roster.live(), f"{name} registered")

    def remove(self, name: str) -> None:
        self.procs.pop(name).kill()
        self.wait(lambda: name not in self.broadcast.roster.live(), f"{name} gone")

    def wait(self, cond: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError(f"not {what} within {timeout_s:g}s (logs in {self.gates})")
            time.sleep(0.01)

    def publish(self, members: list[str]) -> tuple[float, float]:
        """Publish the next version; its seconds and the group build's (0: the kept group)."""
        self.version += 1
        before = set(self.builds)
        t0 = time.perf_counter()
        phases = self.store.publish_stream(self.version, self.ordered, self._stream).phases
        seconds = time.perf_counter() - t0
        if phases is None or phases.receivers != sorted(members) or phases.attempts != 1:
            raise RuntimeError(f"version {self.version} did not reach {members} once: {phases}")
        new = set(self.builds) - before
        return seconds, sum(self.builds[n] for n in new)

    def _stream(self) -> Iterator[torch.Tensor]:
        for m in self.ordered:
            yield self.scratch[: m.nbytes // 2].view(m.shape)

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait(timeout=30)
        self.store.close()


def run(args: argparse.Namespace) -> dict[str, list[tuple[float, float]]]:
    torch.set_num_threads(1)
    bench = Bench(args.mb, args.tensors, args.bucket_mb << 20)
    out: dict[str, list[tuple[float, float]]] = {k: [] for k in KINDS}
    try:
        for name in MEMBERS:
            bench.start(name, gated=False)
        bench.wait(lambda: set(MEMBERS) <= set(bench.broadcast.roster.live()), "registered")
        bench.publish(list(MEMBERS))  # warm-up: the first group, the landing buffers
        bench.publish(list(MEMBERS))
        joiner = "joiner-0"
        bench.start(joiner, gated=True)
        bench.ready(joiner)
        for r in range(args.rounds):
            got = {"steady": bench.publish(list(MEMBERS))}
            bench.admit(joiner)
            got["add"] = bench.publish([*MEMBERS, joiner])
            got["steady+1"] = bench.publish([*MEMBERS, joiner])
            bench.remove(joiner)
            got["remove"] = bench.publish(list(MEMBERS))
            joiner = f"joiner-{r + 1}"
            bench.start(joiner, gated=True)  # up before its round
            bench.ready(joiner)
            for kind in KINDS:
                out[kind].append(got[kind])
            line = "  ".join(f"{k} {s:.3f}s (group {g:.3f}s)" for k, (s, g) in got.items())
            print(f"round {r + 1}: {line}", flush=True)
    finally:
        bench.close()
    return out


def report(out: dict[str, list[tuple[float, float]]], args: argparse.Namespace) -> None:
    def med(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    print(f"{args.mb:g} MB in {args.tensors} tensors, {args.bucket_mb} MiB buckets, "
          f"{args.rounds} rounds, 2 receivers (+1 joiner), gloo on loopback")  # fmt: skip
    for kind in KINDS:
        secs, groups = [s for s, _ in out[kind]], [g for _, g in out[kind]]
        line = (
            f"  {kind:>9}: {med(secs):.3f}s [{min(secs):.3f} - {max(secs):.3f}]  group build "
            f"{med(groups):.3f}s [{min(groups):.3f} - {max(groups):.3f}]"
        )
        base = SAME_MEMBERS.get(kind)
        if base is not None:  # the epoch change: this version minus its round's kept one
            extra = [s - b for s, (b, _) in zip(secs, out[base], strict=True)]
            line += f"  vs {base} {med(extra):+.3f}s [{min(extra):+.3f} - {max(extra):+.3f}]"
        print(line)


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--receiver":
        receiver(*sys.argv[2:6])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=64.0, help="policy size (MB of bf16)")
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--bucket-mb", type=int, default=16, help="broadcast bucket size (MiB)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    report(run(args), args)


if __name__ == "__main__":
    main()
