"""A batched KV cache with per-slot validity, and the attention mask that goes with it.

Used by the torch engine for the target model and by speculative decoding for the drafter. The
keys/values live in a Hugging Face ``DynamicCache`` (so any HF decoder that appends to it works)
whose layers append in place (:class:`~longtail_workers.kvcache.layer.GrowingLayer`), shaped
``[B, heads, L, head_dim]`` per layer: all rows share the slot axis ``L``. Rows differ in how many
of those slots hold real tokens, which is tracked in ``valid`` ``[B, L]``:

* prompts are left-padded at prefill (invalid slots on the left);
* rejected draft tokens leave holes (their slots are marked invalid instead of being cut out,
  because each row rejects a different number);
* merging a newly admitted group left-pads the shorter cache.

Keys are stored after RoPE, and every forward receives explicit ``position_ids``, so a slot's
index never has to equal its token's position: only validity and slot order matter. When too
much of the slot axis is waste, :meth:`PaddedKVCache.compact` packs each row's valid slots to the
right (one gather), which keeps memory and attention cost proportional to the longest row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from longtail_workers.kvcache.layer import GrowingLayer

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

MASKED_ATTENTION = ("sdpa", "eager")
"""Attention implementations that accept the engine's explicit 4D masks."""


def check_attention_implementation(config: object) -> str:
    """The model's attention implementation, refused unless it takes explicit 4D masks."""
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl not in MASKED_ATTENTION:
        raise ValueError(
            f"attention implementation {impl!r} cannot take the engine's per-slot masks (holes "
            f"from rejected drafts); load the model with attn_implementation='sdpa' or 'eager'"
        )
    return impl


def attention_mask(
    past_valid: torch.Tensor, new_valid: torch.Tensor, dtype: torch.dtype, implementation: str
) -> torch.Tensor:
    """4D mask ``[B, 1, Q, L + Q]`` for Q new slots appended after L cached slots.

    A valid query attends to valid slots at or before its own slot (causal by slot order, which
    equals position order for valid slots). An invalid (padding) query attends only to itself:
    no row is fully masked, so attention never produces NaN, and nothing valid ever attends to it.
    SDPA gets a boolean mask (True = attend; a quarter of the memory of a float mask), eager an
    additive one (0 or ``finfo(dtype).min``).
    """
    allowed = _allowed(past_valid, new_valid)  # [B, 1, Q, L+Q]
    if implementation == "sdpa":
        return allowed
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)


def _allowed(past_valid: torch.Tensor, new_valid: torch.Tensor) -> torch.Tensor:
    b, q = new_valid.shape
    if q == 1:
        # Decode and draft steps (one query per row): causality is trivial, so the mask is the
        # cached validity gated by the query's own validity, plus the query's own slot. Same
        # result as the general path below in ~3 ops instead of ~10 (this runs every step).
        own = torch.ones(b, 1, dtype=torch.bool, device=new_valid.device)
        return torch.cat([past_valid & new_valid, own], dim=1)[:, None, None, :]
    length = past_valid.shape[1]
    device = new_valid.device
    kv_valid = torch.cat([past_valid, new_valid], dim=1)  # [B, L+Q]
    q_slot = length + torch.arange(q, device=device)  # [Q]
    kv_slot = torch.arange(length + q, device=device)  # [L+Q]
    causal = kv_slot[None, :] <= q_slot[:, None]  # [Q, L+Q]
    allowed = kv_valid[:, None, :] & causal[None]  # [B, Q, L+Q]
    self_only = (kv_slot[None, :] == q_slot[:, None])[None].expand(b, q, length + q)
    return torch.where(new_valid[:, :, None], allowed, self_only)[:, None]


