"""Weight sync's typed seams (issue #51 item 4): the records that cross processes go through the
wire codec with a closed set of outcomes, one function decides the transport plan for every
side, and the trainer's store takes at most one delivery that packs while it sends."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from longtail_api.protocol import ProtocolError
from longtail_workers.jobspec import load_job_spec
from longtail_workers.weights.http_sync import Latest
from longtail_workers.weights.plan import BroadcastConfig, sync_plan
from longtail_workers.weights.records import (
    Ack,
    AttemptRecord,
    Go,
    Held,
    Report,
    decode,
    encode,
)
from longtail_workers.weights.store import Delivery, Outgoing, WeightStore, publish_state_dict
from longtail_workers.weights.sync import TensorStream, WeightsManifest

REPO = Path(__file__).resolve().parents[4]


def test_every_record_round_trips_through_the_wire_codec() -> None:
    records = [
        AttemptRecord(3, 4096, 1024, ["rollout-0", "rollout-1"], "cuda"),
        Ack(2),
        Go(["rollout-1"], 2),
        Held(7),
        Report("ok"),
        Report("refused", "version 3: bucket(s) [1] of 4 failed their digest"),
    ]
    for record in records:
        assert decode(type(record), encode(record).encode(), "key") == record
    wire = json.loads(encode(AttemptRecord(3, 4096, 1024, ["a"], "cpu")))
    assert wire == {"version": 3, "size": 4096, "bucketBytes": 1024, "members": ["a"],
                    "device": "cpu"}  # fmt: skip


def test_a_report_outside_the_closed_set_of_outcomes_is_refused_naming_the_field() -> None:
    with pytest.raises(ProtocolError, match=r"ws/done\.outcome: must be one of 'ok', 'refused'"):
        decode(Report, '{"outcome": "refused: bucket 3"}', "ws/done")
    with pytest.raises(ProtocolError, match=r"ws/go\.group: must be >= 0"):
        decode(Go, '{"members": [], "group": -1}', "ws/go")
    with pytest.raises(ProtocolError, match=r"ws/held: not JSON"):
        decode(Held, b"12abc", "ws/held")
    assert str(Report("failed", "no go")) == "failed: no go" and str(Report("ok")) == "ok"


def test_the_manifest_travels_as_the_codec_writes_it() -> None:
    store = WeightStore(piece_bytes=64)
    manifest = publish_state_dict(store, 1, {"w": torch.arange(40.0)}).manifest()
    wire = json.loads(encode(Latest(manifest)))["manifest"]
    assert set(wire) == {"version", "size", "dtypes", "pieceBytes", "pieces", "piecesSha256"}
    assert wire["pieces"][0] == {"offset": 0, "size": 64, "sha256": manifest.pieces[0].sha256}
    assert decode(Latest, encode(Latest(manifest)), "body").manifest == manifest
    assert decode(Latest, '{"manifest": null}', "body").manifest is None
    broken = dict(wire, pieces=[{"offset": 0, "size": "64", "sha256": "x"}])
    with pytest.raises(ProtocolError, match=r"body\.pieces\[0\]\.size: must be an integer"):
        decode(WeightsManifest, json.dumps(broken), "body")


def test_one_plan_for_every_side_with_auto_resolved_by_gpus() -> None:
    spec = load_job_spec(REPO / "examples" / "01-tiny-arith.yaml")  # no GPUs
    assert sync_plan(spec, None).transport == "http"
    assert sync_plan(spec, "auto").transport == "http"
    plan = sync_plan(spec, "broadcast")
    assert plan.transport == "broadcast"
    assert plan.broadcast == BroadcastConfig(
        bucket_bytes=spec.weight_sync.bucket_mb << 20,
        phase_timeout_s=float(spec.weight_sync.phase_timeout_seconds),
        device="cpu",
    )
    gpus = dataclasses.replace(spec.trainer.resources, gpus=1)
    on_gpus = dataclasses.replace(
        spec,
        trainer=dataclasses.replace(spec.trainer, resources=gpus),
        rollout=dataclasses.replace(spec.rollout, resources=gpus),
    )
    assert sync_plan(on_gpus, None).transport == "broadcast"
    assert sync_plan(on_gpus, None).broadcast.device == "cuda"
    assert sync_plan(on_gpus, "http").transport == "http"
    with pytest.raises(ValueError, match="weight sync 'dist': use auto, http or broadcast"):
        sync_plan(spec, "dist")


class Sender(Delivery):
    """A delivery that packs the store's copy itself, as the broadcast does."""

    transport = "broadcast"
    sends = True
    piece_bytes = 16

    def __init__(self) -> None:
        self.told: list[int] = []

    def send(self, out: Outgoing, tensors: TensorStream | None) -> None:
        raise AssertionError("not published here")

    def close(self) -> None:
        self.told.append(-1)


def test_a_store_takes_one_sending_delivery_and_closes_every_delivery() -> None:
    store = WeightStore()
    first, second = Sender(), Sender()
    store.attach(first)
    with pytest.raises(ValueError, match="already has a delivery that packs while it sends"):
        store.attach(second)
    store.close()
    assert first.told == [-1] and second.told == []
