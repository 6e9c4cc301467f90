"""Drafter exchange over HTTP: the trainer's ``TrainerApp`` serves its registry on loopback.

Real sockets end to end: rollout-side :class:`RemoteDrafterRegistry` clients submit candidates
to a started ``TrainerApp`` with :class:`DrafterEndpoints` mounted, the trainer-side directory
registry merges and publishes, and the clients read and load the result. Checked: the same
weights and metadata as the plain directory registry; a corrupted download or upload is
refused; a trainer that is down, silent or still starting gives a clear error naming the URL
after bounded retries; a rollout worker keeps its drafter when the exchange fails.
"""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import candidate_body, constant_drafter, post_candidate
from httpcall import free_port

from longtail_workers.drafter.exchange import (
    DrafterEndpoints,
    DrafterExchangeError,
    DrafterIntegrityError,
    DrafterNotFoundError,
    RemoteDrafterRegistry,
)
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.payload import pack_files
from longtail_workers.drafter.registry import CandidateInfo, DrafterRegistry
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.rollout.control import RolloutWorker
from longtail_workers.rollout.service import build_parser as rollout_parser
from longtail_workers.trainer.service import TrainerApp
from longtail_workers.weights.checksum import sha256_hex

TID = "tiny-remote"


# conftest.py's ``target`` fixture builds this policy
TARGET = dict(seed=3, vocab_size=32, hidden_size=32, intermediate_size=64, sharpness=10.0)


constant = functools.partial(constant_drafter, target_id=TID)


def serve(
    registry: DrafterRegistry | None, endpoints: DrafterEndpoints | None = None
) -> TrainerApp:
    app = TrainerApp("127.0.0.1", 0).start()
    if endpoints is None and registry is not None:
        endpoints = DrafterEndpoints(registry, policy_version=lambda: 2)  # the uploads' 1 and 2
    app.drafters = endpoints
    return app


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[tuple[TrainerApp, DrafterRegistry]]:
    registry = DrafterRegistry(tmp_path / "trainer-drafters")
    app = serve(registry)
    yield app, registry
    app.stop(grace_s=1.0)


def client(url: str, tmp_path: Path, name: str = "w", **kwargs: Any) -> RemoteDrafterRegistry:
    opts: dict[str, Any] = {"retries": 2, "backoff_s": 0.01, "timeout_s": 5.0, **kwargs}
    return RemoteDrafterRegistry(url, cache_dir=tmp_path / f"cache-{name}", **opts)


CANDIDATES = (("w-a", 1.0, 100, 0.5, 1.5), ("w-b", 4.0, 300, 0.7, None))


def submit_all(store: DrafterRegistry | RemoteDrafterRegistry, target, base: int | None) -> None:
    for worker, value, tokens, acc, loss in CANDIDATES:
        info = CandidateInfo(worker, base, 2, tokens, 5, train_loss=loss, heldout_top1=acc)
        store.submit_candidate(constant(target, value), info)


