"""Policy weights pulled in pieces over real loopback HTTP (issue #33, deliverables 1 and 5).

Every fault goes through :class:`FaultyProxy`, a real HTTP server between the rollout client
and the trainer's :class:`WeightServer` that forwards each request and, on the piece a test
names, flips a byte, publishes a newer version (evicting the one being pulled) or stops
serving. The client only ever talks HTTP to the proxy, as it would to a trainer.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any

import pytest
import torch
from starlette.routing import Route
from test_weight_sync import assert_same, snapshot, tiny_model

from longtail_workers import httpclient
from longtail_workers.httprequest import JSONRequestHandler
from longtail_workers.httpserver import BackgroundHTTPServer, route
from longtail_workers.weights.checksum import serialize_state_dict, state_dict_checksum
from longtail_workers.weights.http_sync import (
    CHECKSUM_HEADER,
    VERSION_HEADER,
    HttpWeightClient,
    WeightServer,
)
from longtail_workers.weights.pieces import canonical_layout, metas_of
from longtail_workers.weights.store import WeightStore, publish_state_dict
from longtail_workers.weights.sync import (
    Published,
    TensorMeta,
    WeightFetchError,
    WeightIntegrityError,
    WeightVersionError,
)

PIECE = 4096
"""Small pieces, so a tiny model has many and its larger tensors span several."""


class FaultyProxy(BackgroundHTTPServer):
    """Forwards GETs to ``upstream``; ``faults[path]`` is ``"flip"``, ``"stop"`` or a callable
    run before forwarding."""

    def __init__(self, upstream: str, faults: Mapping[str, str | Callable[[], object]]) -> None:
        super().__init__("127.0.0.1", 0, request_timeout_s=30)
        self.upstream, self.faults = upstream, faults
        self.seen: list[str] = []

    def routes(self) -> list[Route]:
        return [route("/{path:path}", self._forward, "GET")]

    def _forward(self, handler: JSONRequestHandler) -> None:
        self.seen.append(handler.path)
        action = self.faults.get(handler.path)
        if action == "stop":
            threading.Thread(target=self.stop).start()  # waits for this answer, then closes
            handler.send_json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "trainer stopping"})
            return
        if callable(action):
            action()
        try:
            answer = httpclient.request(
                "GET", self.upstream + handler.path, timeout_s=10, accept=(HTTPStatus.NOT_FOUND,)
            )
        except httpclient.HTTPCallError as exc:
            handler.send_json(HTTPStatus.BAD_GATEWAY, {"error": str(exc)})
            return
        body = bytearray(answer.body)
        if action == "flip":
            body[len(body) // 2] ^= 0x01
        headers = {
            k: answer.headers[k] for k in (VERSION_HEADER, CHECKSUM_HEADER) if k in answer.headers
        }
        content_type = answer.headers.get("Content-Type", "application/octet-stream")
        handler.send_body(HTTPStatus(answer.status), bytes(body), content_type, headers)


def client(url: str, **kwargs: Any) -> HttpWeightClient:
    return HttpWeightClient(url, timeout_s=10, backoff_s=0.05, parallel=4, **kwargs)


def pack(state: dict[str, torch.Tensor]) -> tuple[memoryview, Published]:
    """``state`` published by a store: its canonical bytes and the publish."""
    store = WeightStore(piece_bytes=PIECE)
    published = publish_state_dict(store, 1, state)
    entry = store.get(1)
    assert entry is not None
    return memoryview(entry.data), published


def piece_path(version: int, index: int) -> str:
    return f"/v1/weights/{version}/pieces/{index}"


def test_pieces_are_canonical_bytes_and_tensors_span_them() -> None:
    mixed = {
        "z": torch.zeros(0),
        "flags": torch.tensor([True, False, True]),
        "ids": torch.arange(5),
        "half": torch.ones(3, dtype=torch.float16),
        "big": torch.randn(3000, dtype=torch.bfloat16),  # 6000 bytes: spans two 4 KiB pieces
    }
    for state in (mixed, tiny_model(0).state_dict()):  # tied embedding and LM head
        data, published = pack(state)
        assert bytes(data) == serialize_state_dict(state)
        assert published.content_sha256() == state_dict_checksum(state)
        assert [p.offset for p in published.manifest().pieces] == list(range(0, len(data), PIECE))


def test_canonical_layout_gives_packs_header_and_tensor_order() -> None:
    state = tiny_model(0).state_dict()
    state["counts"] = torch.arange(7)  # another dtype: safetensors orders by dtype, then name
    data, _ = pack(state)
    metas = [TensorMeta(k, v.dtype, tuple(v.shape)) for k, v in reversed(state.items())]
    ordered, header = canonical_layout(metas)
    assert bytes(data[: len(header)]) == header
    offset = len(header)  # each tensor's bytes follow the header in the layout's order
    for meta in ordered:
        tensor = state[meta.name].contiguous()
        assert bytes(data[offset : offset + meta.nbytes]) == tensor.numpy().tobytes()
        offset += meta.nbytes
    assert offset == len(data) and sorted(m.name for m in ordered) == sorted(state)
    assert ordered[0].name == "counts" and canonical_layout(ordered)[0] == ordered
    assert canonical_layout(metas_of(state)) == (ordered, header)
    with pytest.raises(ValueError, match=r"\['counts'\] appear twice"):
        canonical_layout([*metas, TensorMeta("counts", torch.int64, (7,))])


def test_a_versions_pieces_pulled_in_parallel_load_and_hash_to_the_trainers_state() -> None:
    trainer, rollout = tiny_model(1), tiny_model(2)
    with WeightServer(WeightStore(piece_bytes=PIECE)) as server:
        published = publish_state_dict(server.store, 3, trainer.state_dict())
        manifest = published.manifest()
        assert len(manifest.pieces) > 10 and published.content_sha256() == state_dict_checksum(
            trainer.state_dict()
        )
        # Pieces 0 and 1 are each held until both are asked for: a client pulling one piece
        # at a time would break the barrier (10 s) and fail the pull.
        both = threading.Barrier(2, timeout=10)
        held = {piece_path(3, i): both.wait for i in (0, 1)}
        with FaultyProxy(server.url, held) as proxy:
            c = client(proxy.url)
            version, fetched = c.fetch()
            assert version == 3
            assert state_dict_checksum(fetched) == published.content_sha256()
            assert c.load_into(rollout) == 3
        pulled = [p for p in proxy.seen if "/pieces/" in p]
        assert sorted(pulled) == sorted([piece_path(3, i) for i in range(len(manifest.pieces))] * 2)
    assert_same(snapshot(rollout), snapshot(trainer))


def held_v1_then_publish_v2(server: WeightServer, rollout: torch.nn.Module) -> dict[str, Any]:
    """The rollout model loads version 1; the trainer then publishes version 2. Returns the
    rollout's weights as they are with version 1 (what a failed pull of version 2 must keep)."""
    publish_state_dict(server.store, 1, tiny_model(1).state_dict())
    client(server.url).load_into(rollout, 1)
    before = snapshot(rollout)
    publish_state_dict(server.store, 2, tiny_model(3).state_dict())
    return before


