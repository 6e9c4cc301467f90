"""The models a profile is taken on: a saved or built-in policy, or a random Qwen2 of a named shape.

Called by :mod:`longtail_workers.profile.main`. Latencies depend on a model's shape, not its
weights, so ``--shape`` builds a randomly initialised ``Qwen2ForCausalLM`` with the public
Qwen2 configuration numbers (no download); ``--model`` loads a policy the way every worker does
(:func:`~longtail_workers.models.loading.load_policy`). The drafter is the project's
:class:`~longtail_workers.drafter.model.EagleDrafter` built for that target.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from longtail_api.profile import ModelShape
from longtail_workers.drafter.model import EagleDrafter, layout_options
from longtail_workers.models.loading import load_policy, resolve_dtype

SHAPES: dict[str, dict[str, Any]] = {
    # A few-kilobyte model for tests and smoke runs.
    "micro": {
        "vocab_size": 64,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    },
    # Qwen2(.5)-0.5B's configuration.
    "qwen2-0.5b": {
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
    },
    # Qwen2(.5)-1.5B's configuration.
    "qwen2-1.5b": {
        "vocab_size": 151936,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
    },
    # Qwen2(.5)-7B's configuration (what examples/02 and TLT's setting run).
    "qwen2-7b": {
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    },
}
"""``--shape`` names -> ``Qwen2Config`` arguments."""


def random_qwen2(shape: str, device: torch.device, dtype: torch.dtype, seed: int) -> nn.Module:
    """A randomly initialised ``Qwen2ForCausalLM`` of a :data:`SHAPES` shape, in eval mode."""
    if shape not in SHAPES:
        raise ValueError(f"--shape {shape!r}: unknown; use one of {', '.join(SHAPES)}")
    config = Qwen2Config(**SHAPES[shape])
    config._attn_implementation = "sdpa"  # the engine's masks need sdpa or eager
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)  # built on the device: a 1.5B model inits in seconds
    # transformers wraps Module.to with functools.wraps, which mypy cannot bind to the instance.
    model.to(dtype)  # type: ignore[arg-type]
    model.eval()
    return model


def load_target(
    model: str | None, shape: str | None, device: torch.device, dtype: str, seed: int
) -> tuple[nn.Module, str]:
    """``(target in eval mode, its name)`` from exactly one of ``--model`` and ``--shape``."""
    if (model is None) == (shape is None):
        raise ValueError(
            "give exactly one of --model (builtin:tiny or a Hugging Face directory) and "
            f"--shape ({', '.join(SHAPES)}, random weights)"
        )
    if model is not None:
        policy, _ = load_policy(model, dtype=dtype, device=str(device))
        return policy, model
    assert shape is not None
    return random_qwen2(shape, device, resolve_dtype(dtype, device), seed), f"shape:{shape}"


def make_drafter(target: nn.Module, name: str, seed: int, layout: str = "longtail") -> EagleDrafter:
    """The EAGLE drafter the engine would use for ``target`` (random weights, eval mode);
    ``layout``: a ``drafterTraining.layout`` (vLLM serves only ``eagle1`` exactly)."""
    return EagleDrafter(target, target_id=name, seed=seed, **layout_options(layout))


def model_shape(target: nn.Module) -> ModelShape:
    """The profile's record of the target's shape."""
    cfg: Any = target.config  # a transformers PretrainedConfig
    dtype = next(target.parameters()).dtype
    return ModelShape(
        hidden_size=int(cfg.hidden_size),
        num_layers=int(cfg.num_hidden_layers),
        num_heads=int(cfg.num_attention_heads),
        num_kv_heads=int(getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)),
        intermediate_size=int(cfg.intermediate_size),
        vocab_size=int(target.get_output_embeddings().out_features),  # type: ignore[operator]
        params=sum(p.numel() for p in target.parameters()),
        dtype=str(dtype).removeprefix("torch."),
    )
