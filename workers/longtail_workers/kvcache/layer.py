"""One layer of the engine's KV cache that appends in place instead of concatenating.

:class:`~longtail_workers.kvcache.cache.PaddedKVCache` gives every attention layer of the target
and of the drafter a :class:`GrowingLayer`. Hugging Face's ``DynamicLayer`` appends a decode
step's keys with ``torch.cat``, which copies the whole cache every step: O(L) per token, O(L^2)
per answer, a large share of the decode time in a profile (docs/performance.md, "In-place
KV-cache appends"). Here keys and values live in a buffer with spare slots; an append
writes into the spare slots and grows the buffer geometrically (by half) only when it is full, so
appends cost O(new tokens) amortised, as in a paged engine.

``keys`` / ``values`` read as views of the filled prefix, exactly as ``DynamicLayer`` exposes
them, so HF attention code and :class:`PaddedKVCache` use them unchanged. Assigning a tensor
adopts it as the new buffer, except a prefix view of the current buffer (a crop), which only
moves the fill mark. That is safe because the cache never keeps a view across an append: after
a crop, the next append overwrites the cropped slots.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

MIN_SPARE_SLOTS = 16
"""Slots added at least when a buffer grows (small caches would otherwise grow every step)."""


def _is_prefix_view(t: torch.Tensor, buf: torch.Tensor) -> bool:
    """True if ``t`` is ``buf[..., :n, :]`` for some ``n`` (same storage, start and strides)."""
    return (
        t.dim() == buf.dim() == 4
        and t.data_ptr() == buf.data_ptr()
        and t.stride() == buf.stride()
        and t.shape[:2] == buf.shape[:2]
        and t.shape[3] == buf.shape[3]
        and t.shape[2] <= buf.shape[2]
    )


def _tensor_slot(name: str) -> Any:
    """The ``keys`` / ``values`` attribute: reads the filled prefix, writes through ``_set``."""
    return property(lambda self: self._get(name), lambda self, t: self._set(name, t))


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose appends write into spare capacity; see the module text.

    A buffer is either ``None`` (nothing cached) or ``[B, heads, capacity, head_dim]``.
    """

    keys = _tensor_slot("keys")  # [B, heads, L, head_dim]
    values = _tensor_slot("values")  # [B, heads, L, head_dim]

    def __init__(self, **kwargs: Any) -> None:
        self._bufs: dict[str, torch.Tensor | None] = {"keys": None, "values": None}
        self._fill: dict[str, int] = {"keys": 0, "values": 0}
        # Sets keys/values to None through the slots. transformers leaves __init__ unannotated.
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        # DynamicLayer starts from 1-D empty tensors to concatenate onto; here the first append
        # allocates the buffer, so the buffers stay None until then.
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def get_seq_length(self) -> int:
        return self._fill["keys"]

    def _get(self, name: str) -> torch.Tensor | None:
        buf = self._bufs[name]
        return None if buf is None else buf[:, :, : self._fill[name], :]

    def _set(self, name: str, t: torch.Tensor | None) -> None:
        buf = self._bufs[name]
        if t is not None and buf is not None and _is_prefix_view(t, buf):
            self._fill[name] = int(t.shape[2])  # a crop: keep the buffer, move the fill mark
            return
        self._bufs[name] = t
        self._fill[name] = 0 if t is None else int(t.shape[2])

    @property
    def capacity(self) -> int:
        """Slots the key buffer holds, filled or not."""
        buf = self._bufs["keys"]
        return 0 if buf is None else int(buf.shape[2])

    def _append(self, name: str, new: torch.Tensor) -> torch.Tensor:
        """Write ``new`` ``[B, heads, Q, head_dim]`` after the filled slots; return them all."""
        buf, fill = self._bufs[name], self._fill[name]
        q = int(new.shape[2])
        if buf is None or buf.shape[:2] != new.shape[:2] or fill + q > buf.shape[2]:
            need = fill + q
            b, h, _, d = new.shape
            grown = new.new_empty(b, h, need + max(MIN_SPARE_SLOTS, need // 2), d)
            if fill:
                assert buf is not None
                grown[:, :, :fill] = buf[:, :, :fill]
            buf = grown
        buf[:, :, fill : fill + q] = new
        self._bufs[name], self._fill[name] = buf, fill + q
        return buf[:, :, : fill + q]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append one forward's keys/values ``[B, heads, Q, head_dim]``; return the whole cache."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return self._append("keys", key_states), self._append("values", value_states)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep batch rows ``rows`` (int64, new order), spare slots included (one copy)."""
        for name, buf in self._bufs.items():
            if buf is not None:
                self._bufs[name] = buf[rows]
