"""Wall-clock timing of one call: warm-up runs, then the median of a few timed repeats.

Called by the profile's forward and training measurements (``profile/forwards.py``,
``profile/training.py``). On a GPU every timed call is bracketed by ``torch.cuda.synchronize``
so the time is the kernels' and not the launch queue's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Repeats:
    """How often each measurement runs."""

    warmup: int = 1
    """Untimed runs first (allocator, kernel selection, caches)."""
    repeats: int = 3
    """Timed runs; the median is reported."""

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.repeats < 1:
            raise ValueError(
                f"warmup={self.warmup}, repeats={self.repeats}: need --warmup >= 0, --repeats >= 1"
            )


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], device: torch.device, runs: Repeats) -> float:
    """Median wall-clock seconds of ``fn()`` over ``runs.repeats`` after ``runs.warmup`` calls."""
    return first_and_median(fn, device, runs)[1]


def first_and_median(
    fn: Callable[[], object], device: torch.device, runs: Repeats
) -> tuple[float, float]:
    """``(seconds of the very first call, median of the timed ones)``: the first call is a
    warm-up call when there are any, else the first timed one."""
    times = [_timed(fn, device) for _ in range(runs.warmup + runs.repeats)]
    return times[0], statistics.median(times[runs.warmup :])


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0
