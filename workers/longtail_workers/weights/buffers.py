"""Reused byte buffers for policy versions: the trainer's copies and a receiver's landing buffer.

Used by ``store.WeightStore`` (each HTTP version's canonical bytes), ``broadcast.py`` (the
trainer's host copy of the buckets, pinned on a GPU trainer) and ``broadcast_source.py`` (where
a CPU receiver lands a version). A fresh multi-GB buffer per version costs its page faults on
the critical path (about 0.2 s per GB on the 2-core CI machine, on each side of every sync), and
on a GPU trainer a pinned allocation costs more than the copy into it; so a version's buffer is
handed out again once nothing views it any more.

"Nothing views it" is read from the buffer's storage use count, which every tensor view, numpy
array and memoryview of it raises (the view :meth:`BufferPool.take` returns, the tensors read out
of it, the store's memoryview, an HTTP piece being sent, a hashing thread's slice).
"""

from __future__ import annotations

import threading

import torch


def _use_count(buf: torch.Tensor) -> int:
    return int(torch._C._storage_Use_Count(buf.untyped_storage()._cdata))


class BufferPool:
    """At most ``keep`` uint8 buffers on ``device``, reused by size once unused."""

    def __init__(self, keep: int, device: str = "cpu", pin: bool = False) -> None:
        if keep < 0:
            raise ValueError(f"keep must be >= 0 (buffers kept for reuse), got {keep}")
        self.keep, self.device, self.pin = keep, device, pin
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
