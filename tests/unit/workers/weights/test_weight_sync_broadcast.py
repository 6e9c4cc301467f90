"""Policy weights by broadcast (#33): buckets and digests in process, then a world-1 trainer
broadcasting three versions over real gloo groups to rollout workers' weight sides running as
separate processes (``ws_receiver.py``), with a late joiner that catches up over HTTP and is in
the next broadcast (the group is reused while the members stay the same); a broadcast worker
started without its rendezvous or weights URL. The fault cases are in
``test_weight_sync_broadcast_faults.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from broadcast_harness import Cluster, expected_sha, go, policy
from broadcast_harness import cluster as cluster  # the fixture

from longtail_workers.jobspec import load_job_spec
from longtail_workers.rollout.service import build_parser
from longtail_workers.runtime import make_weight_source
from longtail_workers.weights.buckets import (
    bucket_count,
    bucket_digest,
    bucket_span,
    fill_buckets,
)
from longtail_workers.weights.checksum import serialize_state_dict, state_dict_checksum
from longtail_workers.weights.http_sync import HttpWeightClient
from longtail_workers.weights.membership import ADDR_ENV
from longtail_workers.weights.pieces import canonical_layout, metas_of, tensors_from_buffer
from longtail_workers.weights.store import publish_state_dict
from longtail_workers.weights.sync import TensorMeta

REPO = Path(__file__).resolve().parents[4]


def test_buckets_carry_the_canonical_bytes_in_the_wire_dtype() -> None:
    state = policy(1)
    wire = {k: v.to(torch.bfloat16) for k, v in state.items()}
    metas = [TensorMeta(m.name, torch.bfloat16, m.shape) for m in metas_of(state)]
    layout, header = canonical_layout(metas)
    size = len(header) + sum(m.nbytes for m in layout)
    bucket = 1000  # smaller than most tensors: they span buckets
    out = torch.zeros(size, dtype=torch.uint8)

    def target(k: int) -> torch.Tensor:
        start, stop = bucket_span(k, size, bucket)
        return out[start:stop]

    seen = list(fill_buckets(header, layout, (state[m.name] for m in layout), bucket, target))
    assert seen == list(range(bucket_count(size, bucket)))
    assert bytes(out.numpy()) == serialize_state_dict(wire)  # cast by the sender, canonical
    back = tensors_from_buffer(out)
    assert state_dict_checksum(back) == state_dict_checksum(wire)


def test_a_bucket_digest_sees_a_flipped_bit_and_swapped_rows() -> None:
    torch.manual_seed(0)
    buf = torch.randint(0, 256, (3 * 32768 + 13,), dtype=torch.uint8)
    digest = bucket_digest(buf)
    flipped = buf.clone()
    flipped[70000] ^= 1
    swapped = torch.cat([buf[32768:65536], buf[:32768], buf[65536:]])
    tail = buf.clone()
    tail[-1] ^= 4
    for other in (flipped, swapped, tail):
        assert not torch.equal(bucket_digest(other), digest)
    assert torch.equal(bucket_digest(buf.clone()), digest)


def test_three_versions_reach_every_receiver_and_a_late_joiner_catches_up(
    cluster: Cluster,
) -> None:
    cluster.spawn("rollout-0")
    cluster.spawn("rollout-1")
    cluster.wait_live(["rollout-0", "rollout-1"])
    for version in (1, 2, 3):
        names = ["rollout-0", "rollout-1"]
        if version == 3:  # joined after version 2: pulls it over HTTP, then is broadcast to
            cluster.spawn("rollout-2")
            cluster.wait_live(["rollout-2"])
            cluster.want("rollout-2", 2)
            event = cluster.wait_version("rollout-2", 2)
            assert event["via"] == "http" and event["sha"] == expected_sha(2)
            names.append("rollout-2")
        state = policy(version)
        published = publish_state_dict(cluster.store, version, state)
        manifest, phases = published.manifest(), published.phases
        assert phases is not None and phases.transport == "broadcast"
        assert (phases.receivers, phases.dropped, phases.attempts) == (names, [], 1)
        assert phases.bytes == manifest.size > 0 and len(manifest.pieces) > 10
        # The HTTP catch-up copy is the canonical bytes, hashed as HTTP publishes them.
        assert published.content_sha256() == state_dict_checksum(state)
        kept = cluster.server.store.get(version)
        assert kept is not None and bytes(kept.data) == serialize_state_dict(state)
        for name in names:
            event = cluster.wait_version(name, version)
            assert event["via"] == "broadcast", event
            assert event["sha"] == expected_sha(version), name
    # Attempt n carried version n: the same two members reused attempt 1's group for version
    # 2, and the third member made version 3 build a fresh one.
    groups = [go(cluster, n).group for n in (1, 2, 3)]
    assert groups == [1, 1, 3], groups


def test_a_broadcast_worker_without_its_rendezvous_or_weights_url_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = load_job_spec(REPO / "examples" / "01-tiny-arith.yaml")
    monkeypatch.delenv(ADDR_ENV, raising=False)
    args = build_parser().parse_args(["--job", "x", "--weight-sync", "broadcast"])
    with pytest.raises(ValueError, match="needs --weights-url too"):
        make_weight_source(args, spec)
    args.weights_url = "http://127.0.0.1:1"
    with pytest.raises(ValueError, match=f"--weight-sync-addr HOST:PORT .* or {ADDR_ENV}"):
        make_weight_source(args, spec)
    args.weight_sync_addr = "trainer-0"
    with pytest.raises(ValueError, match="'trainer-0' is not HOST:PORT"):
        make_weight_source(args, spec)
    args.weight_sync = None  # the job's transport: example 01 has no GPUs, so http
    assert isinstance(make_weight_source(args, spec), HttpWeightClient)
