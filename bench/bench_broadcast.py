"""The broadcast rows of ``bench/weight_sync.py`` (#33), and its 7B projection.

Imported by ``weight_sync.py`` only (it puts ``bench/`` on ``sys.path``); see that module's
text for what each row measures. :func:`one_broadcast` is a world-1 (or, with a second process
running :func:`rank1`, world-2) trainer publishing to two :func:`receiver` processes.
"""

from __future__ import annotations

import ctypes
import datetime
import hashlib
import json
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from weight_sync import qwen2_shapes, timed

from longtail_workers.trainer.row_gather import RowGather, RowGatherer, one_ahead, row_split
from longtail_workers.weights.broadcast import Broadcast
from longtail_workers.weights.broadcast_source import BroadcastSource
from longtail_workers.weights.http_sync import HttpWeightClient, WeightServer
from longtail_workers.weights.pieces import HASH_THREADS, canonical_layout
from longtail_workers.weights.plan import BroadcastConfig
from longtail_workers.weights.store import WeightStore, publish_state_dict
from longtail_workers.weights.sync import TensorMeta

RECEIVERS = ("rollout-0", "rollout-1")
GPU_COPY_BYTES_PER_S = 200e9
"""Assumed device-side pack (cast + copy into a bucket) and load rate on a GPU for the
projection: an order of magnitude below an H100's ~3 TB/s HBM (not measured here: no GPU)."""


