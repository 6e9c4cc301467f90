"""Pieces of a published policy version: packing, hashing, checking and reading them back.

The trainer's :class:`~longtail_workers.weights.store.WeightStore` packs a version's canonical
safetensors bytes (``checksum.py``) itself (:func:`pack_stream`, as the sharded trainer gathers
the tensors one by one in :func:`canonical_layout` order, casting each to the rollout engine's
dtype): one copy of each tensor into one buffer, each ``piece_bytes`` piece hashed on a
:class:`PieceHasher` thread as soon as the copy has filled it (safetensors' own ``save`` copies
every tensor twice and leaves all hashing for afterwards). Rollout workers pull the pieces in
parallel (``http_sync.HttpWeightClient``), check the manifest's layout (:func:`check_layout`),
verify each piece as it lands in one buffer, and read the tensors straight out of it
(:func:`tensors_from_bytes`: views, not a deserialised copy).

Pieces are byte ranges of the one canonical stream, so a tensor larger than a piece simply
spans several, and the whole version hashes to the checkpoint's ``model_sha256``. Neither that
hash (:class:`LazySha256`, on demand) nor the broadcast's HTTP catch-up copy (:func:`hash_pieces`
on a background thread, :func:`in_background`) is on the step's critical path.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch
from safetensors.torch import save

from longtail_workers.weights.sync import Piece, StateDict, TensorMeta, WeightsManifest

T = TypeVar("T")

DEFAULT_PIECE_BYTES = 64 << 20
"""64 MiB: a 0.5B bf16 policy (~1 GB) is 16 pieces, enough to keep 4 parallel pulls busy and
to overlap hashing with the wire, while the per-request cost (~1 ms on loopback) stays
negligible and a receiver holds at most ``parallel`` pieces in flight beyond what it kept."""

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


def pack_stream(
    layout: Sequence[TensorMeta],
    tensors: Iterable[torch.Tensor],
    piece_bytes: int,
    take: Callable[[int], torch.Tensor] | None = None,
) -> tuple[memoryview, tuple[Piece, ...], float]:
    """The canonical bytes of a version whose whole tensors arrive one by one in ``layout``
    order (a :data:`~longtail_workers.weights.sync.TensorStream` pass; ``layout`` as
    :func:`canonical_layout` orders it), each cast to its :class:`TensorMeta`'s dtype; their
    pieces with each piece's sha256; and the seconds spent waiting for the tensors (a sharded
    trainer's gather). The whole version's sha256 is not here: :func:`content_sha256` hashes
    it afterwards, off the critical path. ``take(n)`` gives the ``[n]`` uint8 host buffer to
    pack into (a ``buffers.BufferPool``'s; default a new one).

    Each tensor is copied (and cast, and moved off its device) straight into its place in one
    buffer, so nothing but that buffer and the tensor in hand is held; each piece is hashed on
    a :class:`PieceHasher` thread as soon as the copy has filled it.
    """
    if piece_bytes < 1:
        raise ValueError(f"piece_bytes must be >= 1, got {piece_bytes}")
    ordered, header = canonical_layout(layout)
    if [m.name for m in ordered] != [m.name for m in layout]:
        raise ValueError(
            "the layout is not in canonical order (first tensors "
            f"{[m.name for m in layout[:3]]}, canonical {[m.name for m in ordered[:3]]}); "
            "iterate in pieces.canonical_layout(metas)[0]'s order"
        )
    total = len(header) + sum(m.nbytes for m in layout)
    buf = take(total) if take else torch.empty(total, dtype=torch.uint8)  # not zeroed: all written
    view = buf.numpy().data.cast("B")  # keeps buf alive
    view[: len(header)] = header
    waited = 0.0
    hasher = PieceHasher(view, piece_bytes)
    try:
        offset = len(header)
        hasher.filled(offset)
        stream = iter(tensors)
        for i, meta in enumerate(layout):
            t0 = time.monotonic()
            tensor = next(stream, None)
            waited += time.monotonic() - t0
            if tensor is None:
                raise ValueError(f"the tensor stream ended after {i} of {len(layout)} tensors")
            _place(buf, offset, meta, tensor)
            offset += meta.nbytes
            hasher.filled(offset)
        if next(stream, None) is not None:
            raise ValueError(f"the tensor stream has more than the layout's {len(layout)} tensors")
        return view, hasher.pieces(), waited
    finally:
        hasher.close()


HASH_THREADS = max(1, min(4, os.cpu_count() or 1))
"""Threads hashing pieces at once (hashlib releases the GIL on large buffers)."""
_BACKGROUND = ThreadPoolExecutor(1, thread_name_prefix="weights-background")
"""Hashing that nothing on the step's critical path waits for, one job at a time, in order."""


class PieceHasher:
    """sha256 of each ``piece_bytes`` piece of ``data``, a buffer filled from the front: a piece
    is hashed on one of ``threads`` threads as soon as :meth:`filled` says it is final, so the
    hashing overlaps the packing (or the wire)."""

    def __init__(self, data: memoryview, piece_bytes: int, threads: int = HASH_THREADS) -> None:
        if piece_bytes < 1:
            raise ValueError(f"piece_bytes must be >= 1, got {piece_bytes}")
        self.data, self.piece_bytes = data, piece_bytes
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="weights-hash")
        self._digests: list[Future[str]] = []

    def filled(self, end: int) -> None:
        """Bytes before ``end`` are final: hash every piece they complete."""
        total = len(self.data)
        while len(self._digests) * self.piece_bytes < total:
            start = len(self._digests) * self.piece_bytes
            stop = min(start + self.piece_bytes, total)
            if stop > end:
                return
            self._digests.append(self._pool.submit(_sha256, self.data[start:stop]))

    def pieces(self) -> tuple[Piece, ...]:
        """Every piece with its sha256 (the whole buffer is final by now; waits for the
        threads)."""
        self.filled(len(self.data))
        size, step = len(self.data), self.piece_bytes
        return tuple(
            Piece(i * step, min(step, size - i * step), d.result())
            for i, d in enumerate(self._digests)
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def hash_pieces(data: memoryview, piece_bytes: int) -> tuple[Piece, ...]:
    """``data``'s pieces with their sha256s, hashed on :data:`HASH_THREADS` threads."""
    hasher = PieceHasher(data, piece_bytes)
    try:
        return hasher.pieces()
    finally:
        hasher.close()


def in_background(fn: Callable[[], T]) -> Future[T]:
    """Run ``fn`` on the weights' background thread (after the jobs queued before it)."""
    return _BACKGROUND.submit(fn)


class LazySha256:
    """The sha256 of the whole of ``data``, hashed on the first call and remembered: the
    checkpoint's ``model_sha256`` is its only reader, so the steps without one never pay for it
    (on a 2-core machine a background pass slowed the rollout workers' pulls)."""

    def __init__(self, data: memoryview) -> None:
        self._data: memoryview | None = data
        self._lock = threading.Lock()
        self._hex = ""

    def __call__(self) -> str:
        with self._lock:
            if self._data is not None:
                self._hex, self._data = _sha256(self._data), None  # the bytes are free again
            return self._hex


def _place(buf: torch.Tensor, offset: int, meta: TensorMeta, tensor: torch.Tensor) -> None:
    """Copy ``tensor`` (any device, cast to ``meta.dtype``) into ``buf[offset:]``."""
    if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != meta.shape:
        got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(
            f"tensor {meta.name!r}: the stream gave {got}, the layout says shape {meta.shape}"
        )
    if tensor.is_floating_point() != meta.dtype.is_floating_point:
        raise ValueError(
            f"tensor {meta.name!r}: {tensor.dtype} cannot travel as {meta.dtype} (only floating "
            "tensors are cast); give integer tensors their own dtype in the layout"
        )
    if meta.nbytes == 0:
        return
    src = tensor.detach()
    if src.device.type != "cpu" and src.dtype != meta.dtype:
        src = src.to(meta.dtype)  # cast on the device: half the bytes cross to the host
    dst = buf[offset : offset + meta.nbytes]
    if offset % meta.dtype.itemsize == 0:
        dst.view(meta.dtype).view(meta.shape).copy_(src)  # one copy: cast, move and place
    else:  # not aligned for a typed view (safetensors' order keeps this from happening)
        dst.copy_(src.to(device="cpu", dtype=meta.dtype).contiguous().view(-1).view(torch.uint8))


def _sha256(data: memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_layout(metas: Sequence[TensorMeta]) -> tuple[list[TensorMeta], bytes]:
    """The order a version's tensors travel in, and its safetensors header (length included).

    Every sender iterates its tensors in this order (``TensorStream``), and :func:`pack`,
    :func:`pack_stream` and the broadcast buckets all write the header, then the tensors' bytes
    in it: the canonical bytes of ``checksum.py``. The order is whatever this safetensors
    version's ``save`` uses (by dtype, then name): it is read from ``save`` of one-element
    stand-ins, so the bytes stay canonical if it changes.
    """
    if not metas:
        raise ValueError("cannot serialise an empty state dict: there are no weights to publish")
    by_name = {m.name: m for m in metas}
    if len(by_name) != len(metas):
        twice = sorted(n for n, c in Counter(m.name for m in metas).items() if c > 1)
        raise ValueError(f"tensor name(s) {twice} appear twice in the layout; names must be unique")
    probe = save({m.name: torch.zeros(1, dtype=m.dtype) for m in metas})
    (length,) = struct.unpack("<Q", probe[:8])
    order = json.loads(probe[8 : 8 + length])
    header: dict[str, object] = {}
    ordered: list[TensorMeta] = []
    offset = 0
    for name, probed in order.items():
        meta = by_name[name]
        header[name] = {
            "dtype": probed["dtype"],
            "shape": list(meta.shape),
            "data_offsets": [offset, offset + meta.nbytes],
        }
        ordered.append(meta)
        offset += meta.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads its header to 8 bytes with spaces
    return ordered, struct.pack("<Q", len(text)) + text


def metas_of(state_dict: Mapping[str, torch.Tensor]) -> list[TensorMeta]:
    """Each tensor of ``state_dict`` as it is (own dtype, shape), in the dict's order."""
    out = []
    for key, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"state dict entry {key!r} is a {type(tensor).__name__}, not a tensor; "
                "publish model.state_dict() (tensors only)"
            )
        out.append(TensorMeta(key, tensor.dtype, tuple(tensor.shape)))
    return out


def check_layout(manifest: WeightsManifest, source: str) -> None:
    """Raise ``ValueError`` unless the pieces cover ``[0, size)`` in order, each at most
    ``piece_bytes`` long (a manifest that would leave bytes unverified is refused)."""
    if manifest.piece_bytes < 1 or not manifest.pieces:
        raise ValueError(
            f"{source}: version {manifest.version} is advertised without pieces "
            f"(piece_bytes={manifest.piece_bytes}); the trainer runs an older longtail: "
            "run the same longtail version on the trainer and the rollout workers"
        )
    offset = 0
    for i, piece in enumerate(manifest.pieces):
        if piece.offset != offset or not 0 < piece.size <= manifest.piece_bytes:
            raise ValueError(
                f"{source}: version {manifest.version}: piece {i} is bytes "
                f"[{piece.offset}, {piece.offset + piece.size}), expected it to start at "
                f"{offset} with 1..{manifest.piece_bytes} bytes; refusing the version"
            )
        offset += piece.size
    if offset != manifest.size:
        raise ValueError(
            f"{source}: version {manifest.version}: pieces cover {offset} bytes, the version "
            f"has {manifest.size}; refusing it"
        )


def tensors_from_bytes(data: memoryview) -> StateDict:
    """The state dict stored in the verified safetensors bytes ``data``: every tensor is a
    view of ``data`` (no copy); loading it into a model (``apply_state_dict``) copies, as
    ``load_state_dict`` always does."""
    return tensors_from_buffer(torch.frombuffer(data, dtype=torch.uint8))


def tensors_from_buffer(buf: torch.Tensor) -> StateDict:
    """The state dict in the canonical bytes ``buf`` (uint8, any device) as views of it.

    The header is read on the host, the tensors stay where the bytes landed (the broadcast
    receiver's device buffer; the HTTP client's host buffer via :func:`tensors_from_bytes`).
    safetensors orders tensors by dtype size, largest first, and pads the header to 8 bytes,
    so every view is aligned.
    """
    (header_len,) = struct.unpack("<Q", bytes(buf[:8].cpu().numpy()))
    if not 0 < header_len <= buf.numel() - 8:
        raise ValueError(f"header length {header_len} does not fit {buf.numel()} bytes")
    header = json.loads(bytes(buf[8 : 8 + header_len].cpu().numpy()))
    base = 8 + header_len
    out: StateDict = {}
    covered = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(meta["dtype"])
        if dtype is None:
            raise ValueError(f"tensor {name!r}: dtype {meta['dtype']} is not supported here")
        start, end = meta["data_offsets"]
        if not 0 <= start <= end <= buf.numel() - base:
            raise ValueError(f"tensor {name!r}: bytes [{start}, {end}) outside the data")
        shape = tuple(meta["shape"])
        out[name] = buf[base + start : base + end].view(dtype).view(shape)
        covered = max(covered, end)
    if base + covered != buf.numel():
        raise ValueError(f"the tensors cover {base + covered} bytes of {buf.numel()}")
    return out
