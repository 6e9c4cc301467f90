"""How big the native engine's static buffers are: rows, slots per row, and the memory budget.

Called by :class:`~longtail_workers.engine.native.torch_engine.TorchEngine` at the start of every
``generate`` (``row_shape``): the buffers of ``rows.py`` are reused when they already cover what
the call needs and are made anew otherwise. Pure arithmetic over host facts, tested on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from longtail_workers.engine.native.graphs import bucket_for
from longtail_workers.engine.native.rows import RowShape

GIB = 1024**3


@dataclass(frozen=True)
class Needs:
    """What one ``generate`` call asks of the buffers."""

    requests: int
    longest: int
    """Longest prompt + ``max_new_tokens`` over the requests."""
    stops: int
    """Most stop tokens of one request."""
    hidden: bool
    drafter: bool
    depth: int
    """Deepest draft (0 without SD): a speculative step writes up to depth + 1 slots ahead."""


@dataclass(frozen=True)
class Limits:
    """The engine's configuration, as far as sizing is concerned."""

    max_running: int
    max_model_len: int | None
    kv_cache_gb: float | None
    buckets: Sequence[int] | None
    rounding: int
    bytes_per_slot: int
    """Bytes one slot of one row takes in every buffer (KV caches, hidden and token stores)."""


def row_shape(needs: Needs, limits: Limits) -> RowShape:
    """The buffers one call needs, or ValueError naming the setting that does not fit."""
    overhang = needs.depth + 2  # a verify writes depth + 1 slots; one more for the next token
    need_len = needs.longest + overhang
    if limits.max_model_len is not None:
        if need_len > limits.max_model_len:
            raise ValueError(
                f"a request needs {needs.longest} tokens (prompt + max_new_tokens) plus {overhang} "
                f"slots of speculative overhang, more than EngineConfig.max_model_len="
                f"{limits.max_model_len}; raise max_model_len or shorten the request"
            )
        length = limits.max_model_len
    else:
        length = -(-need_len // limits.rounding) * limits.rounding
    rows = min(limits.max_running, max(needs.requests, 1))
    if limits.buckets:  # room for the padding rows of the bucket the first step runs in
        rows = bucket_for(rows, limits.buckets, limits.max_running)
    if limits.kv_cache_gb is not None:
        fit = int(limits.kv_cache_gb * GIB) // (length * limits.bytes_per_slot)
        if fit < 1:
            need_gb = length * limits.bytes_per_slot / GIB
            raise ValueError(
                f"EngineConfig.kv_cache_gb={limits.kv_cache_gb} cannot hold one row of {length} "
                f"slots ({need_gb:.3f} GiB); raise kv_cache_gb or lower max_model_len"
            )
        rows = min(rows, fit)
    return RowShape(
        capacity=rows,
        length=length,
        stop_width=max(needs.stops, 1),
        hidden=needs.hidden,
        drafter=needs.drafter,
    )
