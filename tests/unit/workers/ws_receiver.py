"""A rollout worker's weight side as its own process, for the broadcast tests
(``test_weight_sync_broadcast*.py``): a tiny torch policy and a real
:class:`~longtail_workers.weights.broadcast_source.BroadcastSource`.

It loads every version it receives by broadcast into its model and, when the test writes a
version number to ``OUT/NAME.want``, loads that version through ``load_into`` (which pulls it over
HTTP unless it was broadcast). Each load (and the weights it started with) is one JSON line in
``OUT/NAME.jsonl``: version, sha256 of the model's state dict, and how it came. Faults are
injected here, not in the product: ``--kill-at V:K`` SIGKILLs this process while receiving
bucket K of version V; ``--corrupt-at V:K`` flips a byte of bucket K of version V after it
arrived (a faulty link), which the receiver must refuse. ``--start-after FILE`` builds the model,
then waits (at most 60 s; ``OUT/NAME.waiting`` says it is there) for FILE before it connects, so
a test can make it register at a chosen moment (mid-broadcast) without waiting for the
interpreter to start.

Run as ``python ws_receiver.py --addr HOST:PORT --name NAME --weights-url URL --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch._C._distributed_c10d import Backend

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "doubles"))
from tiny_targets import tiny_qwen2

from longtail_workers.weights.broadcast_source import BroadcastSource
from longtail_workers.weights.checksum import state_dict_checksum
from longtail_workers.weights.http_sync import HttpWeightClient
from longtail_workers.weights.records import AttemptRecord
from longtail_workers.weights.sync import WeightSyncError

SHAPE = {"vocab_size": 32, "hidden_size": 32, "intermediate_size": 64}
"""The tiny policy's shape (the tests publish ``tiny_qwen2(seed=v, **SHAPE)`` as version v)."""


def at(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    version, bucket = text.split(":")
    return int(version), int(bucket)


class FaultySource(BroadcastSource):
    """A :class:`BroadcastSource` whose link dies or corrupts one bucket, as asked."""

    kill: tuple[int, int] | None = None
    corrupt: tuple[int, int] | None = None

    def _receive_bucket(
        self, pg: Backend, record: AttemptRecord, k: int, view: torch.Tensor
    ) -> None:
        if self.kill == (record.version, k):
            os.kill(os.getpid(), signal.SIGKILL)
        super()._receive_bucket(pg, record, k, view)
        if self.corrupt == (record.version, k):
            view[len(view) // 2] ^= 0x10


def main() -> None:
    ap = argparse.ArgumentParser()
    for flag in ("--addr", "--name", "--weights-url", "--out"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--kill-at", default=None)
    ap.add_argument("--corrupt-at", default=None)
    ap.add_argument("--start-after", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.name} %(message)s")
    torch.set_num_threads(1)
    model = tiny_qwen2(seed=1000, **SHAPE)
    log_path = Path(args.out) / f"{args.name}.jsonl"
    want_path = Path(args.out) / f"{args.name}.want"

    def record(version: int, via: str) -> None:
        line = {"version": version, "sha": state_dict_checksum(model.state_dict()), "via": via}
        with log_path.open("a") as f:
            f.write(json.dumps(line) + "\n")

    FaultySource.kill, FaultySource.corrupt = at(args.kill_at), at(args.corrupt_at)
    if args.start_after:
        gate, deadline = Path(args.start_after), time.monotonic() + 60
        (Path(args.out) / f"{args.name}.waiting").touch()
        while not gate.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"{args.start_after} did not appear within 60 s")
            time.sleep(0.01)
    http = HttpWeightClient(args.weights_url, timeout_s=10, retries=2)
    source = FaultySource(args.addr, args.name, http, timeout_s=10)
    held = 0
    record(0, "initial")
    while True:
        time.sleep(0.05)
        wanted = None
        if want_path.exists():
            wanted = int(want_path.read_text())
            want_path.unlink()
        elif (source.received() or 0) > held:
            wanted = source.received()
        if wanted is None:
            continue
        try:
            held = source.load_into(model, wanted)
            record(held, source.last_via)
        except WeightSyncError as exc:
            with log_path.open("a") as f:
                f.write(json.dumps({"error": str(exc)}) + "\n")


if __name__ == "__main__":
    main()
