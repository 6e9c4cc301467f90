"""The trainer's weight publisher: the store of published policy versions and its deliveries.

:class:`WeightStore` is the one :class:`~longtail_workers.weights.sync.WeightPublisher`: the
driver (``trainer/group.py``) hands each version's tensor stream to
:meth:`WeightStore.publish_stream`, and the store keeps the last K versions, each immutable and
whole. How a version then reaches the rollout workers is up to the :class:`Delivery` objects
attached to the store (:meth:`WeightStore.attach`), which it tells about each new version:
the HTTP weight server (``http_sync.WeightServer``: workers pull the store's copy in pieces)
and, with ``--weight-sync broadcast``, the broadcast (``broadcast.Broadcast``: it sends the
version in buckets while it packs the store's copy, and the server is the catch-up path).
Nothing reaches through another object into the store: each delivery is given what it needs.

Publishing is atomic: the canonical bytes and their pieces' sha256s are built completely
*outside* the lock, then one assignment under the lock makes the new version visible. A reader
takes a reference to an immutable :class:`PublishedWeights` under the lock and reads it
afterwards, so it sees either the previous version or the new one, never a half-written one,
and a slow download never blocks the trainer's next publish.

Without a sending delivery the store packs the stream itself (``pieces.pack_stream``), so no
whole state dict is ever built: each version is cut into pieces of ``piece_bytes``, each with
its sha256 in the manifest, so rollout workers can pull and verify the pieces in parallel; the
pieces are views of the one serialised copy, never copies. With one (the broadcast) the
version is *reserved* before its first bucket (:meth:`WeightStore.reserve`), the delivery packs
the store's copy as it sends, and the pieces (= buckets) are hashed afterwards in the
background (:meth:`WeightStore.hash_later`), off the critical path. Readers asking for a
reserved version wait for it (:meth:`WeightStore.get`'s ``wait_s``), then get it whole. The
whole version's sha256 (the checkpoint's) is hashed only when a checkpoint asks for it
(``pieces.LazySha256``).

Memory: the store holds ``keep_last`` serialised copies (about 2 bytes per bf16 parameter
each). Two is enough for pull-based sync (the newest, plus the one workers may still be
downloading); more lets lagging workers catch up to an older version.
"""

from __future__ import annotations

import abc
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


@dataclass
class Outgoing:
    """A version the store is publishing, as its deliveries are told about it."""

    version: int
    layout: list[TensorMeta]
    """Its tensors in canonical order (``pieces.canonical_layout``)."""
    header: bytes
    """Its safetensors header (the first bytes of the canonical bytes)."""
    host: torch.Tensor
    """``[size]`` uint8: the store's copy of its canonical bytes (a sending delivery fills it;
    final for every other delivery)."""
    phases: SyncPhases
    """The trainer's timings of this publish (a sending delivery fills them)."""

    @property
    def size(self) -> int:
        return self.host.numel()


