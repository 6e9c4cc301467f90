"""Attention over the static slot cache, plugged into Hugging Face decoders by name.

Called by every attention layer of the target and of the drafter while the native engine runs
them (``engine/target.py``, ``engine/native/specdec.py``, ``profile/forwards.py``). A model goes
through :func:`use_slot_attention`, which sets its attention implementation to ``longtail_sdpa`` (or
``longtail_eager``): a function registered with ``transformers.AttentionInterface`` that runs the
engine's attention when the layer's mask is a :class:`~longtail_workers.kvcache.slots.
SlotAttention` and hands everything else to the stock ``sdpa`` (``eager``) function with the stock
mask builder. So the same model object keeps working for any other caller (a trainer's forward,
``model.generate``) and there is still one model definition, Hugging Face's.

Two backends, chosen per forward by ``SlotAttention.backend``:

* ``torch``: the reference. SDPA (or eager attention) over the row's first ``span`` slots with a
  boolean mask ``lo <= slot <= q_pos`` (lower-right causal for a multi-token verify). Runs
  anywhere; on CPU it is what every step uses; the Triton kernel is tested against it.
* ``triton``: ``triton_attention.slot_attention``, which reads only the slots a query may read
  (the cost of a row is its real length, not ``span``) and never synchronises with the host, so
  it can be captured in a CUDA graph. CUDA only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask
from transformers.models.llama.modeling_llama import eager_attention_forward

from longtail_workers.kvcache.slots import SlotAttention

PREFIX = "longtail_"
_BASE: dict[str, Any] = {"sdpa": sdpa_attention_forward, "eager": eager_attention_forward}


def base_implementation(name: str | None) -> str:
    """The stock implementation behind an attention implementation name (``longtail_sdpa`` ->
    ``sdpa``); other names are returned unchanged (``None`` means eager, as in transformers)."""
    name = name or "eager"
    return name[len(PREFIX) :] if name.startswith(PREFIX) else name


def _attention(base: str) -> Any:
    stock = _BASE[base]

    def forward(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        if not isinstance(attention_mask, SlotAttention):
            passed: tuple[torch.Tensor, None] = stock(
                module, query, key, value, attention_mask, **kwargs
            )
            return passed
        scaling = kwargs.get("scaling")
        scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        if attention_mask.backend == "triton":
            from longtail_workers.kvcache import triton_attention

            b, h, q, d = query.shape
            # Written through a transposed view: the result is [B, Q, Hq, D] and contiguous, as
            # the stock functions return it, without a copy.
            out = query.new_empty(b, q, h, d)
            triton_attention.slot_attention(
                query, key, value, 0, attention_mask.q_pos, attention_mask.lo, scale,
                out=out.transpose(1, 2),
            )  # fmt: skip
            return out, None
        span = attention_mask.span
        mask = attention_mask.mask()  # [B, 1, Q, span]
        if base == "eager":
            additive = torch.zeros(mask.shape, dtype=query.dtype, device=query.device)
            mask = additive.masked_fill_(~mask, torch.finfo(query.dtype).min)
        kw = {k: v for k, v in kwargs.items() if k not in ("scaling", "is_causal")}
        ref: tuple[torch.Tensor, None] = stock(
            module, query, key[:, :, :span], value[:, :, :span], mask, scaling=scale, **kw
        )
        return ref

    return forward


for _base, _mask_fn in (("sdpa", sdpa_mask), ("eager", eager_mask)):
    AttentionInterface.register(PREFIX + _base, _attention(_base))
    ALL_MASK_ATTENTION_FUNCTIONS.register(PREFIX + _base, _mask_fn)


def use_slot_attention(config: Any) -> None:
    """Route a model's attention (``config._attn_implementation``) through this module."""
    base = base_implementation(getattr(config, "_attn_implementation", None))
    if base not in _BASE:
        raise ValueError(
            f"attention implementation {base!r} cannot run over the engine's slot cache; load the "
            "model with attn_implementation='sdpa' or 'eager'"
        )
    config._attn_implementation = PREFIX + base


def choose_backend(requested: str | None, device: torch.device, dtype: torch.dtype) -> str:
    """The attention backend for a model on ``device`` in ``dtype``: ``requested``, or (None)
    ``triton`` on CUDA for half/single precision and ``torch`` otherwise."""
    from longtail_workers.kvcache import triton_attention

    if requested is None:  # a CPU only ever runs the kernel in Triton's interpreter (tests)
        fast = dtype in (torch.bfloat16, torch.float16, torch.float32)
        on_gpu = device.type == "cuda" and triton_attention.available(device)
        return "triton" if fast and on_gpu else "torch"
    if requested not in ("torch", "triton"):
        raise ValueError(f"attention backend {requested!r}; use 'triton', 'torch' or None")
    if requested == "triton" and not triton_attention.available(device):
        raise ValueError(
            f"EngineConfig.attention_backend='triton' needs Triton and a CUDA device; the model "
            f"is on {device}. Use attention_backend='torch' (or None: automatic)"
        )
    return requested
