"""Timed policy weight sync, phase by phase, for both transports.

Called by :mod:`longtail_workers.profile.main`. Every RL step ends with the new policy version
going from the trainer to every rollout worker before their next rollout. :func:`measure_sync`
times, with the profiled model's own weights:

* **http**: the trainer's publish into its
  :class:`~longtail_workers.weights.store.WeightStore` served by a
  :class:`~longtail_workers.weights.http_sync.WeightServer` (pack: pieces copied and hashed),
  one worker's pull with :class:`~longtail_workers.weights.http_sync.HttpWeightClient` (the
  pieces in parallel, each checksummed) over loopback, and ``load_state_dict`` of what it
  pulled (load); their sum is the profile's flat ``weight_sync_s``, as before;
* **broadcast**: the sender's bucket pack (``weights.buckets.fill_buckets``: cast and copy
  into two alternating bucket buffers) and the wire: the version's buckets broadcast on a
  fresh gloo group (``weights.membership.attempt_group``, the transport's own) to one
  receiver process started here (``python -m longtail_workers.profile.sync --receive``).

The gather of a sharded trainer is not timed (one process here holds whole tensors): the
simulator derives it and says so. Loopback has no network in it: the simulator caps the wire
by a link rate given as an assumption (``longtail simulate --link-gbps``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

from longtail_api.profile import SyncCosts
from longtail_workers.weights import membership
from longtail_workers.weights.buckets import bucket_count, bucket_span, fill_buckets
from longtail_workers.weights.http_sync import HttpWeightClient, WeightServer
from longtail_workers.weights.pieces import canonical_layout, metas_of
from longtail_workers.weights.store import WeightStore, publish_state_dict

BUCKET_BYTES = 256 << 20
"""Bucket size of the timed broadcast (the spec's default is 1 GiB; a small model fits one)."""
TIMEOUT_S = 600.0
"""Longest the receiver may take to join, or one broadcast to finish."""


def _median_of(repeats: int, once: Callable[[int], float]) -> float:
    """Median of ``once(round)`` over ``repeats`` rounds after one warm-up round."""
    times = [once(r) for r in range(max(1, repeats) + 1)]
    return statistics.median(times[1:])


def measure_sync(policy: nn.Module, repeats: int) -> tuple[float, SyncCosts]:
    """(median seconds of publish + pull + load over HTTP, the per-phase rates of both
    transports)."""
    state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    pack, pull, load, size = [], [], [], 0
    store = WeightStore()
    with WeightServer(store) as server:
        client = HttpWeightClient(server.url, timeout_s=TIMEOUT_S)
        for version in range(1, max(1, repeats) + 2):  # the first round warms the connection
            t0 = time.perf_counter()
            size = publish_state_dict(store, version, state).size
            t1 = time.perf_counter()
            _, pulled = client.fetch(version)
            t2 = time.perf_counter()
            with torch.no_grad():
                policy.load_state_dict(pulled)
            t3 = time.perf_counter()
            if version > 1:
                pack.append(t1 - t0)
                pull.append(t2 - t1)
                load.append(t3 - t2)
    http = [statistics.median(x) for x in (pack, pull, load)]
    bucket_pack_s = _bucket_pack_seconds(state, repeats)
    wire_s = _broadcast_seconds(size, repeats)
    what = f"measured: {size / 1e9:.3f} GB, median of {max(1, repeats)} after a warm-up"
    costs = SyncCosts(
        version_bytes=size,
        http_pack_bytes_per_s=size / http[0],
        http_pull_bytes_per_s=size / http[1],
        load_bytes_per_s=size / http[2],
        broadcast_pack_bytes_per_s=size / bucket_pack_s,
        broadcast_wire_bytes_per_s=size / wire_s,
        broadcast_receivers=1,
        sources={
            "http_pack_bytes_per_s": f"{what}: WeightServer.publish",
            "http_pull_bytes_per_s": f"{what}: HttpWeightClient.fetch over loopback",
            "load_bytes_per_s": f"{what}: load_state_dict of the pulled version",
            "broadcast_pack_bytes_per_s": f"{what}: fill_buckets into two alternating "
            "bucket buffers",
            "broadcast_wire_bytes_per_s": f"{what}: gloo broadcast to 1 receiver process "
            "over loopback",
        },
    )
    return sum(http), costs


def _bucket_pack_seconds(state: dict[str, torch.Tensor], repeats: int) -> float:
    """Median seconds of packing ``state`` into buckets, as the broadcast sender does."""
    layout, header = canonical_layout(metas_of(state))
    bucket = min(BUCKET_BYTES, len(header) + sum(m.nbytes for m in layout))
    buffers = [torch.empty(bucket, dtype=torch.uint8) for _ in range(2)]

    def once(_: int) -> float:
        t0 = time.perf_counter()
        tensors = (state[m.name] for m in layout)
        for _k in fill_buckets(header, layout, tensors, bucket, lambda k: buffers[k % 2]):
            pass
        return time.perf_counter() - t0

    return _median_of(repeats, once)


def _broadcast_seconds(size: int, repeats: int) -> float:
    """Median seconds of broadcasting ``size`` bytes in buckets to one receiver process."""
    rounds = max(1, repeats) + 1
    store = membership.connect("127.0.0.1", 0, TIMEOUT_S, master=True)
    receiver = subprocess.Popen(
        [sys.executable, "-m", "longtail_workers.profile.sync", "--receive", str(store.port),
         str(size), str(rounds)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        group = membership.attempt_group(store, 0, 0, 2, "cpu", TIMEOUT_S)
        buf = torch.zeros(min(BUCKET_BYTES, size), dtype=torch.uint8)

        def once(_: int) -> float:
            t0 = time.perf_counter()
            _send(lambda t: membership.broadcast(group, t).wait(), buf, size)
            return time.perf_counter() - t0

        seconds = _median_of(repeats, once)
        _, err = receiver.communicate(timeout=TIMEOUT_S)
        if receiver.returncode != 0:
            raise RuntimeError(f"the broadcast receiver failed ({receiver.returncode}): {err}")
        return seconds
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait(timeout=10)


def _send(broadcast: Callable[[torch.Tensor], object], buf: torch.Tensor, size: int) -> None:
    """Every bucket of a ``size``-byte version through ``buf``, one after the other (rank 0 is
    the root; every rank makes the same calls)."""
    for k in range(bucket_count(size, buf.numel())):
        start, stop = bucket_span(k, size, buf.numel())
        broadcast(buf[: stop - start])


def _receive(port: int, size: int, rounds: int) -> None:
    """The receiver's side of :func:`_broadcast_seconds` (rank 1)."""
    store = membership.connect("127.0.0.1", port, TIMEOUT_S)
    group = membership.attempt_group(store, 0, 1, 2, "cpu", TIMEOUT_S)
    buf = torch.empty(min(BUCKET_BYTES, size), dtype=torch.uint8)
    for _ in range(rounds):
        _send(lambda t: membership.broadcast(group, t).wait(), buf, size)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="receiver of the profile's timed broadcast")
    ap.add_argument("--receive", nargs=3, type=int, metavar=("PORT", "BYTES", "ROUNDS"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    _receive(*args.receive)
