"""Drafter versions: atomic publishing, token-weighted merge, loading at rollout boundaries."""

from __future__ import annotations

import functools
import threading

import pytest
import torch
from helpers import constant_drafter, fixed_sd
from safetensors.torch import load_file

from longtail_workers.drafter.merge import merge_state_dicts
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.registry import CandidateInfo, DrafterRegistry, VersionConflictError
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.specdec import DraftTrace
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.rollout.control import RolloutWorker

TID = "tiny-pub"


# conftest.py's ``target`` fixture builds this policy
TARGET = dict(seed=2, vocab_size=32, hidden_size=32, intermediate_size=64, sharpness=10.0)


constant = functools.partial(constant_drafter, target_id=TID)


def test_publish_versions_and_metadata(target, tmp_path) -> None:
    reg = DrafterRegistry(tmp_path, keep_versions=2)
    assert reg.latest() is None
    v0 = reg.publish(constant(target, 0.5), policy_version=3, train_loss=1.5, trained_tokens=10)
    v1 = reg.publish(constant(target, 1.0), policy_version=4, heldout_top1=0.25, steps=7)
    assert (v0.version, v1.version) == (0, 1) and v1.meta.parent_version == 0
    latest = reg.latest()
    assert latest is not None and latest.meta.policy_version == 4
    assert (latest.meta.heldout_top1, latest.meta.steps) == (0.25, 7)
    loaded, info = reg.load(target, target_id=TID)
    assert (
        info.version == 1 and float(loaded.fc.weight[0, 0].detach()) == 1.0 and not loaded.training
    )
    reg.publish(constant(target, 2.0), policy_version=5)
    assert reg.versions() == [1, 2]  # keep_versions=2: version 0 was collected
    with pytest.raises(VersionConflictError, match="latest"):
        reg.publish(constant(target, 3.0), policy_version=5, expected_parent=1)


def test_a_concurrent_reader_never_sees_half_a_version(target, tmp_path) -> None:
    """Version v's weights are all == v; a reader checks every read against version.json."""
    reg = DrafterRegistry(tmp_path, keep_versions=3)
    reg.publish(constant(target, 0.0), policy_version=0)
    done, seen, errors = threading.Event(), set(), []

    def reader() -> None:
        reader_reg = DrafterRegistry(tmp_path, keep_versions=3)
        while not done.is_set():
            try:
                drafter, info = reader_reg.load(target, target_id=TID)
            except BaseException as exc:  # any failure is a finding, reported below
                errors.append(repr(exc))
                raise
            values = {float(v) for p in drafter.parameters() for v in p.detach().unique()}
            if values != {float(info.version)}:
                errors.append(f"version {info.version} has weights {sorted(values)[:3]}")
            seen.add(info.version)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for v in range(1, 25):
            reg.publish(constant(target, float(v)), policy_version=v)
    finally:
        done.set()
        t.join(30.0)
    assert not errors, errors[:3]
    assert len(seen) >= 3  # the reader really raced the writer
    assert not list((tmp_path / ".staging").iterdir())


def test_merge_state_dicts_is_token_weighted() -> None:
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([4.0, -2.0]), "b": torch.tensor([8.0])}
    merged = merge_state_dicts([(a, 100), (b, 300)])
    assert merged["w"].tolist() == [3.25, -1.0] and merged["b"].tolist() == [6.0]
    assert merge_state_dicts([(a, 0), (b, 5)])["w"].tolist() == [4.0, -2.0]
    with pytest.raises(ValueError, match="0 tokens"):
        merge_state_dicts([(a, 0), (b, 0)])
    with pytest.raises(ValueError, match="different weights"):
        merge_state_dicts([(a, 1), ({"w": a["w"]}, 1)])


def test_merge_two_workers_candidates(target, tmp_path) -> None:
    reg = DrafterRegistry(tmp_path)
    base = reg.publish(constant(target, 0.0), policy_version=1)
    for worker, value, tokens, acc in (("w-a", 1.0, 100, 0.5), ("w-b", 4.0, 300, 0.7)):
        info = CandidateInfo(worker, base.version, 2, tokens, 5, train_loss=1.0, heldout_top1=acc)
        reg.submit_candidate(constant(target, value), info)
    merged = reg.merge_candidates(target, target_id=TID)
    assert merged is not None and merged.version == 1 and merged.meta.parent_version == 0
    weights = load_file(str(merged.path / "model.safetensors"))
    assert all(torch.all(w == 3.25) for w in weights.values())  # (100*1 + 300*4) / 400
    assert merged.meta.merged_from == ("w-a", "w-b") and merged.meta.trained_tokens == 400
    assert merged.meta.heldout_top1 == pytest.approx(0.65) and merged.meta.heldout_top1_is_estimate
    assert merged.meta.policy_version == 2
    assert reg.candidates(base.version) == []  # collected once the next version is out
    assert reg.merge_candidates(target, target_id=TID) is None  # nothing trained since


def test_engine_loads_new_versions_between_rollouts_only(target, tmp_path) -> None:
    reg = DrafterRegistry(tmp_path)
    reg.publish(EagleDrafter(target, target_id=TID, seed=1), policy_version=0)
    used: list[float] = []  # a fingerprint of the weights the engine drafts with

    def observer(trace: DraftTrace) -> None:
        used.append(float(engine.sd.drafter.fc.weight.sum()))
        if len(used) == 1:  # a new version appears in the middle of the rollout
            reg.publish(EagleDrafter(target, target_id=TID, seed=2), policy_version=0)

    engine = TorchEngine(
        target,
        speculative=fixed_sd(depth=2),
        drafter=EagleDrafter(target, target_id=TID),
        draft_observer=observer,
    )
    worker = RolloutWorker(engine, target_id=TID, registry=reg)
    reqs = [GenerationRequest([1, 2, 3], max_new_tokens=12, seed=i) for i in range(3)]
    worker.generate(reqs)
    assert worker.drafter_version == 0 and len(set(used)) == 1 and len(used) > 1
    first = used[0]
    worker.generate(reqs)
    assert worker.drafter_version == 1 and used[-1] != first
    assert worker.acceptance.by_drafter()[0].spec_steps > 0
