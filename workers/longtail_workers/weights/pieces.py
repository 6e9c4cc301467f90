"""Pieces of a published policy version: packing, hashing, checking and reading them back.

The trainer's :class:`~longtail_workers.weights.store.WeightStore` packs a version's canonical
safetensors bytes (``checksum.py``) itself (:func:`pack_stream`, as the sharded trainer gathers
the tensors one by one in :func:`canonical_layout` order, casting each to the rollout engine's
dtype; :func:`pack` for a whole state dict): one copy of each tensor into one buffer, and each
``piece_bytes`` piece is hashed on a thread as soon as the copy has filled it, while another
thread hashes the whole stream in order (safetensors' own ``save`` copies every tensor twice
and leaves all hashing for afterwards). Rollout workers pull the pieces in parallel
(``http_sync.HttpWeightClient``), check the manifest's layout (:func:`check_layout`), verify
each piece as it lands in one buffer, and read the tensors straight out of it
(:func:`tensors_from_bytes`: views, not a deserialised copy).

Pieces are byte ranges of the one canonical stream, so the whole version still hashes to the
manifest's ``checksum`` (the checkpoint's ``model_sha256``) and a tensor larger than a piece
simply spans several pieces.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from safetensors.torch import save

from longtail_workers.weights.sync import Piece, StateDict, TensorMeta, WeightsManifest

DEFAULT_PIECE_BYTES = 64 << 20
"""64 MiB: a 0.5B bf16 policy (~1 GB) is 16 pieces, enough to keep 4 parallel pulls busy and
to overlap hashing with the wire, while the per-request cost (~1 ms on loopback) stays
negligible and a receiver holds at most ``parallel`` pieces in flight beyond what it kept."""

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


def pack(
    state_dict: Mapping[str, torch.Tensor], piece_bytes: int
) -> tuple[memoryview, str, tuple[Piece, ...]]:
    """The canonical bytes of ``state_dict`` (equal to ``serialize_state_dict``'s), their
    sha256, and their pieces with each piece's sha256 (:func:`pack_stream` of its tensors)."""
    layout, _ = canonical_layout(metas_of(state_dict))
    data, checksum, pieces, _ = pack_stream(
        layout, (state_dict[m.name] for m in layout), piece_bytes
    )
    return data, checksum, pieces


def pack_stream(
    layout: Sequence[TensorMeta], tensors: Iterable[torch.Tensor], piece_bytes: int
) -> tuple[memoryview, str, tuple[Piece, ...], float]:
    """The canonical bytes of a version whose whole tensors arrive one by one in ``layout``
    order (a :data:`~longtail_workers.weights.sync.TensorStream` pass; ``layout`` as
    :func:`canonical_layout` orders it), each cast to its :class:`TensorMeta`'s dtype; their
    sha256; their pieces with each piece's sha256; and the seconds spent waiting for the
    tensors (a sharded trainer's gather).

    Each tensor is copied (and cast, and moved off its device) straight into its place in one
    buffer, so nothing but that buffer and the tensor in hand is held. hashlib releases the GIL
    on large buffers: each piece is hashed on one thread and fed to the whole-stream hash on
    another as soon as the copy has filled it, while this thread takes the next tensors.
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
    buf = torch.empty(total, dtype=torch.uint8)  # not zeroed: every byte is written below
    view = buf.numpy().data.cast("B")  # keeps buf alive
    view[: len(header)] = header
    whole = hashlib.sha256()
    digests: list[Future[str]] = []
    updates: list[Future[None]] = []
    waited = 0.0
    with (
        ThreadPoolExecutor(1, thread_name_prefix="weights-hash") as piece_pool,
        ThreadPoolExecutor(1, thread_name_prefix="weights-hash-all") as whole_pool,
    ):

        def hand_over(end: int) -> None:
            """Bytes before ``end`` are packed: hash every piece they complete."""
            while len(digests) * piece_bytes < total:
                start = len(digests) * piece_bytes
                stop = min(start + piece_bytes, total)
                if stop > end:
                    return
                chunk = view[start:stop]
                digests.append(piece_pool.submit(_sha256, chunk))
                updates.append(whole_pool.submit(whole.update, chunk))

        offset = len(header)
        hand_over(offset)
        stream = iter(tensors)
        for i, meta in enumerate(layout):
            t0 = time.monotonic()
            tensor = next(stream, None)
            waited += time.monotonic() - t0
            if tensor is None:
                raise ValueError(f"the tensor stream ended after {i} of {len(layout)} tensors")
            _place(buf, offset, meta, tensor)
            offset += meta.nbytes
            hand_over(offset)
        if next(stream, None) is not None:
            raise ValueError(f"the tensor stream has more than the layout's {len(layout)} tensors")
        for update in updates:
            update.result()
        pieces = tuple(
            Piece(i * piece_bytes, min(piece_bytes, total - i * piece_bytes), d.result())
            for i, d in enumerate(digests)
        )
    return view, whole.hexdigest(), pieces, waited


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


def _layout(state_dict: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], bytes]:
    """The tensors (detached, contiguous, CPU) in :func:`canonical_layout` order, and the header."""
    ordered, header = canonical_layout(metas_of(state_dict))
    tensors = {m.name: state_dict[m.name].detach().to("cpu").contiguous() for m in ordered}
    return tensors, header


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
