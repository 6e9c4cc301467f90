"""Capture a step function once per key as a CUDA graph and replay it; run it eagerly elsewhere.

Used by :class:`~longtail_workers.engine.native.torch_engine.TorchEngine` for its decode steps and
speculative steps (keyed by kind, batch bucket, draft depth and the sampling flags). A step
function takes no arguments: it reads and writes the engine's static buffers (``rows.py``), so
a graph captured over them stays valid for as long as those buffers live; a new buffer shape
means a new :class:`StepGraphs`. On a CPU (or with graphs switched off) the same function simply
runs, so the CPU tests exercise exactly the code a GPU replays.

Capturing needs a warm-up run first (lazy initialisation, kernel compilation, allocator
warm-up), and a run of a step mutates the batch's per-row counters; the warm-up therefore runs
on a snapshot of the mutable counters, which are restored before the capture, so the warm-up
leaves no trace (what it wrote to the caches and stores lies past the rows' lengths or is what
the real step writes again). Graphs share one memory pool, as in vLLM and nano-vllm.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
"""Batch buckets a CUDA engine captures (a step pads its batch to the next one)."""


def bucket_for(n: int, buckets: Sequence[int], capacity: int) -> int:
    """The smallest bucket that holds ``n`` rows (the capacity when none does)."""
    for b in buckets:
        if n <= b <= capacity:
            return b
    return capacity


class StepGraphs:
    """Eager or captured execution of step functions (see the module text)."""

    def __init__(self, device: torch.device, enabled: bool, mutable: Sequence[torch.Tensor]):
        self.capturing = enabled and device.type == "cuda"
        self._mutable = list(mutable)
        self._graphs: dict[Hashable, tuple[Any, Any]] = {}
        self._pool: Any = None
        self.just_captured = False
        """The last :meth:`run` captured its graph (its wall time includes the capture)."""

    @property
    def captured(self) -> int:
        """Graphs captured so far."""
        return len(self._graphs)

    def run(self, key: Hashable, fn: Callable[[], Any]) -> Any:
        """``fn()``: eagerly, or by replaying the graph captured for ``key`` (capturing it on
        first use). Returns ``fn``'s outputs (the graph's static output tensors)."""
        self.just_captured = False
        if not self.capturing:
            return fn()
        if key not in self._graphs:
            self._graphs[key] = self._capture(fn)
            self.just_captured = True
        graph, outputs = self._graphs[key]
        graph.replay()
        return outputs

    def _capture(self, fn: Callable[[], Any]) -> tuple[Any, Any]:
        saved = [t.clone() for t in self._mutable]
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # warm-up: compiles kernels, settles the allocator
        torch.cuda.current_stream().wait_stream(side)
        for t, s in zip(self._mutable, saved, strict=True):
            t.copy_(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = fn()
        self._pool = graph.pool()
        return graph, outputs
