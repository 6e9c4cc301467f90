"""The native engine's static KV cache: fixed slots per row, a slot's index is its token's position.

Used by the torch engine for the target model and by speculative decoding for the drafter
(``engine/native/rows.py`` owns one of each), and by ``profile/forwards.py``. Every attention
layer has a key and a value buffer ``[rows, kv_heads, length, head_dim]`` allocated once, so a
step's inputs, outputs and cache addresses never change and a step can be captured as a CUDA graph
(``engine/native/graphs.py``). Row ``r`` of the batch being decoded is cache row ``r``: the
engine keeps its live rows packed at the top (a retired row's slot is refilled by moving the last
live row into it, :meth:`SlotKVCache.move_rows`).

Because a slot is a position, there is no padding and there are no holes: a prompt is written
at slots ``0..P-1``, a decode step writes its token at the row's length, and a rejected draft's
slot is simply beyond the row's length afterwards and is overwritten by the next token written
there. What a query may read is described by :class:`SlotAttention` (passed through the Hugging
Face decoder as its attention mask): slots ``lo .. q_pos`` of its row, so a padding query (an
unused row of a batch bucket, a right-padded prompt) only ever writes slots nobody reads yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class SlotAttention:
    """Where the queries of one forward sit and which slots each may read.

    The engine passes it down the Hugging Face decoder as the attention mask (a ``dict`` mask is
    used as is, see ``slot_attention.py``); the cache writes the forward's new keys/values at
    ``q_pos`` and the attention reads ``lo[b, i] <= slot <= q_pos[b, i]`` of row ``row0 + b``.
    """

    q_pos: torch.Tensor
    """``[B, Q]`` int64: the slot (= token position) of every query; its key/value goes there."""
    lo: torch.Tensor
    """``[B, Q]`` int64: the first slot each query reads (0, or a drafter's window start)."""
    span: int
    """Every slot read lies below this (a static bound: the cache length in a captured step)."""
    row0: int = 0
    """Cache row of batch row 0 (a prefill group goes below the rows already decoding)."""
    backend: str = "torch"
    """``torch`` (masked SDPA over ``span`` slots, the reference) or ``triton`` (reads only the
    slots each query may read; ``triton_attention.py``)."""
    _mask: torch.Tensor | None = field(default=None, repr=False)
    _where: torch.Tensor | None = field(default=None, repr=False)

    def mask(self) -> torch.Tensor:
        """``[B, 1, Q, span]`` bool: the reference path's mask, built once per forward."""
        if self._mask is None:
            slot = torch.arange(self.span, device=self.q_pos.device)  # [S]
            upper = slot <= self.q_pos[..., None]  # [B, Q, S]
            self._mask = (upper & (slot >= self.lo[..., None]))[:, None]
        return self._mask

    def write_index(self, heads: int, head_dim: int) -> torch.Tensor:
        """``[B, heads, Q, head_dim]`` slot index of every new key/value element, built once per
        forward (every layer writes at the same slots)."""
        if self._where is None:
            b, q = self.q_pos.shape
            self._where = self.q_pos[:, None, :, None].expand(b, heads, q, head_dim)
        return self._where


class SlotKVCache:
    """Key/value buffers of every attention layer; see the module text.

    Duck-types the part of ``transformers.Cache`` a decoder layer calls (``update``); the
    forward's :class:`SlotAttention` must be set as :attr:`step` before the forward.
    """

    def __init__(
        self,
        config: Any,
        rows: int,
        length: int,
        device: torch.device,
        dtype: torch.dtype,
        num_layers: int | None = None,
    ) -> None:
        if rows < 1 or length < 1:
            raise ValueError(f"a KV cache needs rows >= 1 and length >= 1, got {rows}x{length}")
        layers = int(config.num_hidden_layers) if num_layers is None else num_layers
        heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.rows, self.length = rows, length
        shape = (rows, heads, length, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.step: SlotAttention | None = None

    @staticmethod
    def bytes_per_token(config: Any, dtype: torch.dtype, num_layers: int | None = None) -> int:
        """Bytes one token's keys and values take in every layer."""
        layers = int(config.num_hidden_layers) if num_layers is None else num_layers
        heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        return 2 * layers * heads * head_dim * torch.empty((), dtype=dtype).element_size()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write one layer's new keys/values ``[B, heads, Q, head_dim]`` at the step's slots.

        Returns this batch's rows of the whole buffers ``[B, heads, length, head_dim]`` (views);
        the attention reads only what :class:`SlotAttention` allows.
        """
        step = self.step
        if step is None:
            raise RuntimeError("SlotKVCache.update outside a step: set cache.step first")
        b, h, _, d = key_states.shape
        rows = slice(step.row0, step.row0 + b)
        keys, values = self.keys[layer_idx][rows], self.values[layer_idx][rows]
        where = step.write_index(h, d)  # [B, heads, Q, head_dim]
        keys.scatter_(2, where, key_states.to(keys.dtype))
        values.scatter_(2, where, value_states.to(values.dtype))
        return keys, values

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        """Copy the first ``length`` slots of rows ``src`` to rows ``dst`` (int64 ``[n]``)."""
        if length <= 0 or src.numel() == 0:
            return
        for buf in self.keys + self.values:
            buf[dst, :, :length] = buf[src, :, :length]
