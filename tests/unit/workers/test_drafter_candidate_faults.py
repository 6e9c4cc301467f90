"""Faults of issue #21, items 1-2: bad drafter candidates never reach a published version.

A candidate upload (the trainer's ``POST /v1/drafters/candidates``, real sockets) is checked
against the job's drafter: a weights file with no tensors, all-NaN weights of the right shapes,
another layout or another dtype each get a 400 naming the problem, nothing is stored and the
trainer's ``longtail_trainer_drafter_candidates_rejected_total`` counts it. A bad candidate that
reaches the registry some other way (in-process submit, written to disk) is skipped by the
merge, which publishes the good ones; a drafter with a NaN or an infinity is never published.
"""

from __future__ import annotations

import contextlib
import dataclasses
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save
from test_spot_remote import post_candidate  # conftest.py puts this directory on sys.path
from tiny_targets import tiny_qwen2

from longtail_workers.drafter.checkpoint import CONFIG_FILE, WEIGHTS_FILE, save_drafter
from longtail_workers.drafter.exchange import (
    DrafterEndpoints,
    DrafterExchangeError,
    RemoteDrafterRegistry,
)
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.payload import pack_files
from longtail_workers.drafter.registry import CandidateInfo, DrafterRegistry
from longtail_workers.drafter.vetting import DrafterReference, NonFiniteDrafterError
from longtail_workers.jobspec import load_job_spec
from longtail_workers.trainer.service import TrainerApp
from longtail_workers.trainer.setup import drafter_reference
from longtail_workers.weights.checksum import sha256_hex

TID = "tiny-faults"
QUERY = "worker=w0&policy_version=1&tokens=5&steps=1"


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    torch.set_num_threads(1)
    return tiny_qwen2(seed=3, vocab_size=32, hidden_size=32, intermediate_size=64)


def filled(target: torch.nn.Module, value: float, **layout: bool) -> EagleDrafter:
    drafter = EagleDrafter(target, target_id=TID, **layout)
    with torch.no_grad():
        for p in drafter.parameters():
            p.fill_(value)
    return drafter


@contextlib.contextmanager
def started_trainer(
    target: torch.nn.Module, root: Path, target_id: str
) -> Iterator[tuple[TrainerApp, DrafterRegistry]]:
    """A started trainer whose registry checks candidates against the job's drafter (also
    used by ``test_drafter_candidate_trust.py``)."""
    app = TrainerApp("127.0.0.1", 0).start()
    registry = DrafterRegistry(
        root / "drafters",
        reference=DrafterReference.of(EagleDrafter(target, target_id=target_id)),
        on_rejected=app.metrics.candidate_rejected,
    )
    app.drafters = DrafterEndpoints(registry)
    try:
        yield app, registry
    finally:
        app.stop(grace_s=1.0)


@pytest.fixture
def trainer(target, tmp_path: Path) -> Iterator[tuple[TrainerApp, DrafterRegistry]]:
    with started_trainer(target, tmp_path, TID) as started:
        yield started


def rejected_metric(app: TrainerApp, stage: str) -> float:
    text = urllib.request.urlopen(app.url + "/metrics", timeout=5.0).read().decode()
    line = f'longtail_trainer_drafter_candidates_rejected_total{{stage="{stage}"}} '
    found = [ln for ln in text.splitlines() if ln.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def test_a_weights_file_with_no_tensors_is_refused_with_400_and_not_stored(
    target, trainer, tmp_path
) -> None:
    app, registry = trainer
    directory = save_drafter(filled(target, 1.0), tmp_path / "cand")
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
        client.submit_candidate(filled(target, float("nan")), info)
    assert "non-finite weights" in str(err.value) and "fc.weight" in str(err.value)
    assert registry.candidates(None) == [] and registry.rejected["upload"] == 1


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda t: filled(t, 1.0, input_norm=False, fc_bias=False), "missing tensors"),
        (lambda t: filled(t, 1.0).to(torch.float64), "dtype='float64'"),
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
    reg = DrafterRegistry(tmp_path, on_rejected=lambda stage, w, why: refused.append((w, why)))
    base = reg.publish(filled(target, 0.0), policy_version=0)

    def info(worker: str) -> CandidateInfo:
        return CandidateInfo(worker, base.version, policy_version=1, tokens=10, steps=1)

    reg.submit_candidate(filled(target, 0.5), info("a-good"))
    reg.submit_candidate(filled(target, float("nan")), info("b-nan"))
    empty = reg.submit_candidate(filled(target, 0.5), info("c-empty"))
    (empty.path / WEIGHTS_FILE).write_bytes(save({}))  # bypassed the upload check
    merged = reg.merge_candidates(target, target_id=TID)
    assert merged is not None and merged.meta.merged_from == ("a-good",)
    drafter, _ = reg.load(target, target_id=TID)
    assert all(bool(torch.isfinite(p).all()) for p in drafter.parameters())
    assert [w for w, _ in refused] == ["b-nan", "c-empty"] and reg.rejected["merge"] == 2
    assert "non-finite" in refused[0][1] and "holds no tensors" in refused[1][1]


def test_an_all_nan_merge_is_never_published(target, tmp_path) -> None:
    reg = DrafterRegistry(tmp_path)
    base = reg.publish(filled(target, 0.0), policy_version=0)
    info = CandidateInfo("w0", base.version, policy_version=1, tokens=10, steps=1)
    reg.submit_candidate(filled(target, float("nan")), info)
    assert reg.merge_candidates(target, target_id=TID) is None
    assert reg.latest_version() == base.version and reg.versions() == [base.version]
    with pytest.raises(NonFiniteDrafterError, match="non-finite"):
        reg.publish(filled(target, float("inf")), policy_version=2)
    assert reg.versions() == [base.version]


def test_the_trainers_reference_is_the_jobs_drafter(target, tmp_path) -> None:
    spec = load_job_spec(Path(__file__).resolve().parents[3] / "examples" / "01-tiny-arith.yaml")
    # Example 01 starts from builtin:tiny's drafter; this target is a test model: a fresh one.
    spec.drafter_training.initial_drafter = None
    reference = drafter_reference(spec, target)
    assert reference is not None and "fc.bias" in reference.tensors
    spec.drafter_training = dataclasses.replace(spec.drafter_training, layout="eagle1")
    eagle1 = drafter_reference(spec, target)
    assert eagle1 is not None and "fc.bias" not in eagle1.tensors
    missing = str(tmp_path / "not-mounted-here")
    spec.drafter_training = dataclasses.replace(spec.drafter_training, initial_drafter=missing)
    assert drafter_reference(spec, target) is None  # checked against each other, with a warning
