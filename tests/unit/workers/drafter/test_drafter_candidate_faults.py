"""Faults of issue #21, items 1-2: bad drafter candidates never reach a published version.

A candidate upload (the trainer's ``POST /v1/drafters/candidates``, real sockets) is checked
against the job's drafter: a weights file with no tensors, all-NaN weights of the right shapes,
another layout or another dtype each get a 400 naming the problem, nothing is stored and the
trainer's ``longtail_trainer_drafter_candidates_rejected_total`` counts it. A bad candidate that
reaches the registry some other way (in-process submit, written to disk) is skipped by the
merge, which publishes the good ones; a drafter with a NaN or an infinity is never published.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
import torch
from helpers import constant_drafter, post_candidate, rejected_metric
from safetensors.torch import save

from longtail_workers.drafter.checkpoint import CONFIG_FILE, WEIGHTS_FILE, save_drafter
from longtail_workers.drafter.exchange import (
    DrafterExchangeError,
    RemoteDrafterRegistry,
)
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.payload import pack_files
from longtail_workers.drafter.registry import CandidateInfo, DrafterRegistry
from longtail_workers.drafter.vetting import NonFiniteDrafterError
from longtail_workers.jobspec import load_job_spec
from longtail_workers.trainer.setup import drafter_parts
from longtail_workers.trainer.world import TrainerWorld
from longtail_workers.weights.checksum import sha256_hex

TID = "tiny-faults"
QUERY = "worker=w0&policy_version=1&tokens=5&steps=1"


TARGET = dict(
    seed=3, vocab_size=32, hidden_size=32, intermediate_size=64
)  # conftest.py's ``target``


constant = functools.partial(constant_drafter, target_id=TID)


def test_a_weights_file_with_no_tensors_is_refused_with_400_and_not_stored(
    target, trainer, tmp_path
) -> None:
    app, registry = trainer
    directory = save_drafter(constant(target, 1.0), tmp_path / "cand")
    body = pack_files({CONFIG_FILE: (directory / CONFIG_FILE).read_bytes(), WEIGHTS_FILE: save({})})
    status, error = post_candidate(app.url, body, sha256_hex(body), QUERY)
    assert status == 400 and "holds no tensors" in error, error
    assert registry.candidates(None) == []
    assert not list((registry.root / ".staging").iterdir())
    assert rejected_metric(app, "upload") == 1.0
    assert registry.merge_candidates(target, target_id=TID) is None  # the run goes on


def test_an_all_nan_candidate_is_refused_at_upload(target, trainer, tmp_path) -> None:
    app, registry = trainer
    client = RemoteDrafterRegistry(app.url, cache_dir=tmp_path / "cache", retries=0)
    with pytest.raises(DrafterExchangeError, match="HTTP 400") as err:
        info = CandidateInfo(worker="w0", base_version=None, policy_version=1, tokens=5, steps=1)
        client.submit_candidate(constant(target, float("nan")), info)
    assert "non-finite weights" in str(err.value) and "fc.weight" in str(err.value)
    assert registry.candidates(None) == [] and registry.rejected["upload"] == 1


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda t: constant(t, 1.0, input_norm=False, fc_bias=False), "missing tensors"),
        (lambda t: constant(t, 1.0).to(torch.float64), "dtype='float64'"),
    ],
)
def test_a_candidate_of_another_layout_or_dtype_is_refused(
    target, trainer, tmp_path, make, message: str
) -> None:
    app, registry = trainer
    directory = save_drafter(make(target), tmp_path / "cand")
    body = pack_files({p.name: p.read_bytes() for p in directory.iterdir()})
    status, error = post_candidate(app.url, body, sha256_hex(body), QUERY)
    assert status == 400 and message in error and "not the job's drafter" in error, error
    assert registry.candidates(None) == []


def test_the_merge_skips_bad_candidates_and_publishes_the_good_one(target, tmp_path) -> None:
    refused: list[tuple[str, str]] = []
    reg = DrafterRegistry(tmp_path, on_rejected=lambda r: refused.append((r.worker, r.message)))
    base = reg.publish(constant(target, 0.0), policy_version=0)

    def info(worker: str) -> CandidateInfo:
        return CandidateInfo(worker, base.version, policy_version=1, tokens=10, steps=1)

    reg.submit_candidate(constant(target, 0.5), info("a-good"))
    reg.submit_candidate(constant(target, float("nan")), info("b-nan"))
    empty = reg.submit_candidate(constant(target, 0.5), info("c-empty"))
    (empty.path / WEIGHTS_FILE).write_bytes(save({}))  # bypassed the upload check
    merged = reg.merge_candidates(target, target_id=TID)
    assert merged is not None and merged.meta.merged_from == ("a-good",)
    drafter, _ = reg.load(target, target_id=TID)
    assert all(bool(torch.isfinite(p).all()) for p in drafter.parameters())
    assert [w for w, _ in refused] == ["b-nan", "c-empty"] and reg.rejected["merge"] == 2
    assert "non-finite" in refused[0][1] and "holds no tensors" in refused[1][1]


def test_an_all_nan_merge_is_never_published(target, tmp_path) -> None:
    reg = DrafterRegistry(tmp_path)
    base = reg.publish(constant(target, 0.0), policy_version=0)
    info = CandidateInfo("w0", base.version, policy_version=1, tokens=10, steps=1)
    reg.submit_candidate(constant(target, float("nan")), info)
    assert reg.merge_candidates(target, target_id=TID) is None
    assert reg.latest_version() == base.version and reg.versions() == [base.version]
    with pytest.raises(NonFiniteDrafterError, match="non-finite"):
        reg.publish(constant(target, float("inf")), policy_version=2)
    assert reg.versions() == [base.version]


def test_the_trainers_reference_is_the_jobs_drafter_built_once(
    target, tmp_path, monkeypatch
) -> None:
    spec = load_job_spec(Path(__file__).resolve().parents[4] / "examples" / "01-tiny-arith.yaml")
    # Example 01 starts from builtin:tiny's drafter; this target is a test model: a fresh one.
    spec.drafter_training.initial_drafter = None
    spec.harvest.eligible_roles = ["rollout", "trainer"]
    builds: list[EagleDrafter] = []
    build = EagleDrafter.__init__
    monkeypatch.setattr(
        EagleDrafter, "__init__", lambda d, *a, **k: builds.append(d) or build(d, *a, **k)
    )
    registry, checks, harvest = drafter_parts(spec, target, str(tmp_path / "d"), TrainerWorld())
    assert registry is not None and registry.reference is not None and checks is not None
    assert "fc.bias" in registry.reference.tensors
    # One build: the checks keep it, the trainer's harvest trains a copy of it.
    assert builds == [checks.initial] and harvest is not None
    assert harvest.windows.spot.drafter is not checks.initial
    spec.drafter_training = dataclasses.replace(spec.drafter_training, layout="eagle1")
    eagle1 = drafter_parts(spec, target, str(tmp_path / "e"), TrainerWorld())[0]
    assert eagle1 is not None and eagle1.reference is not None
    assert "fc.bias" not in eagle1.reference.tensors
    missing = str(tmp_path / "not-mounted-here")
    spec.drafter_training = dataclasses.replace(spec.drafter_training, initial_drafter=missing)
    with pytest.raises(ValueError, match="cannot read drafterTraining"):
        drafter_parts(spec, target, str(tmp_path / "f"), TrainerWorld())
    spec.harvest.eligible_roles = ["rollout"]
    unread = drafter_parts(spec, target, str(tmp_path / "g"), TrainerWorld())[0]
    assert unread is not None and unread.reference is None  # checked against each other
