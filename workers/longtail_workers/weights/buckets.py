"""Buckets of a policy version's canonical bytes: packing, digests, hashing and reading back.

Used by the broadcast transport (``broadcast.py`` sends, ``broadcast_source.py`` receives). A
version travels as its canonical safetensors bytes in the wire dtype (``pieces.canonical_layout``
gives the tensors' order and the header); bucket ``k`` is the byte range ``[k*B, (k+1)*B)`` of
that stream, so a tensor larger than a bucket simply spans several. :func:`fill_buckets` casts
and copies the tensors of a :data:`~longtail_workers.weights.sync.TensorStream` pass into bucket
buffers one bucket at a time (the sender broadcasts bucket ``k`` while this fills ``k+1``);
:func:`bucket_digest` is the small device-side check every bucket is followed by (the
trainer's host copy, the HTTP catch-up store with pieces = buckets, gets its sha256s later,
``store.WeightStore.hash_later``); :func:`pieces.tensors_from_buffer` reads the received bytes
back as views on the receiver's device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch

from longtail_workers.weights.sync import TensorMeta

DIGEST_ROW = 4096
"""int64 words per row of :func:`bucket_digest`'s position weighting (32 KiB)."""


def bucket_count(size: int, bucket_bytes: int) -> int:
    """How many buckets a version of ``size`` bytes travels in."""
    return -(-size // bucket_bytes)


def bucket_span(k: int, size: int, bucket_bytes: int) -> tuple[int, int]:
    """``(start, stop)`` byte offsets of bucket ``k``."""
    return k * bucket_bytes, min((k + 1) * bucket_bytes, size)


def fill_buckets(
    header: bytes,
    layout: Sequence[TensorMeta],
    tensors: Iterator[torch.Tensor],
    bucket_bytes: int,
    target: Callable[[int], torch.Tensor],
) -> Iterator[int]:
    """Pack ``header`` then each tensor of ``tensors`` (cast to its ``layout`` dtype) into
    buckets; yields ``k`` once bucket ``k`` (the uint8 buffer ``target(k)``) is full.

    ``target(k)`` is called when bucket ``k`` starts: the caller hands out a buffer that is
    free again by then (the sender alternates two, and has waited for the one it reuses). The
    iterator is consumed to its end, so a sharded trainer's gather pass always completes.
    """
    size = len(header) + sum(m.nbytes for m in layout)
    k, pos = 0, 0  # current bucket, bytes written into it
    buf = target(0)

    def write(src: torch.Tensor) -> Iterator[int]:  # src: [n] uint8, any device
        nonlocal k, pos, buf
        done = 0
        while done < src.numel():
            take = min(buf.numel() - pos, src.numel() - done)
            buf[pos : pos + take].copy_(src[done : done + take])
            pos, done = pos + take, done + take
            if pos == buf.numel():
                yield k
                k, pos = k + 1, 0
                if k * bucket_bytes < size:
                    buf = target(k)

    yield from write(torch.frombuffer(bytearray(header), dtype=torch.uint8))
    for meta, tensor in zip(layout, tensors, strict=True):
        if tuple(tensor.shape) != tuple(meta.shape):
            raise ValueError(
                f"tensor {meta.name}: the stream gave shape {tuple(tensor.shape)}, the layout "
                f"says {meta.shape}; the sender's tensors must follow its layout"
            )
        raw = tensor.detach().to(meta.dtype).contiguous().reshape(-1).view(torch.uint8)
        yield from write(raw)  # raw: [nbytes] on the tensor's device


def bucket_digest(buf: torch.Tensor) -> torch.Tensor:
    """``[2]`` int64 on ``buf``'s device: the wrapping sum of ``buf``'s int64 words (and tail
    bytes), and a sum of its 32 KiB rows weighted by position (a swapped or shifted row changes
    it). Cheap on CPU and GPU; it catches corruption in flight, not an adversary (the HTTP copy
    of the same bytes carries sha256s)."""
    n = buf.numel()
    words = n // 8
    rows = words // DIGEST_ROW
    body = buf[: rows * DIGEST_ROW * 8].view(torch.int64).view(rows, DIGEST_ROW)  # [rows, 4096]
    row_sums = body.sum(dim=1)  # [rows]
    weights = torch.arange(1, rows + 1, dtype=torch.int64, device=buf.device)  # [rows]
    rest = buf[rows * DIGEST_ROW * 8 :].to(torch.int64)  # [< 32 KiB] bytes as int64
    plain = row_sums.sum() + rest.sum()
    spread = (row_sums * weights).sum() + (
        rest * torch.arange(1, rest.numel() + 1, dtype=torch.int64, device=buf.device)
    ).sum()
    return torch.stack([plain, spread])