def test_submit_merge_latest_load_round_trip_matches_the_directory_registry(
    target, trainer, tmp_path
) -> None:
    app, registry = trainer
    workers = [client(app.url, tmp_path, name) for name in ("a", "b")]
    assert workers[0].latest_version() is None
    with pytest.raises(DrafterNotFoundError, match="no drafter version published yet"):
        workers[0].load(target, target_id=TID)
    registry.publish(constant(target, 0.0), policy_version=1)
    assert workers[1].latest_version() == 0
    submit_all(workers[0], target, base=0)
    assert [c.worker for c in registry.candidates(0)] == ["w-a", "w-b"]
    merged = registry.merge_candidates(target, target_id=TID)
    assert merged is not None and merged.version == 1

    local = DrafterRegistry(tmp_path / "local")  # the same steps on a shared directory
    local.publish(constant(target, 0.0), policy_version=1)
    submit_all(local, target, base=0)
    expected = local.merge_candidates(target, target_id=TID)
    assert expected is not None

    assert workers[1].latest_version() == 1
    got, info = workers[1].load(target, target_id=TID)
    want, _ = local.load(target, target_id=TID)
    assert info.version == 1 and not got.training
    for (name, a), (_, b) in zip(
        got.trainable_state_dict().items(), want.trainable_state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert all(torch.all(w == 3.25) for w in got.trainable_state_dict().values())
    skip = {"created_unix"}
    assert {k: v for k, v in info.meta.to_dict().items() if k not in skip} == {
        k: v for k, v in expected.meta.to_dict().items() if k not in skip
    }
    assert info.meta.merged_from == ("w-a", "w-b") and info.meta.trained_tokens == 400


def test_a_downloaded_version_is_cached_and_old_copies_pruned(target, trainer, tmp_path) -> None:
    app, registry = trainer
    for v in range(3):
        registry.publish(constant(target, float(v)), policy_version=v)
    worker = client(app.url, tmp_path, keep_versions=2)
    for v in range(3):
        worker.load(target, target_id=TID, version=v)
    assert sorted(p.name for p in worker.cache_dir.iterdir()) == ["000001", "000002"]
    app.stop(grace_s=1.0)  # the cached copy loads without the trainer
    drafter, info = worker.load(target, target_id=TID, version=2)
    assert info.version == 2 and float(drafter.fc.weight[0, 0].detach()) == 2.0
    with pytest.raises(DrafterExchangeError, match="failed after 3 attempt"):
        worker.load(target, target_id=TID, version=0)


def test_version_not_kept_is_a_not_found_error_naming_the_url(target, trainer, tmp_path) -> None:
    app, registry = trainer
    registry.publish(constant(target, 0.0), policy_version=0)
    with pytest.raises(DrafterNotFoundError, match=r"/v1/drafters/7: drafter version 7 is not"):
        client(app.url, tmp_path).load(target, target_id=TID, version=7)


class CorruptingEndpoints(DrafterEndpoints):
    """Flips one byte of every payload after hashing it: a transfer corrupted on the way."""

    def _payload(self, version: int) -> tuple[bytes, str]:
        data, checksum = super()._payload(version)
        return bytes([data[0] ^ 1]) + data[1:], checksum


def test_a_corrupted_download_is_refused_and_nothing_is_loaded(target, tmp_path) -> None:
    registry = DrafterRegistry(tmp_path / "reg")
    registry.publish(constant(target, 1.0), policy_version=0)
    app = serve(None, CorruptingEndpoints(registry, policy_version=lambda: 0))
    try:
        worker = client(app.url, tmp_path)
        with pytest.raises(DrafterIntegrityError, match=rf"{app.url}/v1/drafters/0: .*sha256"):
            worker.load(target, target_id=TID, version=0)
        assert not [p for p in worker.cache_dir.iterdir() if p.name.isdigit()]
    finally:
        app.stop(grace_s=1.0)


def test_an_upload_with_a_wrong_checksum_is_refused_and_not_stored(
    target, trainer, tmp_path
) -> None:
    app, registry = trainer
    body = candidate_body(constant(target, 1.0), tmp_path)
    query = "worker=w0&policy_version=1&tokens=5&steps=1"
    status, error = post_candidate(app.url, body, "0" * 64, query)
    assert status == 400 and "upload was corrupted" in error and sha256_hex(body) in error
    assert registry.candidates(None) == []
    status, _ = post_candidate(app.url, body, sha256_hex(body), query)
    assert status == 201 and [c.worker for c in registry.candidates(None)] == ["w0"]


@pytest.mark.parametrize(
    ("query", "body", "message"),
    [
        ("policy_version=1&tokens=5&steps=1", None, "worker: is required"),
        ("worker=w0&policy_version=one&tokens=5&steps=1", None, "policy_version: must be an int"),
        ("worker=w0&policy_version=1&tokens=5&steps=1&color=red", None, "color: not a candidate"),
        ("worker=w0&policy_version=1&tokens=5&steps=1", b"not a drafter", "not a drafter payload"),
        (
            "worker=w0&policy_version=1&tokens=5&steps=1",
            pack_files({"config.json": b"{}", "model.safetensors": b"x"}),
            "format None",
        ),
    ],
)
def test_malformed_uploads_get_400_naming_the_problem(
    target, trainer, tmp_path, query: str, body: bytes | None, message: str
) -> None:
    app, registry = trainer
    data = body if body is not None else candidate_body(constant(target, 1.0), tmp_path)
    status, error = post_candidate(app.url, data, sha256_hex(data), query)
    assert status == 400 and message in error, error
    assert registry.candidates(None) == []
    assert not list((registry.root / ".staging").iterdir())


def test_a_trainer_that_is_down_is_a_clear_error_after_bounded_retries(tmp_path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    worker = client(url, tmp_path, retries=3, backoff_s=0.05)
    started = time.monotonic()
    with pytest.raises(DrafterExchangeError) as info:
        worker.latest_version()
    assert time.monotonic() - started < 5.0
    text = str(info.value)
    assert f"GET {url}/v1/drafters/latest failed after 4 attempt(s)" in text
    assert "refused" in text and "--drafters-url" in text


def test_a_silent_trainer_times_out_instead_of_hanging(tmp_path) -> None:
    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        worker = client(url, tmp_path, retries=1, timeout_s=0.3)
        started = time.monotonic()
        with pytest.raises(DrafterExchangeError, match=rf"{url}/v1/drafters/latest .*timed out"):
            worker.latest_version()
        assert time.monotonic() - started < 5.0


def test_starting_trainer_answers_503_and_one_without_registry_404(tmp_path) -> None:
    app = serve(None)
    try:
        with pytest.raises(DrafterExchangeError, match="HTTP 503: trainer still starting"):
            client(app.url, tmp_path).latest_version()
        app.driver = object()  # type: ignore[assignment]  # started, but no --drafters
        with pytest.raises(DrafterExchangeError, match=r"answered 404 .*--drafters DIR"):
            client(app.url, tmp_path).latest_version()
    finally:
        app.stop(grace_s=1.0)


def test_worker_loads_published_versions_and_keeps_its_drafter_when_the_trainer_is_gone(
    target, trainer, tmp_path
) -> None:
    app, registry = trainer
    registry.publish(EagleDrafter(target, target_id=TID, seed=1), policy_version=0)
    remote = client(app.url, tmp_path, retries=1)
    worker = RolloutWorker(TorchEngine(target), target_id=TID, registry=remote)
    reqs = [GenerationRequest([1, 2, 3], max_new_tokens=4, seed=i) for i in range(2)]
    worker.generate(reqs)
    assert worker.drafter_version == 0
    app.stop(grace_s=1.0)
    worker.generate(reqs)  # the exchange fails: logged, generation goes on with version 0
    assert worker.drafter_version == 0


def test_rollout_cli_refuses_a_directory_and_a_url_together(capsys) -> None:
    args = rollout_parser().parse_args(["--job", "j.yaml", "--drafters-url", "http://t:8300"])
    assert args.drafters_url == "http://t:8300" and args.drafters is None
    with pytest.raises(SystemExit) as exit_info:
        rollout_parser().parse_args(
            ["--job", "j", "--drafters", "d", "--drafters-url", "http://t:1"]
        )
    assert exit_info.value.code == 2
    assert "--drafters-url: not allowed with argument --drafters" in capsys.readouterr().err