class PaddedKVCache:
    """Keys/values of a running batch plus which slots are real; see the module text."""

    def __init__(self, config: PreTrainedConfig, batch_size: int, device: torch.device) -> None:
        self.config = config
        self.attn_implementation = check_attention_implementation(config)
        self.cache = DynamicCache(config=config)
        unsupported = [type(layer).__name__ for layer in self.cache.layers]
        unsupported = [name for name in unsupported if name != DynamicLayer.__name__]
        if unsupported:
            raise ValueError(
                f"the torch engine supports full-attention KV caches only; this model's cache has "
                f"{sorted(set(unsupported))} layers (sliding-window or linear attention). Disable "
                "sliding windows in the model config (use_sliding_window=false) or use another "
                "engine backend"
            )
        # Same layers, appending in place (kv_layer.py): the decode step's cost stops growing
        # with the cache length.
        self.cache.layers = [GrowingLayer() for _ in self.cache.layers]
        if self.cache.layer_class_to_replicate is not None:
            self.cache.layer_class_to_replicate = GrowingLayer
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)  # [B, L]

    @property
    def batch_size(self) -> int:
        return int(self.valid.shape[0])

    @property
    def num_slots(self) -> int:
        return int(self.valid.shape[1])

    def valid_counts(self) -> torch.Tensor:
        """Real tokens per row ``[B]``."""
        return self.valid.sum(dim=1)

    def _layers(self) -> list[GrowingLayer]:
        return [layer for layer in self._all_layers() if layer.is_initialized]

    def _all_layers(self) -> list[GrowingLayer]:
        # __init__ made every layer (and the class HF replicates for new ones) a GrowingLayer.
        return cast("list[GrowingLayer]", self.cache.layers)

    def mask_for(self, new_valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Attention mask for a forward that appends ``new_valid.shape[1]`` slots."""
        return attention_mask(self.valid, new_valid, dtype, self.attn_implementation)

    def commit(self, new_valid: torch.Tensor) -> None:
        """Record validity of the slots the last forward appended (call right after it)."""
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        for layer in self._layers():
            if layer.keys.shape[-2] != self.num_slots:
                raise RuntimeError(
                    f"KV cache holds {layer.keys.shape[-2]} slots but validity tracks "
                    f"{self.num_slots}; a forward ran without commit()"
                )

    def invalidate_tail(self, keep: torch.Tensor) -> None:
        """Among the last ``keep.shape[1]`` slots, mark those with ``keep == False`` as holes."""
        n = keep.shape[1]
        self.valid[:, self.num_slots - n :] &= keep

    def drop_last(self, n: int) -> None:
        """Remove the last ``n`` slots of every row (speculative drafter steps)."""
        if n <= 0:
            return
        for layer in self._layers():
            layer.keys = layer.keys[..., :-n, :]
            layer.values = layer.values[..., :-n, :]
        self.valid = self.valid[:, :-n]

    def keep_last(self, n: int) -> None:
        """Keep only the newest ``n`` slots of every row (a sliding window; views, no copy)."""
        if n < 0:
            raise ValueError(f"keep_last needs n >= 0, got {n}")
        drop = self.num_slots - n
        if drop <= 0:
            return
        for layer in self._layers():
            layer.keys = layer.keys[..., drop:, :]
            layer.values = layer.values[..., drop:, :]
        self.valid = self.valid[:, drop:]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (int64 indices, in the new order)."""
        for layer in self._layers():
            layer.select_rows(rows)
        self.valid = self.valid[rows]

    def waste(self) -> int:
        """Slots that compaction would free: total minus the longest row's real tokens."""
        if self.batch_size == 0:
            return self.num_slots
        return self.num_slots - int(self.valid_counts().max())

    def compact(self) -> None:
        """Pack each row's valid slots to the right end, in order; shrink to the longest row."""
        if self.batch_size == 0 or self.num_slots == 0:
            return
        keep = int(self.valid_counts().max())
        # A stable sort on validity puts invalid slots first and keeps valid ones in slot order.
        sorted_valid, order = torch.sort(self.valid.to(torch.int8), dim=1, stable=True)
        order = order[:, self.num_slots - keep :]  # [B, keep]
        for layer in self._layers():
            b, h, _, d = layer.keys.shape
            idx = order[:, None, :, None].expand(b, h, keep, d)
            layer.keys = layer.keys.gather(2, idx)
            layer.values = layer.values.gather(2, idx)
        self.valid = sorted_valid[:, self.num_slots - keep :].bool()

    def maybe_compact(self, min_waste: int = 32) -> None:
        """Compact when at least a third of the slot axis (and ``min_waste`` slots) is waste."""
        w = self.waste()
        if w >= min_waste and 3 * w >= self.num_slots:
            self.compact()

    def _left_pad(self, n: int) -> None:
        """Insert ``n`` invalid slots on the left of every row."""
        if n <= 0:
            return
        for layer in self._layers():
            b, h, _, d = layer.keys.shape
            pad = layer.keys.new_zeros(b, h, n, d)
            layer.keys = torch.cat([pad, layer.keys], dim=2)
            layer.values = torch.cat([pad, layer.values], dim=2)
        pad_valid = torch.zeros(self.batch_size, n, dtype=torch.bool, device=self.valid.device)
        self.valid = torch.cat([pad_valid, self.valid], dim=1)

    def extend(self, other: PaddedKVCache) -> None:
        """Append ``other``'s rows below ours (left-padding whichever has fewer slots)."""
        self._left_pad(other.num_slots - self.num_slots)
        other._left_pad(self.num_slots - other.num_slots)
        mine, theirs = self._layers(), other._layers()
        if not mine and theirs:
            self._materialise_like(theirs)
            mine = self._layers()
        elif mine and not theirs:
            other._materialise_like(mine)
            theirs = other._layers()
        for a, b in zip(mine, theirs, strict=True):
            a.keys = torch.cat([a.keys, b.keys], dim=0)
            a.values = torch.cat([a.values, b.values], dim=0)
        self.valid = torch.cat([self.valid, other.valid], dim=0)

    def _materialise_like(self, layers: list[GrowingLayer]) -> None:
        """Give an uninitialised cache zero tensors shaped like ``layers`` for our rows/slots."""
        for mine, ref in zip(self._all_layers(), layers, strict=True):
            _, h, _, d = ref.keys.shape
            empty = ref.keys.new_zeros(self.batch_size, h, self.num_slots, d)
            mine.lazy_initialization(empty, empty)
            mine.keys, mine.values = empty, empty.clone()