class Delivery(abc.ABC):
    """One way the store's versions reach the workers, attached with
    :meth:`WeightStore.attach`; the store tells it about every new version (:meth:`send`)."""

    transport: str
    """``http`` or ``broadcast``: the publish's ``SyncPhases.transport`` when it sends."""
    sends: bool = False
    """True for the delivery that packs the store's copy from the tensor stream itself while
    it sends it (the broadcast; at most one per store). Its :attr:`piece_bytes` are the
    pieces the store hashes afterwards."""
    piece_bytes: int = 0

    @abc.abstractmethod
    def send(self, out: Outgoing, tensors: TensorStream | None) -> None:
        """Take ``out`` to the workers. A sending delivery gets the version's tensor stream
        (``tensors``: it starts the one pass when it is ready for it), packs ``out.host`` from
        it and fills ``out.phases``; every other one gets ``None``, after the store's copy is
        made."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop delivering (the trainer stops): :meth:`WeightStore.close` calls it."""


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
        self._deliveries: list[Delivery] = []
        if spool_dir is not None and not spool_dir.is_dir():
            raise ValueError(
                f"weight spool {spool_dir} is not a directory; create it (a local disk with room "
                f"for {keep_last + 1} policy versions) or leave --weight-spool-dir unset"
            )
        self.buffers = BufferPool(keep_last + 1, spool=spool_dir)
        """Host buffers of the versions (reused once evicted and no reader holds one); mapped
        from files in ``spool_dir`` when given (``buffers.spooled``: page cache, not the
        process's own memory), else anonymous memory."""

    def attach(self, delivery: Delivery) -> None:
        """Tell ``delivery`` about every version published from now on."""
        if delivery.sends and any(d.sends for d in self._deliveries):
            raise ValueError(
                f"a {delivery.transport} delivery cannot be attached: this store already has a "
                "delivery that packs while it sends (one pass over the tensors per version)"
            )
        self._deliveries.append(delivery)

    def close(self) -> None:
        """Close every attached delivery (the trainer stops)."""
        for delivery in reversed(self._deliveries):
            delivery.close()

    def publish_stream(
        self, version: int, layout: Sequence[TensorMeta], tensors: TensorStream
    ) -> Published:
        """Publish ``version`` from one pass of ``tensors`` (``layout`` in canonical order, each
        cast to its meta's dtype), then tell the deliveries. Without a sending delivery the
        pass is packed into pieces hashed as it fills them, and the version is visible when
        this returns; with one (the broadcast) that delivery packs as it sends and the
        pieces are hashed afterwards. ``phases.gather_s`` is the time spent waiting for the
        stream."""
        sender = next((d for d in self._deliveries if d.sends), None)
        self.reserve(version)  # fail before the (slow) gather and packing
        try:
            if sender is None:
                out, published = self._pack(version, layout, tensors)
            else:
                out, published = self._send(sender, version, layout, tensors)
        except BaseException:
            self.cancel(version)
            raise
        for delivery in self._deliveries:
            if delivery is not sender:
                delivery.send(out, None)
        return published

    def _pack(
        self, version: int, layout: Sequence[TensorMeta], tensors: TensorStream
    ) -> tuple[Outgoing, Published]:
        """The pass packed into pieces hashed as it fills them (``pack_stream`` checks the
        layout's order); visible on return."""
        taken: list[torch.Tensor] = []

        def take(n: int) -> torch.Tensor:
            taken.append(self.buffers.take(n))
            return taken[-1]

        t0 = time.monotonic()
        data, pieces, gather_s = pack_stream(layout, tensors(), self.piece_bytes, take)
        phases = SyncPhases("http", gather_s=gather_s, bytes=len(data))
        phases.pack_s = time.monotonic() - t0 - gather_s
        manifest = self._manifest(version, data, _dtypes(layout), self.piece_bytes, pieces)
        self.put(manifest, data)
        published = Published(version, len(data), phases, done(manifest), LazySha256(data))
        header = bytes(data[: 8 + int.from_bytes(data[:8], "little")])  # safetensors' own
        return Outgoing(version, list(layout), header, taken[0], phases), published

    def _send(
        self,
        sender: Delivery,
        version: int,
        layout: Sequence[TensorMeta],
        tensors: TensorStream,
    ) -> tuple[Outgoing, Published]:
        """The pass packed by ``sender`` while it sends; the pieces (its buckets) hashed after,
        the version visible to readers then."""
        ordered, header = canonical_layout(layout)
        if [m.name for m in ordered] != [m.name for m in layout]:
            raise ValueError(
                "publish_stream: the layout is not in canonical order; build it with "
                "pieces.canonical_layout(metas) and iterate the tensors in that order"
            )
        size = len(header) + sum(m.nbytes for m in ordered)
        host = self.buffers.take(size)  # [size], not zeroed: the sender writes every byte
        view = host.numpy().data.cast("B")  # keeps host alive
        out = Outgoing(version, ordered, header, host, SyncPhases(sender.transport, bytes=size))
        sender.send(out, tensors)
        ready = self.hash_later(version, view, _dtypes(ordered), sender.piece_bytes)
        return out, Published(version, size, out.phases, ready, LazySha256(view))

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


def publish_state_dict(
    publisher: WeightPublisher,
    version: int,
    state_dict: Mapping[str, torch.Tensor],
    dtype: torch.dtype | None = None,
) -> Published:
    """Publish a whole ``state_dict`` as ``version`` through ``publisher.publish_stream`` (the
    profile, the benches and the tests; the trainer streams its policy instead), its floating
    tensors cast to ``dtype`` when given."""
    metas = metas_of(state_dict)
    if dtype is not None:
        metas = [
            TensorMeta(m.name, dtype, m.shape) if m.dtype.is_floating_point else m for m in metas
        ]
    layout, _ = canonical_layout(metas)
    return publisher.publish_stream(version, layout, lambda: (state_dict[m.name] for m in layout))


def _dtypes(layout: Sequence[TensorMeta]) -> dict[str, str]:
    ordered = sorted(layout, key=lambda m: m.name)
    return {m.name: str(m.dtype).removeprefix("torch.") for m in ordered}