def layout(shape: str) -> tuple[list[TensorMeta], torch.Tensor]:
    """The canonical bf16 layout of ``shape`` and a random scratch tensor as large as its
    largest tensor (every streamed tensor is a view of it)."""
    metas = [TensorMeta(n, torch.bfloat16, d) for n, d in qwen2_shapes(shape).items()]
    ordered, _ = canonical_layout(metas)
    biggest = max(m.nbytes // 2 for m in ordered)
    return ordered, torch.empty(biggest, dtype=torch.bfloat16).uniform_(-0.05, 0.05)


def whole(ordered: list[TensorMeta], scratch: torch.Tensor) -> Callable[[], Iterator[torch.Tensor]]:
    """A world-1 trainer's stream: its tensors are already whole."""

    def views() -> Iterator[torch.Tensor]:
        for m in ordered:
            n = m.nbytes // 2
            yield scratch[:n].view(m.shape)

    return views


def gathered(
    ordered: list[TensorMeta], scratch: torch.Tensor, gatherer: RowGatherer
) -> Iterator[torch.Tensor]:
    """One pass of a world-2 trainer, as ``trainer/sharding.py``'s ``gather_tensors`` runs it:
    each tensor's rows split over the two ranks as FSDP2's ``Shard(0)`` splits them, gathered
    on rank 0 only (rank 1 sends its rows), the next tensor's gather posted before this one is
    given out (the trainer's own :mod:`~longtail_workers.trainer.row_gather`)."""
    rank = dist.get_rank()

    def posted() -> Iterator[RowGather]:
        for m in ordered:
            rows = row_split(m.shape[0], 2)[rank]
            per_row = m.nbytes // 2 // max(m.shape[0], 1)
            yield gatherer.start(scratch[: rows * per_row].view(rows, *m.shape[1:]), m.shape)

    return one_ahead(posted())


def rank1(port: int, shape: str) -> None:
    """The second trainer rank of ``broadcast-w2``: one gather pass per flag from rank 0."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2,
        timeout=datetime.timedelta(seconds=600),
    )  # fmt: skip
    ordered, scratch = layout(shape)
    gatherer = RowGatherer(max(m.nbytes for m in ordered))  # unused on rank 1: nothing lands
    flag = torch.zeros(1, dtype=torch.int64)
    while True:
        dist.broadcast(flag, src=0)
        if int(flag) == 0:
            break
        for _ in gathered(ordered, scratch, gatherer):
            pass
    dist.destroy_process_group()


def receiver(addr: str, name: str, url: str, shape: str) -> None:
    """A rollout worker's weight side: every version received is fetched and copied tensor by
    tensor into a scratch tensor (the load), and reported on stdout as one JSON line."""
    torch.set_num_threads(1)
    source = BroadcastSource(addr, name, HttpWeightClient(url, timeout_s=600.0), timeout_s=300)
    _, scratch = layout(shape)
    held = 0
    while True:
        time.sleep(0.01)
        version = source.received()
        if version is None or version <= held:
            continue
        t0 = time.perf_counter()
        got = _load(source, version, scratch)  # no reference to the received bytes outlives it
        source.loaded(got)
        print(json.dumps({"version": got, "pause_s": time.perf_counter() - t0}), flush=True)
        held = got


def _load(source: BroadcastSource, version: int, scratch: torch.Tensor) -> int:
    got, state = source.fetch(version)
    for tensor in state.values():
        scratch[: tensor.numel()].copy_(tensor.reshape(-1))
    return got


def one_broadcast(
    shape: str, protocol: str, repeat: int, bucket_bytes: int, script: str, spool: bool
) -> dict[str, Any]:
    """One broadcast row (world 1, or world 2 for ``broadcast-w2``)."""
    torch.set_num_threads(2)
    ordered, scratch = layout(shape)
    procs: list[subprocess.Popen[str]] = []
    spooled = tempfile.TemporaryDirectory()  # the trainer's --weight-spool-dir
    publisher = WeightStore(keep_last=1, spool_dir=Path(spooled.name) if spool else None)
    server = WeightServer(publisher).start()
    broadcast = Broadcast(0, BroadcastConfig(bucket_bytes, phase_timeout_s=300))
    publisher.attach(broadcast)
    reports: queue.Queue[dict[str, Any]] = queue.Queue()
    try:
        world2 = protocol == "broadcast-w2"
        if world2:
            port = _free_port()
            procs.append(_start(script, ["--rank1", str(port), shape, "0"]))
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2,
                timeout=datetime.timedelta(seconds=600),
            )  # fmt: skip
        for name in RECEIVERS:
            args = ["--receiver", f"127.0.0.1:{broadcast.port}", name, server.url, shape]
            procs.append(_start(script, args))
            threading.Thread(target=_read, args=(procs[-1], reports), daemon=True).start()
        deadline = time.monotonic() + 120
        while set(broadcast.roster.live()) != set(RECEIVERS):
            if time.monotonic() > deadline:
                raise RuntimeError("the receivers did not register within 120 s")
            time.sleep(0.1)
        gatherer = RowGatherer(max(m.nbytes for m in ordered))
        stream = whole(ordered, scratch)
        if world2:
            stream = lambda: gathered(ordered, scratch, gatherer)  # noqa: E731
        rows = []
        for version in range(1, repeat + 2):  # the first round warms up
            if world2:
                dist.broadcast(torch.ones(1, dtype=torch.int64), src=0)  # rank 1: one pass
            seconds, extra, published = timed(
                lambda v=version: publisher.publish_stream(v, ordered, stream)
            )
            returned = time.perf_counter()
            pauses = [_next(reports, version) for _ in RECEIVERS]
            phases = published.phases
            if sorted(phases.receivers) != list(RECEIVERS):
                raise RuntimeError(f"version {version} did not reach both receivers: {phases}")
            published.manifest()  # the HTTP catch-up copy, hashed in the background
            ready_s = time.perf_counter() - returned  # (before the next version starts)
            if version > 1:
                rows.append((seconds, extra, max(pauses), phases, published.size, ready_s))
        if world2:
            dist.broadcast(torch.zeros(1, dtype=torch.int64), src=0)
            dist.destroy_process_group()
        tiny = {"x": torch.zeros(8, dtype=torch.bfloat16)}
        overhead_s, _, _ = timed(lambda: publish_state_dict(publisher, repeat + 2, tiny))
        overhead_s = min(
            overhead_s, timed(lambda: publish_state_dict(publisher, repeat + 3, tiny))[0]
        )
        sample = scratch.view(torch.uint8).numpy().data.cast("B")
        hash_s, _, _ = timed(lambda: hashlib.sha256(sample).digest())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
        publisher.close()  # its deliveries: the broadcast and the weight server
        spooled.cleanup()
    return _row(shape, protocol, rows, overhead_s, len(sample) / hash_s)


def _row(
    shape: str, protocol: str, rows: list[Any], overhead_s: float, hash_rate: float
) -> dict[str, Any]:
    def med(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    size = rows[0][4]
    total = med([r[0] + r[2] for r in rows])
    return {
        "shape": shape, "protocol": protocol, "gb": size / 1e9, "s_per_version": total,
        "gb_s": size / 1e9 / total, "publish_s": med([r[0] for r in rows]),
        "gather_s": med([r[3].gather_s for r in rows]), "pack_s": med([r[3].pack_s for r in rows]),
        "wire_s": med([r[3].wire_s for r in rows]), "pause_s": med([r[2] for r in rows]),
        "extra_gb": max(r[1][0] for r in rows) / 1e9, "overhead_s": overhead_s,
        "spool_gb": max(r[1][1] for r in rows) / 1e9,
        "hash_gb_s": hash_rate / 1e9, "ready_s": med([r[5] for r in rows]),
    }  # fmt: skip


def projection(row: dict[str, Any], bucket_bytes: int) -> str:
    """The 7B projection from the measured broadcast row (text, assumptions included)."""
    size = row["gb"] * 1e9
    pack_rate, load_rate = size / row["pack_s"], size / row["pause_s"]
    hash_rate = row["hash_gb_s"] * 1e9
    seven = 15.2e9
    lines = [
        f"7B projection (15.2 GB bf16) from the {row['shape']} broadcast row. Measured here: "
        f"pack {pack_rate / 1e9:.2f} GB/s (CPU: cast + copy into buckets), load "
        f"{load_rate / 1e9:.2f} GB/s (CPU copy), sha256 {hash_rate / 1e9:.2f} GB/s per thread, "
        f"fixed cost {row['overhead_s']:.2f}s per version (announce, acks, reports: a 16-byte "
        "publish on the kept group).",
        "Assumptions: the wire runs at the link rate (floor = bytes / rate); packing and the "
        "wire are pipelined bucket by bucket, so a version takes max(pack, wire) + one "
        f"{bucket_bytes >> 20} MiB bucket to fill the pipe + load + the fixed cost. The HTTP "
        "catch-up copy's sha256s are hashed after the broadcast, off the critical path "
        f"({HASH_THREADS} threads), and the checkpoint's whole-version sha256 only when a "
        "checkpoint asks for it. "
        f"'GPU' assumes device-side pack and load at {GPU_COPY_BYTES_PER_S / 1e9:.0f} GB/s (not "
        "measured: no GPU here); the sharded gather is not included.",
    ]
    for link, rate in {"25 GbE": 25e9 / 8, "400 Gb/s InfiniBand": 400e9 / 8}.items():
        floor = seven / rate
        for where, pack, load in (
            ("CPU as measured", pack_rate, load_rate),
            ("GPU", GPU_COPY_BYTES_PER_S, GPU_COPY_BYTES_PER_S),
        ):
            fill = min(bucket_bytes, seven) / min(pack, rate)
            stages = {"pack": seven / pack, "wire": floor}
            slowest = max(stages, key=lambda k: stages[k])
            total = stages[slowest] + fill + seven / load + row["overhead_s"]
            lines.append(
                f"  {link:>20}: wire floor {floor:5.2f}s; {where:>15}: {total:6.2f}s per "
                f"version (bound by {slowest}: {stages[slowest]:.2f}s)"
            )
    lines.append(
        f"  off the critical path: the HTTP catch-up copy is ready "
        f"{seven / (hash_rate * HASH_THREADS):.1f}s after the broadcast, a checkpoint's sha256 "
        f"takes {seven / hash_rate:.1f}s (at this CPU's sha256 rate)"
    )
    return "\n".join(lines)


def _start(script: str, args: list[str]) -> subprocess.Popen[str]:
    """A child that dies with this process (an OOM kill of the trainer leaves no orphans);
    its stderr goes to a log file under the temporary directory."""
    log = open(f"{tempfile.gettempdir()}/bench-weight-sync-{args[0][2:]}-{args[2]}.log", "w")  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, script, *args], stdout=subprocess.PIPE, stderr=log, text=True,
        preexec_fn=_die_with_parent,
    )  # fmt: skip


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _read(proc: subprocess.Popen[str], out: queue.Queue[dict[str, Any]]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{"):
            out.put(json.loads(line))


def _next(reports: queue.Queue[dict[str, Any]], version: int) -> float:
    while True:
        report = reports.get(timeout=300)
        if report["version"] == version:
            return float(report["pause_s"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
