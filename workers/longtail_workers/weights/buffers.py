"""Reused byte buffers for policy versions: the trainer's copies and a receiver's landing buffer.

Used by ``store.WeightStore`` (each version's canonical bytes: the broadcast packs its buckets
into the same host copy), ``broadcast.py`` (a GPU trainer's pinned staging buckets) and
``broadcast_source.py`` (where a CPU receiver lands a version). A fresh multi-GB buffer per
version costs its page faults on the critical path (about 0.2 s per GB on the 2-core CI machine,
on each side of every sync), and on a GPU trainer a pinned allocation costs more than the copy
into it; so a version's buffer is handed out again once nothing views it any more.

"Nothing views it" is read from the buffer's storage use count, which every tensor view, numpy
array and memoryview of it raises (the view :meth:`BufferPool.take` returns, the tensors read out
of it, the store's memoryview, an HTTP piece being sent, a hashing thread's slice).

A pool with a ``spool`` directory (the trainer's store: ``--weight-spool-dir``) maps its buffers
from files there instead of anonymous memory: the bytes are the kernel's page cache, written
back to disk in the background and reclaimable under memory pressure, so the trainer's own
(anonymous) memory does not grow by a version copy per sync. Each file is reserved whole
(``posix_fallocate``: a full disk is an error now, not a SIGBUS at the first write into a
mapped hole) and unlinked at once, so a killed trainer leaves no file behind.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import torch


def _use_count(buf: torch.Tensor) -> int:
    return int(torch._C._storage_Use_Count(buf.untyped_storage()._cdata))


def spooled(spool: Path, size: int) -> torch.Tensor:
    """A ``[size]`` uint8 CPU tensor mapped (shared) from a new, already unlinked file in
    ``spool``, all of its blocks reserved (contents undefined)."""
    fd, path = tempfile.mkstemp(prefix="policy-version-", suffix=".bin", dir=spool)
    try:
        try:
            os.posix_fallocate(fd, 0, max(size, 1))
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"weight spool {spool}: cannot reserve {size / 1e9:.2f} GB for a copy of a policy "
                f"version ({exc.strerror}); free disk space there or point --weight-spool-dir "
                "(the trainer pod's weight-spool volume) at a larger local disk",
            ) from exc
        return torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
    finally:
        os.close(fd)
        os.unlink(path)


class BufferPool:
    """At most ``keep`` uint8 buffers on ``device``, reused by size once unused; pinned when
    ``pin``, file-backed in ``spool`` when given (CPU only)."""

    def __init__(
        self, keep: int, device: str = "cpu", pin: bool = False, spool: Path | None = None
    ) -> None:
        if keep < 0:
            raise ValueError(f"keep must be >= 0 (buffers kept for reuse), got {keep}")
        if spool is not None and (pin or device != "cpu"):
            raise ValueError("a spooled buffer pool is in CPU pageable memory (no pin, no GPU)")
        self.keep, self.device, self.pin, self.spool = keep, device, pin, spool
        self._lock = threading.Lock()
        self._bufs: list[tuple[torch.Tensor, int]] = []  # (buffer, its use count when unused)

    def take(self, size: int) -> torch.Tensor:
        """A ``[size]`` uint8 buffer (contents undefined): an unused one of that size, else new.

        It is a view: the caller's hold, and every view made from it, keep it out of reuse."""
        with self._lock:
            for i, (buf, idle) in enumerate(self._bufs):
                if buf.numel() == size and _use_count(buf) <= idle:
                    self._bufs.append(self._bufs.pop(i))  # most recently used last
                    return buf[:]
            if self.spool is not None:
                buf = spooled(self.spool, size)
            else:
                buf = torch.empty(size, dtype=torch.uint8, device=self.device, pin_memory=self.pin)
            idle, view = _use_count(buf), buf[:]
            if self.keep:
                self._bufs.append((buf, idle))
                self._trim()
            return view

    def _trim(self) -> None:
        """Forget the oldest unused buffers beyond ``keep`` (used ones stay tracked: their
        holders keep the memory anyway, and they are reused once free)."""
        while len(self._bufs) > self.keep:
            unused = [i for i, (b, idle) in enumerate(self._bufs) if _use_count(b) <= idle]
            if not unused:
                return
            del self._bufs[unused[0]]

    def __len__(self) -> int:
        with self._lock:
            return len(self._bufs)
