"""The EAGLE-style drafter module, shared by the rollout engine (drafting) and the trainers.

Architecture (TLT / EAGLE-1)::

    e_t   = target_embedding(x_{t+1})                     # frozen, shared with the target
    z_t   = fc(concat(e_t, h_t))                          # Linear 2H -> H (with bias)
    f_t   = decoder_layer(z_t, rope(position t), causal attention over the draft sequence)
    logits(f_t) = target_lm_head(f_t)                     # frozen, shared with the target

``h_t`` is the target's last-layer hidden state at position t AFTER the target's final norm (the
input of its LM head), and ``f_t`` is trained to equal ``h_{t+1}``; see ``pairs.py`` for the
pairing convention. Choice: there is NO final norm in the drafter. Its regression target is
already a normed feature that the LM head consumes as is, so the drafter's output goes straight
to the LM head (EAGLE-1 does the same); a norm would also break SmoothL1 on the raw feature.

The decoder layer is the target's own layer class (``Qwen2DecoderLayer`` for Qwen2, likewise for
Llama-style models) built from a one-layer copy of the target config, with its own rotary
embedding; it is used unmodified (EAGLE-1 drops the layer's input norm; we keep it, since the
fc output is not normalised and the layer class should stay the stock one). ``input_norm=False``
and ``fc_bias=False`` give EAGLE-1's serving layout instead (what vLLM's and SGLang's EAGLE
drafters compute; needed for an exact export, see ``drafter/export.py``).

The embedding and LM head are held as plain references, not registered submodules,
so they are never in ``state_dict()``, never in ``parameters()`` (an optimizer cannot see them)
and never receive gradients (the weights are detached on use).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, TypedDict

import torch
import torch.nn.functional as F
from torch import nn

from longtail_workers.kvcache.masks import attention_mask as build_mask
from longtail_workers.kvcache.masks import check_attention_implementation


@dataclass(frozen=True)
class TargetInfo:
    """Identity of the target a drafter belongs to; written to and checked on load."""

    architecture: str
    identifier: str
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int

    @classmethod
    def of(cls, target: nn.Module, identifier: str) -> TargetInfo:
        cfg: Any = target.config  # a transformers PretrainedConfig
        return cls(
            architecture=_architecture(target),
            identifier=identifier,
            hidden_size=int(cfg.hidden_size),
            vocab_size=int(target.get_output_embeddings().out_features),  # type: ignore[operator]
            num_attention_heads=int(cfg.num_attention_heads),
            num_key_value_heads=int(getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)),
            intermediate_size=int(cfg.intermediate_size),
        )


def _architecture(target: nn.Module) -> str:
    """The target's class name. A sharded trainer's policy (``fully_shard``) is an instance of
    FSDP2's generated subclass ``FSDP<Name>``: the model is the same, so its drafters are too."""
    from torch.distributed.fsdp import FSDPModule

    cls: type[object] = type(target)
    if isinstance(target, FSDPModule):
        cls = next(c for c in cls.__mro__ if not issubclass(c, FSDPModule))
    return cls.__name__


@dataclass(frozen=True)
class _SharedParts:
    """The target's frozen modules; a plain dataclass so nn.Module does not register them."""

    embedding: nn.Embedding
    lm_head: nn.Linear

    def __deepcopy__(self, memo: dict[int, object]) -> _SharedParts:
        # A deep-copied drafter must still point at the live target, never at a private copy.
        return self


class LayoutOptions(TypedDict):
    """The :class:`EagleDrafter` keyword arguments a named layout fixes."""

    input_norm: bool
    """Keep the decoder layer's input norm (False: EAGLE-1's serving layout)."""
    fc_bias: bool
    """Give the ``fc`` projection a bias (False: EAGLE-1's serving layout)."""


LAYOUTS: dict[str, LayoutOptions] = {
    "longtail": {"input_norm": True, "fc_bias": True},
    "eagle1": {"input_norm": False, "fc_bias": False},
}
"""``drafterTraining.layout`` values -> :class:`EagleDrafter` keyword arguments."""


def layout_options(layout: str) -> LayoutOptions:
    """The :class:`EagleDrafter` arguments of a named layout (see ``DrafterTrainingSpec``)."""
    if layout not in LAYOUTS:
        raise ValueError(
            f"unknown drafter layout {layout!r}; use one of {sorted(LAYOUTS)} "
            "(spec field drafterTraining.layout)"
        )
    return LAYOUTS[layout].copy()


def _layer_config(target: nn.Module, attn_implementation: str) -> Any:
    cfg: Any = copy.deepcopy(target.config)
    cfg.num_hidden_layers = 1
    if hasattr(cfg, "layer_types"):
        cfg.layer_types = ["full_attention"]
    if hasattr(cfg, "use_sliding_window"):
        cfg.use_sliding_window = False
    cfg._attn_implementation = attn_implementation
    check_attention_implementation(cfg)
    return cfg


