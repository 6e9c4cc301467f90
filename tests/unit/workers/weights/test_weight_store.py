"""The trainer's weight store off the critical path (#33): a version reserved before its pieces
are hashed (the broadcast's HTTP catch-up copy) is served once they are, a request still waiting
after ``PENDING_WAIT_S`` answers 503 and the client retries it, a cancelled version is not kept,
versions still increase; host buffers are reused only once nothing views them (a piece being
sent keeps its version's buffer); the whole version's sha256 is hashed only when asked for; a
spooled store's versions are file pages, not the trainer's memory, and a full spool disk fails
the publish with the directory named and the last version kept."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from tiny_targets import tiny_qwen2

from longtail_workers.weights import http_sync
from longtail_workers.weights.buffers import BufferPool
from longtail_workers.weights.checksum import serialize_state_dict, state_dict_checksum
from longtail_workers.weights.http_sync import HttpWeightClient, WeightServer
from longtail_workers.weights.store import VersionPending, WeightStore, publish_state_dict
from longtail_workers.weights.sync import WeightVersionError

SHAPE = {"vocab_size": 32, "hidden_size": 32, "intermediate_size": 64}


def state(seed: int) -> dict[str, torch.Tensor]:
    return tiny_qwen2(seed=seed, **SHAPE).state_dict()


def canonical(seed: int) -> tuple[memoryview, dict[str, str]]:
    """Version bytes as the broadcast publisher's host copy holds them, and their dtypes."""
    sd = state(seed)
    data = memoryview(bytearray(serialize_state_dict(sd)))
    return data, {k: str(v.dtype).removeprefix("torch.") for k, v in sorted(sd.items())}


def client(server: WeightServer) -> HttpWeightClient:
    return HttpWeightClient(server.url, timeout_s=10, backoff_s=0.05, max_backoff_s=0.2)


def test_a_reserved_version_is_served_once_its_pieces_are_hashed() -> None:
    data, dtypes = canonical(1)
    with WeightServer(WeightStore(piece_bytes=4096)) as server:
        server.store.reserve(1)
        later = threading.Timer(0.5, server.store.hash_later, (1, data, dtypes, 4096))
        later.start()
        t0 = time.monotonic()
        version, fetched = client(server).fetch()  # latest: waits for the reserved version
        assert version == 1 and time.monotonic() - t0 >= 0.4
        assert state_dict_checksum(fetched) == state_dict_checksum(state(1))
        later.join()


