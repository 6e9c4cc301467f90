"""Policy weight sync on one GPU (#33): the sender's gather + pack rate and a receiver's load rate.

Run by hand on a GPU machine (one call, well under a minute):
``python bench/gpu/weight_sync_gpu.py --out $OUT/weight_sync_gpu.json``; it runs on CPU too
(``--device cpu``, for a dry run here). docs/performance.md records its figures with the card.

For a Qwen2-1.5B-shaped policy (random weights, fp32 on the device as a trainer holds them;
nothing downloaded) it times, with the tree's own code (``weights/buckets.py``, ``pieces.py``,
``buffers.py``), medians of ``--repeat`` runs after a warm-up:

- **pack**: the trainer's store's ``publish_stream`` with its broadcast and no receiver registered
  (so no wire): one pass of the tensor stream through two alternating device buckets of
  ``--bucket-mb`` (cast fp32 -> bf16 on the device), each bucket's digest, its async copy into a
  pinned staging bucket and from there into the host catch-up copy, mapped from a spool
  directory as the trainer's is (``--weight-spool-dir``): what the sender does besides the wire.
  The host copy's sha256 must equal that of the same tensors cast and serialised on the CPU
  (``ok``), and the run reports the growth of the process's anonymous memory, of its device
  memory and the number of pinned staging buckets (the "<= 2 buckets" target).
- **load**: a receiver's side: the received bytes as a device buffer, ``tensors_from_buffer``
  views of it, each bucket's digest, and the copy of every tensor into a bf16 model's parameters
  (``load_state_dict``), synchronised.
- **d2h / h2d**: plain copies of the whole version between the device and pinned host memory
  (the HTTP catch-up copy's and an HTTP receiver's transfer ceiling).

The wire (NCCL between two GPUs) is not measured: it needs a second GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "workers"), str(ROOT / "api")]

from weight_sync import qwen2_shapes  # noqa: E402

from longtail_workers.weights.broadcast import Broadcast  # noqa: E402
from longtail_workers.weights.buckets import bucket_digest, bucket_span  # noqa: E402
from longtail_workers.weights.buffers import BufferPool  # noqa: E402
from longtail_workers.weights.checksum import state_dict_checksum  # noqa: E402
from longtail_workers.weights.http_sync import WeightServer  # noqa: E402
from longtail_workers.weights.pieces import canonical_layout, tensors_from_buffer  # noqa: E402
from longtail_workers.weights.plan import BroadcastConfig  # noqa: E402
from longtail_workers.weights.store import WeightStore  # noqa: E402
from longtail_workers.weights.sync import TensorMeta  # noqa: E402


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str, repeat: int) -> float:
    """Median seconds of ``fn`` over ``repeat`` runs after one warm-up."""
    times = []
    for i in range(repeat + 1):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _anon() -> int:
    """Resident anonymous + shared memory of this process (pinned buffers included), bytes."""
    with open("/proc/self/status") as f:
        rows = dict(line.split(":", 1) for line in f)
    return sum(int(rows[k].split()[0]) * 1024 for k in ("RssAnon", "RssShmem"))


def _device_peak_reset(device: str) -> int:
    if device != "cuda":
        return 0
    torch.cuda.reset_peak_memory_stats()
    return int(torch.cuda.memory_allocated())


def _device_peak(device: str) -> int:
    return int(torch.cuda.max_memory_allocated()) if device == "cuda" else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", default="1.5B", choices=["0.5B", "1.5B"])
    ap.add_argument("--bucket-mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = ap.parse_args()
    dev, bucket = args.device, args.bucket_mb << 20
    shapes = qwen2_shapes(args.shape)
    trainer = {n: torch.randn(s, device=dev) * 0.02 for n, s in shapes.items()}  # fp32
    metas = [TensorMeta(n, torch.bfloat16, s) for n, s in shapes.items()]
    ordered, header = canonical_layout(metas)
    size = len(header) + sum(m.nbytes for m in ordered)
    pin = dev == "cuda"
    spool = tempfile.TemporaryDirectory()
    publisher = WeightStore(keep_last=1, spool_dir=Path(spool.name))
    WeightServer(publisher)  # the HTTP delivery, not started: nobody pulls here
    config = BroadcastConfig(bucket, phase_timeout_s=60.0, device=dev)
    broadcast = Broadcast(0, config)  # nobody registers: no wire
    publisher.attach(broadcast)

    def stream() -> Iterator[torch.Tensor]:
        return (trainer[m.name] for m in ordered)

    packs, anon, device_extra = [], [], []
    for i in range(args.repeat + 1):
        version = i + 1
        anon0, dev0 = _anon(), _device_peak_reset(dev)
        sync(dev)
        t0 = time.perf_counter()
        published = publisher.publish_stream(version, ordered, stream)
        sync(dev)
        if i:
            packs.append(time.perf_counter() - t0)
            anon.append(_anon() - anon0)
            device_extra.append(_device_peak(dev) - dev0)
        published.manifest()  # the catch-up copy's sha256s, hashed in the background: untimed
    pack_s = statistics.median(packs)
    expected = state_dict_checksum({m.name: trainer[m.name].cpu().to(m.dtype) for m in ordered})
    ok = published.content_sha256() == expected
    staging = len(broadcast._staging) if broadcast._staging is not None else 0
    broadcast.close()
    latest = publisher.latest()
    assert latest is not None
    host = BufferPool(1, pin=pin).take(size)  # the version's bytes in pinned memory
    host.copy_(torch.frombuffer(latest.data, dtype=torch.uint8))
    del latest
    received = host.to(dev)  # the bytes as a receiver's device buffer holds them
    model = {n: torch.empty(s, dtype=torch.bfloat16, device=dev) for n, s in shapes.items()}

    def load() -> None:
        for k in range(-(-size // bucket)):
            a, b = bucket_span(k, size, bucket)
            bucket_digest(received[a:b])
        state = tensors_from_buffer(received)
        for name, tensor in state.items():
            model[name].copy_(tensor)

    load_s = timed(load, dev, args.repeat)
    d2h_s = timed(lambda: host.copy_(received, non_blocking=pin), dev, args.repeat)
    h2d_s = timed(lambda: received.copy_(host, non_blocking=pin), dev, args.repeat)
    card = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    out: dict[str, Any] = {
        "card": card, "torch": torch.__version__, "shape": args.shape, "bytes": size,
        "bucket_mb": args.bucket_mb,
        "pack_s": pack_s, "pack_gb_s": size / pack_s / 1e9, "pack_bytes_ok": ok,
        "pack_host_anon_extra_gb": max(anon) / 1e9,
        "pack_device_extra_gb": max(device_extra) / 1e9, "pinned_staging_buckets": staging,
        "load_s": load_s, "load_gb_s": size / load_s / 1e9,
        "d2h_gb_s": size / d2h_s / 1e9, "h2d_gb_s": size / h2d_s / 1e9,
    }  # fmt: skip
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
