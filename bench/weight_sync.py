"""Policy weight pull over HTTP: seconds and MB/s per version, for the server and client in use.

Run by hand (``python bench/weight_sync.py --mb 256 512``) to check that the worker HTTP stack
(``httpserver.py`` on the trainer, ``httpclient.py`` on rollout workers) moves policy versions
at loopback speed; docs/performance.md records its figures. It publishes a float32 state dict of
the given size on a :class:`WeightServer` and pulls it ``--repeat`` times with
:class:`HttpWeightClient` (checksummed, as every rollout worker does before a generate call).
Prints one row per size: best and median pull time and the median throughput.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from longtail_workers.weights.http_sync import HttpWeightClient, WeightServer

TENSOR_MB = 16
"""Size of each tensor in the published state dict (a model has many mid-sized tensors)."""


def state_dict_of(mb: int) -> dict[str, torch.Tensor]:
    """A float32 state dict of ``mb`` MiB in ``TENSOR_MB`` MiB tensors."""
    per = TENSOR_MB * (1 << 20) // 4
    count = max(1, mb // TENSOR_MB)
    gen = torch.Generator().manual_seed(0)
    return {f"layer.{i}.weight": torch.randn(per, generator=gen) for i in range(count)}


def pull_times(server: WeightServer, repeat: int) -> list[float]:
    """Seconds of each full pull (fetch + checksum check) of the newest version."""
    client = HttpWeightClient(server.url, timeout_s=600.0)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        client.fetch()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, nargs="+", default=[64, 256], help="state dict sizes, MiB")
    ap.add_argument("--repeat", type=int, default=5, help="pulls per size")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'MiB':>6} {'best s':>8} {'median s':>9} {'MiB/s':>8}")
    for mb in args.mb:
        state = state_dict_of(mb)
        size_mb = sum(t.numel() * t.element_size() for t in state.values()) / (1 << 20)
        with WeightServer() as server:
            server.publish(1, state)
            times = pull_times(server, args.repeat)
        med = statistics.median(times)
        print(f"{size_mb:6.0f} {min(times):8.3f} {med:9.3f} {size_mb / med:8.0f}", flush=True)


if __name__ == "__main__":
    main()