def test_a_version_pending_past_the_wait_answers_503_and_the_client_retries(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(http_sync, "PENDING_WAIT_S", 0.1)
    data, dtypes = canonical(2)
    caplog.set_level(logging.WARNING, logger="longtail_workers.httpclient")
    with WeightServer(WeightStore(piece_bytes=4096)) as server:
        server.store.reserve(2)
        later = threading.Timer(0.6, server.store.hash_later, (2, data, dtypes, 4096))
        later.start()
        version, fetched = client(server).fetch(2)
        assert version == 2 and state_dict_checksum(fetched) == state_dict_checksum(state(2))
        later.join()
    assert any(
        "503" in r.getMessage() and "being prepared" in r.getMessage() for r in caplog.records
    )


def test_a_cancelled_version_is_not_kept_and_versions_still_increase() -> None:
    store = WeightStore(piece_bytes=4096)
    store.reserve(3)
    with pytest.raises(VersionPending, match="version 3 is still being prepared"):
        store.get(3, wait_s=0.05)
    with pytest.raises(ValueError, match="not newer than the last published version 3"):
        publish_state_dict(store, 3, state(3))
    store.cancel(3)
    assert store.get(3, wait_s=1.0) is None and store.latest(wait_s=1.0) is None
    publish_state_dict(store, 4, state(4))
    with WeightServer(WeightStore()) as server:
        publish_state_dict(server.store, 5, state(5))
        with pytest.raises(WeightVersionError, match="version 4 is not kept"):
            client(server).fetch(4)


def test_a_host_buffer_is_reused_only_once_nothing_views_it() -> None:
    pool = BufferPool(keep=2)
    first = pool.take(64)
    first_ptr = first.data_ptr()
    piece = memoryview(first.numpy())[8:16]  # as an HTTP piece being sent holds it
    del first
    assert pool.take(64).data_ptr() != first_ptr  # still viewed: a new buffer
    del piece
    assert pool.take(64).data_ptr() == first_ptr  # nothing views it now
    assert pool.take(32).numel() == 32  # another size: a new one


def test_the_store_reuses_an_evicted_versions_buffer_after_its_last_reader() -> None:
    store = WeightStore(keep_last=1, piece_bytes=4096)

    def address(version: int) -> int:
        entry = store.get(version)
        assert entry is not None
        return int(torch.frombuffer(entry.data, dtype=torch.uint8).data_ptr())

    publish_state_dict(store, 1, state(1))
    first = address(1)
    entry = store.get(1)
    assert entry is not None
    reader = memoryview(entry.data)[:4096]  # a pull of version 1 still in flight
    del entry
    # Evicts version 1; its reader keeps the buffer out of reuse.
    publish_state_dict(store, 2, state(2))
    publish_state_dict(store, 3, state(3))  # evicts version 2
    assert address(3) != first
    del reader
    publish_state_dict(store, 4, state(4))  # version 1's buffer is free: reused
    assert address(4) == first
    # Into a reused buffer too: every byte is the new version's.
    publish_state_dict(store, 5, state(5))
    entry = store.get(5)
    assert entry is not None and bytes(entry.data) == serialize_state_dict(state(5))


def test_the_whole_versions_sha256_is_hashed_only_when_asked() -> None:
    store = WeightStore(piece_bytes=4096)
    published = publish_state_dict(store, 1, state(1))
    assert published.content._hex == ""  # type: ignore[attr-defined]  # not hashed yet
    assert published.content_sha256() == state_dict_checksum(state(1))
    assert published.manifest().pieces_sha256  # the HTTP manifest was complete on return


def _rss_kb() -> dict[str, int]:
    with open("/proc/self/status") as f:
        rows = dict(line.split(":", 1) for line in f)
    return {k: int(rows[k].split()[0]) for k in ("RssAnon", "RssFile")}


def test_a_spooled_store_maps_its_versions_from_files_not_the_trainers_memory(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    big = {"w": torch.randn((96 << 20) // 4), "b": torch.randn((32 << 20) // 4)}  # 128 MiB
    with WeightServer(WeightStore(piece_bytes=16 << 20, spool_dir=tmp_path)) as server:
        before = _rss_kb()
        publish_state_dict(server.store, 1, big).manifest()
        after = _rss_kb()
        assert after["RssFile"] - before["RssFile"] > 120_000  # the version: page cache
        assert after["RssAnon"] - before["RssAnon"] < 40_000, (before, after)  # not ours
        assert list(tmp_path.iterdir()) == []  # unlinked at once: a killed trainer leaves none
        version, pulled = client(server).fetch(1)
    assert version == 1 and all(torch.equal(pulled[k], big[k]) for k in big)


def test_a_spool_without_room_fails_the_publish_naming_it_and_keeps_the_last_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = WeightStore(piece_bytes=4096, spool_dir=tmp_path)
    publish_state_dict(store, 1, state(1))

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError) as raised:
        publish_state_dict(store, 2, state(2))
    assert raised.value.errno == errno.ENOSPC
    assert f"weight spool {tmp_path}" in str(raised.value) and "--weight-spool-dir" in str(
        raised.value
    )
    latest = store.latest()
    assert latest is not None and latest.manifest.version == 1
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="is not a directory"):
        WeightStore(spool_dir=tmp_path / "missing")


def test_the_trainers_spool_follows_the_flag_then_the_spec(tmp_path: Path) -> None:
    from longtail_workers.jobspec import load_job_spec
    from longtail_workers.trainer.service import build_parser
    from longtail_workers.trainer.setup import weight_spool

    example = Path(__file__).resolve().parents[4] / "examples" / "01-tiny-arith.yaml"
    spec = load_job_spec(example)
    base = ["--job", str(example), "--rollout", "r=http://x:1", "--verifier-url", "http://v:2"]
    args = build_parser().parse_args([*base, "--run-dir", str(tmp_path)])
    assert spec.weight_sync.host_copy == "memory"  # the default
    assert weight_spool(args, spec) is None
    spec.weight_sync.host_copy = "spool"
    assert weight_spool(args, spec) == tmp_path / "weight-spool"
    assert (tmp_path / "weight-spool").is_dir()
    args = build_parser().parse_args(
        [*base, "--run-dir", str(tmp_path), "--weight-spool-dir", str(tmp_path / "s")]
    )
    spec.weight_sync.host_copy = "memory"
    assert weight_spool(args, spec) == tmp_path / "s"  # the flag wins
    args.weight_spool_dir = "memory"
    spec.weight_sync.host_copy = "spool"
    assert weight_spool(args, spec) is None
