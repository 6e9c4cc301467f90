"""Explicit 4D attention masks over slots with per-slot validity, for the drafter's own forwards.

Used by the EAGLE drafter (``drafter/model.py``: training batches of padded pair sequences, and
any forward given a validity mask) and its trainers. The native engine does not use these masks:
its steps describe what a query reads with ``slots.SlotAttention`` instead. ``attention_mask``
builds ``[B, 1, Q, L + Q]`` for Q new slots after L cached ones, causal by slot order; padding
slots are never attended and a padding query attends only to itself (no NaN).
"""

from __future__ import annotations

import torch

from longtail_workers.kvcache.slot_attention import base_implementation

MASKED_ATTENTION = ("sdpa", "eager")
"""Attention implementations that accept the engine's explicit 4D masks."""


def check_attention_implementation(config: object) -> str:
    """The model's attention implementation, refused unless it takes explicit 4D masks.

    A model routed through the engine's slot attention (``longtail_sdpa``) counts as its stock
    implementation: that is what it runs for every caller but the engine."""
    impl = base_implementation(getattr(config, "_attn_implementation", None))
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
    if base_implementation(implementation) == "sdpa":
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