def test_a_piece_corrupted_in_flight_is_refused_and_the_previous_version_kept() -> None:
    rollout = tiny_model(2)
    with WeightServer(WeightStore(piece_bytes=PIECE)) as server:
        before = held_v1_then_publish_v2(server, rollout)
        flip = FaultyProxy(server.url, {piece_path(2, 5): "flip"})
        with flip as proxy, pytest.raises(WeightIntegrityError) as info:
            client(proxy.url, retries=0).load_into(rollout, 2)
    err = info.value
    assert err.version == 2 and "(piece 5)" in str(err) and err.expected != err.actual
    assert "nothing was loaded" in str(err)
    assert_same(snapshot(rollout), before)


def test_a_refused_piece_is_a_warning_and_counted_in_the_workers_metrics(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue #48 item 11: the refusal was logged at info only (by the retrying caller), with no
    metric; now the client logs it at warning and the worker's ``/metrics`` counts it."""
    from tiny_targets import tiny_qwen2

    from longtail_workers.engine.native.torch_engine import TorchEngine
    from longtail_workers.rollout.control import RolloutWorker
    from longtail_workers.rollout.http import ControlConfig, ControlServer

    rollout = tiny_qwen2(seed=5, vocab_size=32, hidden_size=32, intermediate_size=64)
    with WeightServer(WeightStore(piece_bytes=PIECE)) as server:
        trained = tiny_qwen2(seed=6, vocab_size=32, hidden_size=32, intermediate_size=64)
        publish_state_dict(server.store, 1, trained.state_dict())
        with FaultyProxy(server.url, {piece_path(1, 3): "flip"}) as proxy:
            weights = client(proxy.url, retries=0)
            worker = RolloutWorker(TorchEngine(rollout), target_id="tiny", name="w0",
                                      weights=weights)  # fmt: skip
            with caplog.at_level(logging.INFO), pytest.raises(WeightIntegrityError):
                worker.ensure_policy(1, timeout_s=0.1)
            with ControlServer(worker, ControlConfig(port=0)) as control:
                metrics = httpclient.request("GET", control.url + "/metrics", timeout_s=10)
    refused = [r for r in caplog.records if "failed the integrity check" in r.getMessage()]
    assert refused and refused[0].levelno == logging.WARNING, caplog.text
    assert "(piece 3)" in refused[0].getMessage()
    assert weights.refusals() >= 1
    text = metrics.body.decode()
    assert f"longtail_worker_weights_refused_total {float(weights.refusals())}" in text, text


def test_a_pull_interrupted_by_the_trainer_stopping_keeps_the_previous_version() -> None:
    rollout = tiny_model(2)
    with WeightServer(WeightStore(piece_bytes=PIECE)) as server:
        before = held_v1_then_publish_v2(server, rollout)
        proxy = FaultyProxy(server.url, {piece_path(2, 7): "stop"}).start()
        with pytest.raises(WeightFetchError) as info:
            client(proxy.url, retries=2).load_into(rollout, 2)
        proxy.stop()
    text = str(info.value)  # pulls in flight meet the stop too: any of them may be named
    assert re.search(rf"policy version 2 from {re.escape(proxy.url)}: piece \d+ failed", text), text
    assert "failed after 3 attempt(s)" in text and "nothing was loaded" in text, text
    assert_same(snapshot(rollout), before)


def test_a_version_superseded_mid_pull_is_refused_whole_and_the_newest_pulled_instead() -> None:
    rollout = tiny_model(2)
    v3 = tiny_model(4)
    with WeightServer(WeightStore(piece_bytes=PIECE, keep_last=1)) as server:
        before = held_v1_then_publish_v2(server, rollout)
        publish_v3 = {
            piece_path(2, 4): lambda: publish_state_dict(server.store, 3, v3.state_dict())
        }
        with FaultyProxy(server.url, publish_v3) as proxy:  # asked for 2 by name: refused
            with pytest.raises(WeightVersionError, match=r"version 2 is not kept; kept .*\[3\]"):
                client(proxy.url).load_into(rollout, 2)
            assert_same(snapshot(rollout), before)
        publish_state_dict(server.store, 4, tiny_model(5).state_dict())
        v5 = tiny_model(6)
        publish_v5 = {
            piece_path(4, 4): lambda: publish_state_dict(server.store, 5, v5.state_dict())
        }
        with FaultyProxy(server.url, publish_v5) as proxy:  # asked for the newest: moves on
            assert client(proxy.url).load_into(rollout) == 5
    assert_same(snapshot(rollout), snapshot(v5))


def test_a_manifest_whose_pieces_leave_bytes_uncovered_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with WeightServer(WeightStore(piece_bytes=PIECE)) as server:
        manifest = publish_state_dict(server.store, 1, tiny_model(1).state_dict()).manifest()
        entry = server.store.get(1)
        assert entry is not None
        short = dataclasses.replace(manifest, pieces=manifest.pieces[:-1])  # last piece unlisted
        bad = dataclasses.replace(entry, manifest=short)
        monkeypatch.setattr(server.store, "get", lambda version, wait_s=0.0: bad)
        with pytest.raises(WeightFetchError, match=r"pieces cover \d+ bytes, the version has"):
            client(server.url).fetch(1)
