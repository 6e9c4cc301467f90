"""Policy weight sync: checksums, HTTP pull over real loopback, all-or-nothing loads.

The broadcast transport is tested in ``test_weight_sync_broadcast*.py``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest
import torch
from httpcall import free_port
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from longtail_workers.weights.checksum import serialize_state_dict, state_dict_checksum
from longtail_workers.weights.http_sync import HttpWeightClient, WeightServer
from longtail_workers.weights.store import PublishedWeights, WeightStore, publish_state_dict
from longtail_workers.weights.sync import (
    WeightFetchError,
    WeightIntegrityError,
    WeightMismatchError,
    WeightVersionError,
    apply_state_dict,
)


def tiny_model(seed: int, hidden: int = 32) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=16,
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,  # shared storage: the canonical form must cope
    )
    return Qwen2ForCausalLM(config)


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), key


def client(server: WeightServer, **kwargs: Any) -> HttpWeightClient:
    return HttpWeightClient(server.url, timeout_s=10, backoff_s=0.05, **kwargs)


# --- checksum ----------------------------------------------------------------------------------


def test_checksum_is_canonical_and_sensitive() -> None:
    sd = {"b": torch.arange(4, dtype=torch.bfloat16), "a": torch.ones(2, 3)}
    reordered = {"a": sd["a"].clone(), "b": sd["b"].clone()}
    assert state_dict_checksum(sd) == state_dict_checksum(reordered)  # key order is irrelevant
    flipped = {**sd, "a": sd["a"].clone()}
    flipped["a"][1, 2] = 1.0000001
    assert state_dict_checksum(flipped) != state_dict_checksum(sd)
    assert state_dict_checksum({**sd, "a": sd["a"].double()}) != state_dict_checksum(sd)
    tied = tiny_model(0).state_dict()  # lm_head.weight shares the embedding's storage
    assert state_dict_checksum(tied) == state_dict_checksum(snapshot(tiny_model(0)))
    with pytest.raises(ValueError, match="empty state dict"):
        serialize_state_dict({})


# --- HTTP ----------------------------------------------------------------------------------------


def test_http_round_trip_loads_exact_weights() -> None:
    trainer, rollout = tiny_model(1), tiny_model(2)
    with WeightServer(WeightStore()) as server:
        manifest = publish_state_dict(server.store, 7, trainer.state_dict()).manifest()
        c = client(server)
        latest = c.latest()
        assert latest == manifest
        assert latest is not None and latest.dtypes["lm_head.weight"] == "float32"
        version, fetched = c.fetch()
        assert version == 7
        assert_same(fetched, snapshot(trainer))
        assert c.load_into(rollout, 7) == 7
    assert_same(snapshot(rollout), snapshot(trainer))


def test_http_keeps_last_k_and_refuses_old_versions() -> None:
    with WeightServer(WeightStore(keep_last=2)) as server:
        for v in (1, 2, 3):
            publish_state_dict(server.store, v, {"w": torch.full((3,), float(v))})
        c = client(server)
        with pytest.raises(
            WeightVersionError, match=r"version 1 is not kept; kept versions: \[2, 3\]"
        ):
            c.fetch(1)
        assert torch.equal(c.fetch(2)[1]["w"], torch.full((3,), 2.0))
        with pytest.raises(ValueError, match="not newer than the last published version 3"):
            publish_state_dict(server.store, 3, {"w": torch.zeros(3)})


def _tamper(server: WeightServer, monkeypatch: pytest.MonkeyPatch, **changes: Any) -> None:
    """Serve version 1 with ``changes`` applied to its data or its manifest."""
    entry = server.store.get(1)
    assert entry is not None
    data = changes.pop("data", entry.data)
    manifest = dataclasses.replace(entry.manifest, **changes)
    bad = PublishedWeights(manifest=manifest, data=data)
    monkeypatch.setattr(server.store, "get", lambda version, wait_s=0.0: bad)
    monkeypatch.setattr(server.store, "latest", lambda wait_s=0.0: bad)


@pytest.mark.parametrize("what", ["bytes", "advertised checksum"])
def test_integrity_failure_leaves_model_untouched(
    what: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rollout = tiny_model(2)
    before = snapshot(rollout)
    with WeightServer(WeightStore()) as server:
        published = publish_state_dict(server.store, 1, tiny_model(1).state_dict())
        manifest = published.manifest()
        entry = server.store.get(1)
        assert entry is not None
        if what == "bytes":
            data = bytearray(entry.data)
            data[-5] ^= 0x01  # one bit of one weight
            _tamper(server, monkeypatch, data=bytes(data))
        else:
            # The version's checksum: its pieces' list (what a receiver verifies, with every
            # piece's own sha256).
            _tamper(server, monkeypatch, pieces_sha256="0" * 64)
        with pytest.raises(WeightIntegrityError) as info:
            client(server).load_into(rollout)
    err = info.value
    assert err.version == 1
    assert manifest.pieces[0].sha256 in str(err) or "0" * 64 in str(err)  # one piece
    assert err.actual in str(err) and err.expected in str(err)
    assert err.expected != err.actual
    assert_same(snapshot(rollout), before)


def test_version_mismatch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    rollout = tiny_model(2)
    before = snapshot(rollout)
    with WeightServer(WeightStore(keep_last=3)) as server:
        publish_state_dict(server.store, 2, tiny_model(1).state_dict())
        publish_state_dict(server.store, 3, tiny_model(3).state_dict())
        v3 = server.store.get(3)
        # The store answers version 3 to everything.
        monkeypatch.setattr(server.store, "get", lambda version, wait_s=0.0: v3)
        with pytest.raises(WeightVersionError, match="for policy version 2, got version 3") as info:
            client(server).load_into(rollout, 2)
    assert (info.value.requested, info.value.received) == (2, 3)
    assert_same(snapshot(rollout), before)


def test_weights_for_another_model_are_refused_whole() -> None:
    rollout = tiny_model(2)
    before = snapshot(rollout)
    other = snapshot(tiny_model(1))
    # Only the last key (in load order) is wrong: a plain load_state_dict would already have
    # overwritten every other parameter before noticing.
    other["model.norm.weight"] = torch.ones(7)
    with pytest.raises(
        WeightMismatchError, match=r"version 4: .*model\.norm\.weight: shape \(7,\)"
    ):
        apply_state_dict(rollout, other, version=4)
    del other["model.norm.weight"]
    with pytest.raises(WeightMismatchError, match="missing 1 key"):
        apply_state_dict(rollout, other, version=4)
    assert_same(snapshot(rollout), before)


def test_reader_never_sees_a_torn_version_during_concurrent_publishes() -> None:
    # keep_last=1: a version can vanish between the manifest and the download, so this also
    # drives the client's re-read path. On a loaded machine a download can be overtaken on every
    # re-read; the client then gives up with its "replaced during each of N downloads" error,
    # which is a refusal, not a torn read, so the reader counts it and tries again.
    shapes = {f"layer{i}": (256, 256) for i in range(4)}  # ~1 MiB per version
    last = 15
    seen: list[int] = []
    overtaken: list[int] = []
    errors: list[BaseException] = []
    done = threading.Event()

    with WeightServer(WeightStore(keep_last=1)) as server:
        publish_state_dict(server.store, 0, {k: torch.zeros(s) for k, s in shapes.items()})

        def read() -> None:
            c = client(server)
            while not done.is_set():
                try:
                    version, sd = c.fetch()
                except WeightFetchError as exc:
                    if "replaced during each" not in str(exc):
                        errors.append(exc)
                        return
                    overtaken.append(1)
                    continue
                except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                    errors.append(exc)
                    return
                for tensor in sd.values():  # every tensor of version v is filled with v
                    if not torch.equal(tensor, torch.full_like(tensor, float(version))):
                        errors.append(AssertionError(f"torn read of version {version}"))
                        return
                seen.append(version)

        readers = [threading.Thread(target=read) for _ in range(2)]
        for t in readers:
            t.start()
        for v in range(1, last + 1):
            publish_state_dict(
                server.store, v, {k: torch.full(s, float(v)) for k, s in shapes.items()}
            )
            time.sleep(0.01)
        # Publishing has stopped: every reader must now complete a read of the last version.
        deadline = time.monotonic() + 20
        while seen.count(last) < 2 and not errors and time.monotonic() < deadline:
            time.sleep(0.01)
        done.set()
        for t in readers:
            t.join(timeout=10)
    assert not errors, errors[0]
    assert seen.count(last) >= 2, (seen, len(overtaken))


def test_client_retries_until_the_server_comes_up() -> None:
    port = free_port()
    result: dict[str, Any] = {}

    def fetch() -> None:
        c = HttpWeightClient(f"http://127.0.0.1:{port}", timeout_s=5, retries=8, backoff_s=0.1)
        try:
            result["value"] = c.fetch()
        except BaseException as exc:  # noqa: BLE001 - asserted on below
            result["error"] = exc

    thread = threading.Thread(target=fetch)
    thread.start()
    time.sleep(0.4)  # the first attempts find nothing listening
    server = WeightServer(WeightStore(), port=port)
    publish_state_dict(server.store, 5, {"w": torch.arange(3.0)})
    with server:
        thread.join(timeout=20)
    assert "error" not in result, result.get("error")
    version, sd = result["value"]
    assert version == 5 and torch.equal(sd["w"], torch.arange(3.0))


def test_client_gives_up_with_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    c = HttpWeightClient(url, timeout_s=2, retries=2, backoff_s=0.01)
    with pytest.raises(WeightFetchError, match=r"failed after 3 attempt\(s\).*weight server"):
        c.fetch(1)


def test_nothing_published_yet_and_waiting_for_a_version() -> None:
    with WeightServer(WeightStore()) as server:
        c = client(server)
        with pytest.raises(WeightVersionError, match="no policy weights published yet"):
            c.fetch()
        with pytest.raises(
            TimeoutError, match=r"no policy version >= 1 .*\(last seen: nothing published\)"
        ):
            c.wait_for_version(1, timeout_s=0.2, poll_s=0.05)
        with pytest.raises(WeightFetchError, match=r"answered 404 .* the trainer's weight server"):
            HttpWeightClient(server.url + "/elsewhere", retries=0).latest()
        publish = (server.store, 2, {"w": torch.ones(1)})
        threading.Timer(0.1, publish_state_dict, args=publish).start()
        assert c.wait_for_version(1, timeout_s=5, poll_s=0.05) == 2


def test_an_unsupported_method_is_a_json_405_naming_the_allowed_ones() -> None:
    import json
    import urllib.error
    import urllib.request

    with WeightServer(WeightStore()) as server:
        req = urllib.request.Request(server.url + "/v1/weights/latest", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        assert err.value.code == 405 and err.value.headers["Allow"] == "GET, HEAD"
        body = json.loads(err.value.read())
        assert body["error"].startswith("POST /v1/weights/latest: method not allowed here")
