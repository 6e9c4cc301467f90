"""The trainer's weight side as its own process, for the broadcast fault tests
(``test_weight_sync_broadcast_faults.py``): a real store with its :class:`WeightServer` and
:class:`Broadcast` on the given ports, publishing the tiny policy's versions (seeded by
the version, as ``broadcast_harness.policy``) once the named receivers are registered.

``--die-at V:K`` SIGKILLs this process while its tensor stream of version V gives tensor K (mid
broadcast: buckets of V are already on the wire), as a trainer pod killed by the node would. Each
finished publish is one JSON line in ``OUT/trainer.jsonl`` (version, receivers, dropped).

Run as ``python ws_trainer.py --port P --http-port H --out DIR --wait NAME... --publish V...``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "doubles"))
from tiny_targets import tiny_qwen2
from ws_receiver import SHAPE

from longtail_workers.weights.broadcast import Broadcast
from longtail_workers.weights.http_sync import WeightServer
from longtail_workers.weights.pieces import canonical_layout, metas_of
from longtail_workers.weights.plan import BroadcastConfig
from longtail_workers.weights.store import WeightStore
from longtail_workers.weights.sync import TensorMeta


def _stream(
    version: int,
    state: dict[str, torch.Tensor],
    layout: list[TensorMeta],
    die: tuple[int, ...] | None,
) -> Callable[[], Iterator[torch.Tensor]]:
    """The publisher's tensor stream of ``version``; SIGKILLs this process at ``die``."""

    def tensors() -> Iterator[torch.Tensor]:
        for i, meta in enumerate(layout):
            if die == (version, i):
                os.kill(os.getpid(), signal.SIGKILL)
            yield state[meta.name]

    return tensors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--wait", nargs="+", required=True)
    ap.add_argument("--publish", nargs="+", type=int, required=True)
    ap.add_argument("--die-at", default=None)
    ap.add_argument("--bucket-bytes", type=int, default=4096)
    ap.add_argument("--phase-timeout", type=float, default=8.0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s trainer %(message)s")
    torch.set_num_threads(1)
    die = tuple(int(x) for x in args.die_at.split(":")) if args.die_at else None
    store = WeightStore()
    WeightServer(store, port=args.http_port).start()
    config = BroadcastConfig(bucket_bytes=args.bucket_bytes, phase_timeout_s=args.phase_timeout)
    broadcast = Broadcast(args.port, config)
    store.attach(broadcast)
    deadline = time.monotonic() + 60
    while not set(args.wait) <= set(broadcast.roster.live()):
        if time.monotonic() > deadline:
            raise SystemExit(f"receivers {args.wait} did not register within 60 s")
        time.sleep(0.1)
    for version in args.publish:
        state = tiny_qwen2(seed=version, **SHAPE).state_dict()
        layout, _ = canonical_layout(metas_of(state))
        stream = _stream(version, state, layout, die)
        phases = store.publish_stream(version, layout, stream).phases
        line = {"version": version, "receivers": phases.receivers, "dropped": phases.dropped}
        with (Path(args.out) / "trainer.jsonl").open("a") as f:
            f.write(json.dumps(line) + "\n")
    while True:  # keep serving (HTTP catch-up) until the test stops this process
        time.sleep(0.5)


if __name__ == "__main__":
    main()