class EagleDrafter(nn.Module):
    """One-layer EAGLE drafter over a frozen target's embedding and LM head (see module text)."""

    def __init__(
        self,
        target: nn.Module,
        *,
        target_id: str,
        seed: int = 0,
        attn_implementation: str = "sdpa",
        input_norm: bool = True,
        fc_bias: bool = True,
    ) -> None:
        super().__init__()
        embedding = target.get_input_embeddings()  # type: ignore[operator]
        lm_head = target.get_output_embeddings()  # type: ignore[operator]
        if not isinstance(embedding, nn.Embedding) or not isinstance(lm_head, nn.Linear):
            raise ValueError(
                f"EagleDrafter needs an nn.Embedding input embedding and an nn.Linear LM head; "
                f"{type(target).__name__} has {type(embedding).__name__} and "
                f"{type(lm_head).__name__}"
            )
        decoder = target.get_decoder()  # type: ignore[operator]
        if not hasattr(decoder, "layers") or not hasattr(decoder, "rotary_emb"):
            raise ValueError(
                f"EagleDrafter reuses the target's decoder layer and rotary embedding; "
                f"{type(decoder).__name__} has no .layers/.rotary_emb"
            )
        self.info = TargetInfo.of(target, target_id)
        self.config: Any = _layer_config(target, attn_implementation)
        hidden = self.info.hidden_size
        self._shared = _SharedParts(embedding, lm_head)
        self.fc = nn.Linear(2 * hidden, hidden, bias=fc_bias)
        self.layer = type(decoder.layers[0])(self.config, layer_idx=0)
        if not input_norm:  # EAGLE-1 / vLLM / SGLang layout: no input norm in layer 0
            self.layer.input_layernorm = nn.Identity()
        self.input_norm, self.fc_bias = input_norm, fc_bias
        self.rotary_emb = type(decoder.rotary_emb)(config=self.config)
        self._init_weights(seed)
        device, dtype = lm_head.weight.device, lm_head.weight.dtype
        self.fc.to(device=device, dtype=dtype)
        self.layer.to(device=device, dtype=dtype)
        self.rotary_emb.to(device=device)  # inv_freq stays fp32, as in the target
        self.eval()  # an inference object by default; trainers call .train() themselves

    def _init_weights(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        std = float(getattr(self.config, "initializer_range", 0.02))
        for module in self.modules():
            if isinstance(module, nn.Linear):
                with torch.no_grad():
                    module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * std)
                    if module.bias is not None:
                        module.bias.zero_()

    @property
    def embedding(self) -> nn.Embedding:
        return self._shared.embedding

    @property
    def lm_head(self) -> nn.Linear:
        return self._shared.lm_head

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Frozen target embedding ``[B, T] -> [B, T, H]`` (no gradient reaches the target)."""
        return F.embedding(input_ids, self.embedding.weight.detach())

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Frozen target LM head on drafter features ``[..., H] -> [..., V]``.

        Gradients flow into ``features`` only; the head's weights are detached.
        """
        bias = None if self.lm_head.bias is None else self.lm_head.bias.detach()
        return F.linear(features, self.lm_head.weight.detach(), bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: object | None = None,
    ) -> torch.Tensor:
        """Predict next features ``[B, T, H]`` from pair inputs (see ``pairs.py``).

        ``input_ids`` ``[B, T]`` carry token ``x_{t+1}``, ``hidden`` ``[B, T, H]`` the state
        ``h_t``, ``position_ids`` ``[B, T]`` the position ``t``. ``attention_mask`` is a 4D mask
        as built by :meth:`mask` (plain causal over the T inputs when omitted); ``cache`` a HF
        ``Cache`` the layer appends its keys/values to (the engine's multi-step drafting).
        """
        x = self.fc(torch.cat([self.embed(input_ids), hidden.to(self.fc.weight.dtype)], dim=-1))
        if attention_mask is None:
            valid = torch.ones(input_ids.shape, dtype=torch.bool, device=input_ids.device)
            empty = valid[:, :0]
            attention_mask = self.mask(empty, valid)
        position_embeddings = self.rotary_emb(x, position_ids)
        out = self.layer(
            x,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=cache is not None,
            position_embeddings=position_embeddings,
        )
        features: torch.Tensor = out[0] if isinstance(out, tuple) else out  # older: a tuple
        return features

    def mask(self, past_valid: torch.Tensor, new_valid: torch.Tensor) -> torch.Tensor:
        """Attention mask in the form this drafter's attention implementation takes."""
        impl = self.config._attn_implementation
        return build_mask(past_valid, new_valid, self.fc.weight.dtype, impl)

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Exactly the weights this drafter owns (what checkpoints store)."""
        return dict(self.state_dict())
