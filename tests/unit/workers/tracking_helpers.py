"""Helpers of the tracking tests: a run's realistic step rows, a tracked job spec, and a reader
of W&B's ``.wandb`` files.

The rows follow what the trainer writes for ``examples/01`` on a CPU (one per step: rewards
rising, a long tail of answer lengths, the optimizer's statistics, speculation once the
drafter warms up). W&B 0.31 has no Python reader of its run files any more (their reading moved
into its Go service), so :func:`wandb_records` reads the LevelDB-log framing W&B writes and
decodes each record with W&B's own protobuf (``wandb.proto.wandb_internal_pb2.Record``).
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from longtail_api.spec import RLJobSpec
from longtail_api.steprow import StepRow
from longtail_api.validation import parse

WANDB_BLOCK = 32768
"""LevelDB log block size; a record header never straddles a block's end."""


def tracked_spec(tracking: dict[str, Any], **spec: Any) -> RLJobSpec:
    doc = {"model": {"path": "builtin:tiny"}, "dataset": {"path": "builtin:arith"},
           "tracking": tracking, **spec}  # fmt: skip
    parsed, errors = parse(RLJobSpec, doc, "spec")
    assert parsed is not None and not errors, errors
    return parsed


def step_rows(n: int, seed: int = 0) -> list[StepRow]:
    """``n`` rows as the trainer writes them (see the module text)."""
    rng = random.Random(seed)
    rows = []
    for step in range(1, n + 1):
        lengths = [min(256, int(rng.paretovariate(1.5) * 12)) for _ in range(128)]
        acc = min(0.95, 0.3 + 0.02 * step + rng.uniform(-0.03, 0.03))
        spec_on = step > 2
        data = {
            "step": step, "policy_version": step, "drafter_version": step - 3 if spec_on else -1,
            "reward_mean": acc, "reward_std": (acc * (1 - acc)) ** 0.5, "accuracy": acc,
            "answers": 128, "mean_length": sum(lengths) / 128, "max_length": max(lengths),
            "rollout_s": 0.8 + rng.uniform(0, 0.2), "tail_s": 0.35, "train_s": 1.0,
            "sync_s": 0.015, "step_s": 1.9, "sd_fraction": 0.28 if spec_on else 0.0,
            "mean_accepted_length": 3.6 if spec_on else 0.0,
            "sd_fraction_by_source": {"learned": 0.28} if spec_on else {},
            "accepted_length_by_source": {"learned": 3.6} if spec_on else {},
            "train_loss": -0.36, "train_kl_ref": 0.001 * step, "train_approx_kl": 2.6e-9,
            "train_clip_fraction": 0.0, "train_grad_norm": 0.3 + 0.01 * step,
            "train_learning_rate": 1e-4, "train_entropy": 0.9 - 0.02 * step,
            "trainer_harvested_s": 0.0,
            "response_lengths": lengths, "prompt_lengths": [30] * 64,
        }  # fmt: skip
        if step % 5 == 0:
            data["eval_accuracy"] = acc - 0.05
        rows.append(StepRow.from_dict(data))
    return rows


def wandb_records(path: Path) -> Iterator[Any]:
    """Every record of a ``run-ID.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), "not a W&B run file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = WANDB_BLOCK - pos % WANDB_BLOCK
        if left < 7:  # the block's zero-filled trailer
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding up to the block's end
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, or the LAST piece of a record split over blocks
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_history(path: Path, timeout_s: float = 30.0) -> dict[int, dict[str, float]]:
    """The run file's history rows by ``_step``: key -> value. Waits (bounded) for the run's
    ``exit`` record: W&B's writer (the wandb-core process) may still be writing the file when
    ``run.finish()`` has returned, and it writes the exit record last."""
    import json
    import time

    from google.protobuf.message import DecodeError

    def finished() -> bool:
        try:
            return any(r.WhichOneof("record_type") == "exit" for r in wandb_records(path))
        except (OSError, AssertionError, struct.error, DecodeError):  # absent, or mid-write
            return False

    deadline = time.monotonic() + timeout_s
    while not finished():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path}: no exit record within {timeout_s} s")
        time.sleep(0.1)
    out: dict[int, dict[str, float]] = {}
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                   for i in record.history.item}  # fmt: skip
            out[int(row["_step"])] = row
    return out
