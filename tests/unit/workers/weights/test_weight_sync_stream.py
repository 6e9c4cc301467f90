"""Policy versions streamed from the (sharded) trainer as it gathers them (issue #33, deliverables 3
and 5).

World 2: two ``sharded_rank.py`` processes (a real gloo group; rank 0 leads, rank 1 follows, as
in ``longtail worker trainer``) publish three versions over real loopback HTTP, each a pass of
per-tensor gathers that every rank runs and rank 0 packs into hashed pieces as they arrive;
checked against the whole state dict gathered the old way at the same point, and against what a
rollout client pulls. A transport that stops mid-pass, or retries with a new pass, leaves no
rank in a gather; a rank SIGKILLed mid-sync fails the publish with an error naming it. World 1:
the stream is the model's own tensors; a bf16 rollout engine gets bf16 bytes; a stream that
does not match its layout is refused.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import sharded_rank
import torch
from test_trainer_sharded import run_world

from longtail_workers.jobspec import load_job_spec
from longtail_workers.trainer.group import PolicyLeader
from longtail_workers.trainer.policy import Policy, wire_dtype
from longtail_workers.trainer.sharding import wire_layout
from longtail_workers.trainer.world import TrainerWorld
from longtail_workers.weights.checksum import state_dict_checksum
from longtail_workers.weights.http_sync import HttpWeightClient, WeightServer
from longtail_workers.weights.pieces import canonical_layout
from longtail_workers.weights.store import WeightStore
from longtail_workers.weights.sync import TensorMeta

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "01-tiny-arith.yaml"


@pytest.fixture(scope="module")
def world2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("publish")
    for rank, (rc, text) in enumerate(run_world("publish", out)):
        assert rc == 0, f"rank {rank} exited {rc}:\n{text[-3000:]}"
    result: dict[str, Any] = torch.load(out / "result.pt", weights_only=False)
    return result


def test_a_world_2_trainer_streams_three_versions_whose_bytes_are_the_gathered_states(
    world2: dict[str, Any],
) -> None:
    versions = world2["versions"]
    assert len(versions) == 3
    for seen in versions:  # published == pulled over HTTP == the world-1 bytes of the gathered
        assert seen["manifest"] == seen["pulled"] == seen["gathered"], seen
        assert seen["pieces"] > 5
        phases = seen["phases"]
        assert phases.transport == "http" and phases.gather_s > 0 and phases.bytes > 0
    assert len({seen["manifest"] for seen in versions}) == 3  # the updates moved the weights
    # The layout is the whole model's: the global shapes a world-1 trainer publishes.
    whole = sharded_rank.tiny_policy(TrainerWorld())
    assert versions[0]["layout"] == wire_layout(whole.model, None)
    assert versions[0]["manifest"] == state_dict_checksum(whole.model.state_dict())


def test_a_pass_a_transport_leaves_unfinished_is_drained_on_every_rank(
    world2: dict[str, Any],
) -> None:
    # Version 2's first publisher took two tensors and failed; version 3's took three, then
    # published from a second pass. Both ranks went on (train, publish) and exited 0, so no rank
    # was left in a gather; the retried pass gave the same bytes as the next publish.
    assert world2["stopped_early"] == "receiver lost after two tensors"
    assert world2["retried"] == world2["versions"][2]["manifest"]


def test_trainer_rank_1_killed_mid_sync_fails_the_publish_naming_it(tmp_path: Path) -> None:
    (rc0, text0), (rc1, _) = run_world("killsync", tmp_path)
    assert rc1 == -9  # SIGKILLed in the middle of its second pass
    assert rc0 == 0, text0[-3000:]
    error = (tmp_path / "error.txt").read_text()
    assert (
        "trainer rank(s) 1 of 2 stopped during gathering the policy weights for a weight sync"
        in error
    ), error
    assert "\nranks=[1]\n" in error
    seconds = float(re.findall(r"seconds=([\d.]+)", error)[0])
    assert seconds < 60, error  # named within the diagnosis time, not a collective timeout


def test_at_world_1_the_stream_is_the_models_own_tensors() -> None:
    torch.set_num_threads(1)
    policy = sharded_rank.tiny_policy(TrainerWorld())
    own = policy.model.state_dict()
    tensors = list(policy.gather_pass())
    assert [t.data_ptr() for t in tensors] == [own[m.name].data_ptr() for m in policy.layout]
    assert policy.wire_is_native
    published = PolicyLeader(policy).publish(WeightStore(piece_bytes=4096), 1)
    assert published.content_sha256() == state_dict_checksum(own)
    assert published.phases.pack_s > 0


def test_a_bf16_engine_gets_bf16_bytes_cast_by_the_trainer() -> None:
    torch.set_num_threads(1)
    base = sharded_rank.tiny_policy(TrainerWorld())
    policy = Policy(base.model, base.cfg, base.world, wire_dtype=torch.bfloat16)
    assert not policy.wire_is_native and {m.dtype for m in policy.layout} == {torch.bfloat16}
    with WeightServer(WeightStore(piece_bytes=4096)) as server:
        published = PolicyLeader(policy).publish(server.store, 1)
        manifest = published.manifest()
        _, pulled = HttpWeightClient(server.url, timeout_s=30).fetch(1)
    cast = {k: v.to(torch.bfloat16) for k, v in policy.model.state_dict().items()}
    assert published.content_sha256() == state_dict_checksum(cast) == state_dict_checksum(pulled)
    assert set(manifest.dtypes.values()) == {"bfloat16"}


def test_the_wire_dtype_is_the_rollout_engines() -> None:
    example = load_job_spec(EXAMPLE)
    spec = dataclasses.replace(example, model=dataclasses.replace(example.model, dtype="auto"))
    assert wire_dtype(spec) == torch.float32  # CPU rollout workers
    gpus = dataclasses.replace(spec.rollout.resources, gpus=1)
    on_gpus = dataclasses.replace(spec, rollout=dataclasses.replace(spec.rollout, resources=gpus))
    assert wire_dtype(on_gpus) == torch.bfloat16


def test_a_stream_that_does_not_match_its_layout_is_refused_and_nothing_published() -> None:
    state = {"b": torch.ones(3), "a": torch.arange(4.0), "n": torch.arange(2)}
    layout, _ = canonical_layout([TensorMeta(k, v.dtype, tuple(v.shape)) for k, v in state.items()])
    store = WeightStore(piece_bytes=8)
    tensors = [state[m.name] for m in layout]
    cases = {
        r"ended after 2 of 3 tensors": (layout, tensors[:2]),
        r"more than the layout's 3 tensors": (layout, [*tensors, torch.ones(1)]),
        r"tensor 'b': the stream gave \(2,\), the layout says shape \(3,\)": (
            layout,
            [torch.ones(2) if m.name == "b" else state[m.name] for m in layout],
        ),
        r"not in canonical order": (layout[::-1], tensors[::-1]),
        r"tensor 'n': torch.float32 cannot travel as torch.int64": (
            layout,
            [state[m.name].float() for m in layout],
        ),
    }
    for pattern, (metas, given) in cases.items():
        with pytest.raises(ValueError, match=pattern):
            store.publish_stream(1, metas, lambda given=given: iter(given))  # type: ignore[misc]
    assert store.versions() == []
    assert store.publish_stream(1, layout, lambda: iter(tensors)).content_sha256() == (
        state_dict_checksum(state)
    )
