"""The trainer's store of published policy versions: the last K, each immutable and whole.

:class:`WeightStore` is what :class:`~longtail_workers.weights.http_sync.WeightServer` serves
from, and what a trainer process with its own HTTP server can serve from too. Publishing is
atomic: the canonical bytes and their pieces' sha256s are built completely *outside* the lock,
then one assignment under the lock makes the new version visible. A reader takes a reference to
an immutable :class:`PublishedWeights` under the lock and reads it afterwards, so it sees either
the previous version or the new one, never a half-written one, and a slow download never blocks
the trainer's next publish.

:meth:`WeightStore.publish_stream` packs a version as a (sharded) trainer's pass over its
tensors produces them (``pieces.pack_stream``), so no whole state dict is ever built for it.
Each version is cut into pieces of ``piece_bytes`` (``pieces.py``), each with its sha256 in the
manifest, so rollout workers can pull and verify the pieces in parallel; the pieces are views of
the one serialised copy, never copies. The whole version's sha256 (the checkpoint's) is hashed
only when a checkpoint asks for it (``pieces.LazySha256``).

A version can be *reserved* before its bytes are hashed (:meth:`WeightStore.reserve`, then
:meth:`WeightStore.hash_later`): the broadcast publisher does so, so its HTTP catch-up copy is
hashed after the broadcast instead of on its critical path. Readers asking for a reserved
version wait for it (:meth:`WeightStore.get`'s ``wait_s``), then get it whole.

Memory: the store holds ``keep_last`` serialised copies (about 2 bytes per bf16 parameter
each). Two is enough for pull-based sync (the newest, plus the one workers may still be
downloading); more lets lagging workers catch up to an older version.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch

from longtail_workers.weights.buffers import BufferPool
from longtail_workers.weights.pieces import (
    DEFAULT_PIECE_BYTES,
    LazySha256,
    canonical_layout,
    hash_pieces,
    in_background,
    metas_of,
    pack_stream,
)
from longtail_workers.weights.sync import (
    Piece,
    Published,
    SyncPhases,
    TensorMeta,
    TensorStream,
    WeightPublisher,
    WeightsManifest,
    WeightSyncError,
    done,
    pieces_checksum,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishedWeights:
    """One published version: its manifest and its canonical safetensors bytes."""

    manifest: WeightsManifest
    data: bytes | memoryview


class VersionPending(WeightSyncError):
    """A reserved version is still being prepared (its pieces hashed) after the wait."""

    def __init__(self, version: int, waited_s: float) -> None:
        super().__init__(
            f"policy version {version} is still being prepared on the trainer (its pieces are "
            f"hashed after the broadcast) after {waited_s:g}s; retry"
        )
        self.version = version


class WeightStore(WeightPublisher):
    """Thread-safe store of the last ``keep_last`` published versions."""

    def __init__(
        self,
        keep_last: int = 2,
        piece_bytes: int = DEFAULT_PIECE_BYTES,
        spool_dir: Path | None = None,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 (versions kept for readers), got {keep_last}")
        if piece_bytes < 1:
            raise ValueError(f"piece_bytes must be >= 1 (bytes per piece), got {piece_bytes}")
        self.keep_last = keep_last
        self.piece_bytes = piece_bytes
        self._cond = threading.Condition()
        self._versions: OrderedDict[int, PublishedWeights] = OrderedDict()
        self._latest: PublishedWeights | None = None
        self._reserved: set[int] = set()  # versions announced, their bytes not visible yet
        if spool_dir is not None and not spool_dir.is_dir():
            raise ValueError(
                f"weight spool {spool_dir} is not a directory; create it (a local disk with room "
                f"for {keep_last + 1} policy versions) or leave --weight-spool-dir unset"
            )
        self.buffers = BufferPool(keep_last + 1, spool=spool_dir)
        """Host buffers of the versions (reused once evicted and no reader holds one); mapped
        from files in ``spool_dir`` when given (``buffers.spooled``: page cache, not the
        process's own memory), else anonymous memory."""

    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> Published:
        """Serialise ``state_dict``, hash its pieces, then make it visible as ``version``."""
        layout, _ = canonical_layout(metas_of(state_dict))
        return self.publish_stream(version, layout, lambda: (state_dict[m.name] for m in layout))

    def publish_stream(
        self, version: int, layout: Sequence[TensorMeta], tensors: TensorStream
    ) -> Published:
        """Pack one pass of ``tensors`` (``layout`` in canonical order, each cast to its
        meta's dtype) into pieces hashed as the pass fills them, then make it visible as
        ``version``. ``phases.gather_s`` is the time spent waiting for the stream."""
        self.reserve(version)  # fail before the (slow) gather and packing
        t0 = time.monotonic()
        try:
            data, pieces, gather_s = pack_stream(
                layout, tensors(), self.piece_bytes, self.buffers.take
            )
        except BaseException:
            self.cancel(version)
            raise
        phases = SyncPhases("http", gather_s=gather_s, bytes=len(data))
        phases.pack_s = time.monotonic() - t0 - gather_s
        manifest = self._manifest(version, data, _dtypes(layout), self.piece_bytes, pieces)
        self.put(manifest, data)
        return Published(version, len(data), phases, done(manifest), LazySha256(data))

    def hash_later(
        self, version: int, data: memoryview, dtypes: dict[str, str], piece_bytes: int
    ) -> Future[WeightsManifest]:
        """Make the reserved ``version``, whose canonical bytes ``data`` are final, visible
        once its pieces are hashed in the background."""

        def prepare() -> WeightsManifest:
            try:
                manifest = self._manifest(
                    version, data, dtypes, piece_bytes, hash_pieces(data, piece_bytes)
                )
                self.put(manifest, data)
                return manifest
            except BaseException:
                # Nobody may ever read this future: say it here, or the version just vanishes
                log.exception("weight store: preparing version %d's catch-up copy failed", version)
                self.cancel(version)
                raise

        return in_background(prepare)

    def reserve(self, version: int) -> None:
        """Announce ``version`` (newer than every version published or reserved): readers
        asking for it wait until :meth:`put` (or :meth:`cancel`)."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be a non-negative int, got {version!r}")
        with self._cond:
            self._check_newer(version)
            self._reserved.add(version)

    def cancel(self, version: int) -> None:
        """Give up a reserved version (its publish failed): readers waiting for it stop."""
        with self._cond:
            self._reserved.discard(version)
            self._cond.notify_all()

    def put(self, manifest: WeightsManifest, data: bytes | memoryview) -> None:
        """Make a version whose bytes and pieces are built visible (reserved or not)."""
        if len(data) != manifest.size:
            raise ValueError(
                f"version {manifest.version}: {len(data)} bytes given, the manifest says "
                f"{manifest.size}"
            )
        entry = PublishedWeights(manifest=manifest, data=data)
        with self._cond:
            if manifest.version not in self._reserved:
                self._check_newer(manifest.version)  # another thread may have published
            self._reserved.discard(manifest.version)
            self._versions[manifest.version] = entry
            if self._latest is None or manifest.version > self._latest.manifest.version:
                self._latest = entry
            while len(self._versions) > self.keep_last:
                self._versions.popitem(last=False)
            self._cond.notify_all()

    def latest(self, wait_s: float = 0.0) -> PublishedWeights | None:
        """The newest version, or ``None`` before the first publish. A newer reserved version
        is waited for (at most ``wait_s``; then :class:`VersionPending`)."""
        with self._cond:
            newest = max(self._reserved, default=-1)
            if newest >= 0:
                self._wait(newest, wait_s)
            return self._latest

    def get(self, version: int, wait_s: float = 0.0) -> PublishedWeights | None:
        """``version`` if it is kept (a reserved one waited for, at most ``wait_s``; then
        :class:`VersionPending`), else ``None``."""
        with self._cond:
            if version in self._reserved:
                self._wait(version, wait_s)
            return self._versions.get(version)

    def versions(self) -> list[int]:
        """Versions currently kept, oldest first."""
        with self._cond:
            return list(self._versions)

    def _wait(self, version: int, wait_s: float) -> None:
        """Under the lock: wait until ``version`` is no longer reserved."""
        deadline = time.monotonic() + wait_s
        while version in self._reserved:
            left = deadline - time.monotonic()
            if left <= 0:
                raise VersionPending(version, wait_s)
            self._cond.wait(left)

    def _check_newer(self, version: int) -> None:
        latest = self._latest
        last = max(self._reserved | ({latest.manifest.version} if latest else set()), default=-1)
        if version <= last:
            raise ValueError(
                f"version {version} is not newer than the last published version "
                f"{last}; versions must increase (use the RL step number)"
            )

    @staticmethod
    def _manifest(
        version: int,
        data: memoryview,
        dtypes: dict[str, str],
        piece_bytes: int,
        pieces: tuple[Piece, ...],
    ) -> WeightsManifest:
        return WeightsManifest(
            version=version, size=len(data), dtypes=dtypes, piece_bytes=piece_bytes,
            pieces=pieces, pieces_sha256=pieces_checksum(version, len(data), pieces),
        )  # fmt: skip


def _dtypes(layout: Sequence[TensorMeta]) -> dict[str, str]:
    ordered = sorted(layout, key=lambda m: m.name)
    return {m.name: str(m.dtype).removeprefix("torch.") for m in ordered}
