"""The trainer's store of published policy versions: the last K, each immutable and whole.

:class:`WeightStore` is what :class:`~longtail_workers.weights.http_sync.WeightServer` serves
from, and what a trainer process with its own HTTP server can serve from too. Publishing is
atomic: the canonical bytes and their sha256 are built completely *outside* the lock, then one
assignment under the lock makes the new version visible. A reader takes a reference to an
immutable :class:`PublishedWeights` under the lock and reads it afterwards, so it sees either
the previous version or the new one, never a half-written one, and a slow download never blocks
the trainer's next publish.

:meth:`WeightStore.publish_stream` packs a version as a (sharded) trainer's pass over its
tensors produces them (``pieces.pack_stream``), so no whole state dict is ever built for it.
Each version is cut into pieces of ``piece_bytes`` (``pieces.py``), each with its sha256 in the
manifest, so rollout workers can pull and verify the pieces in parallel; the pieces are views of
the one serialised copy, never copies.

Memory: the store holds ``keep_last`` serialised copies (about 2 bytes per bf16 parameter
each). Two is enough for pull-based sync (the newest, plus the one workers may still be
downloading); more lets lagging workers catch up to an older version.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from longtail_workers.weights.pieces import (
    DEFAULT_PIECE_BYTES,
    canonical_layout,
    metas_of,
    pack_stream,
)
from longtail_workers.weights.sync import (
    SyncPhases,
    TensorMeta,
    TensorStream,
    WeightPublisher,
    WeightsManifest,
    pieces_checksum,
)


@dataclass(frozen=True)
class PublishedWeights:
    """One published version: its manifest and its canonical safetensors bytes."""

    manifest: WeightsManifest
    data: bytes | memoryview


class WeightStore(WeightPublisher):
    """Thread-safe store of the last ``keep_last`` published versions."""

    def __init__(self, keep_last: int = 2, piece_bytes: int = DEFAULT_PIECE_BYTES) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 (versions kept for readers), got {keep_last}")
        if piece_bytes < 1:
            raise ValueError(f"piece_bytes must be >= 1 (bytes per piece), got {piece_bytes}")
        self.keep_last = keep_last
        self.piece_bytes = piece_bytes
        self._lock = threading.Lock()
        self._versions: OrderedDict[int, PublishedWeights] = OrderedDict()
        self._latest: PublishedWeights | None = None

    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> WeightsManifest:
        """Serialise ``state_dict``, hash it and its pieces, then make it visible as ``version``."""
        layout, _ = canonical_layout(metas_of(state_dict))
        return self.publish_stream(version, layout, lambda: (state_dict[m.name] for m in layout))

    def publish_stream(
        self, version: int, layout: Sequence[TensorMeta], tensors: TensorStream
    ) -> WeightsManifest:
        """Pack one pass of ``tensors`` (``layout`` in canonical order, each cast to its
        meta's dtype) into pieces hashed as the pass fills them, then make it visible as
        ``version``. ``phases.gather_s`` is the time spent waiting for the stream."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be a non-negative int, got {version!r}")
        self._check_newer(version)  # fail before the (slow) gather and packing
        t0 = time.monotonic()
        data, checksum, pieces, gather_s = pack_stream(layout, tensors(), self.piece_bytes)
        pack_s = time.monotonic() - t0 - gather_s
        manifest = WeightsManifest(
            version=version,
            checksum=checksum,
            size=len(data),
            dtypes={
                m.name: str(m.dtype).removeprefix("torch.")
                for m in sorted(layout, key=lambda m: m.name)
            },
            piece_bytes=self.piece_bytes,
            pieces=pieces,
            pieces_sha256=pieces_checksum(version, len(data), pieces),
            phases=SyncPhases("http", gather_s=gather_s, pack_s=pack_s, bytes=len(data)),
        )
        self.put(manifest, data)
        return manifest

    def put(self, manifest: WeightsManifest, data: bytes | memoryview) -> None:
        """Make a version whose bytes, checksums and pieces are already built visible (the
        broadcast publisher fills ``data`` from the buckets it sends, pieces = buckets)."""
        if len(data) != manifest.size:
            raise ValueError(
                f"version {manifest.version}: {len(data)} bytes given, the manifest says "
                f"{manifest.size}"
            )
        entry = PublishedWeights(manifest=manifest, data=data)
        with self._lock:
            self._check_newer(manifest.version)  # again: another thread may have published
            self._versions[manifest.version] = entry
            self._latest = entry
            while len(self._versions) > self.keep_last:
                self._versions.popitem(last=False)

    def latest(self) -> PublishedWeights | None:
        """The newest version, or ``None`` before the first publish."""
        with self._lock:
            return self._latest

    def get(self, version: int) -> PublishedWeights | None:
        """``version`` if it is still kept, else ``None``."""
        with self._lock:
            return self._versions.get(version)

    def versions(self) -> list[int]:
        """Versions currently kept, oldest first."""
        with self._lock:
            return list(self._versions)

    def _check_newer(self, version: int) -> None:
        latest = self._latest
        if latest is not None and version <= latest.manifest.version:
            raise ValueError(
                f"version {version} is not newer than the last published version "
                f"{latest.manifest.version}; versions must increase (use the RL step number)"
            )
