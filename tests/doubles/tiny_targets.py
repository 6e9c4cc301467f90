"""Tiny random Qwen2 targets and seeded prompts for tests and CPU benchmarks (no downloads).

A test double (it lives under ``tests/``, not in the workers package): used by the engine,
drafter, speculative-decoding, trainer and operator tests, by ``sharded_rank.py`` and by
``bench/drafter.py --model random``, which import it by name with this directory on ``sys.path``
(``tests/conftest.py`` puts it there; the scripts add it themselves). Randomly initialised
transformer LMs with the default initializer range produce near-uniform next-token
distributions, which make speculative decoding meaningless (nothing to predict) and greedy
decoding fragile (near-ties). ``sharpness`` scales the LM head so that distributions are peaked
like a trained model's, and the model is built under a private RNG so the global torch seed is
untouched.
"""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2(
    *,
    seed: int = 0,
    vocab_size: int = 48,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    sharpness: float = 1.0,
    dtype: torch.dtype = torch.float32,
    max_position_embeddings: int = 512,
    attn_implementation: str = "sdpa",
) -> Qwen2ForCausalLM:
    """A seeded random ``Qwen2ForCausalLM`` in eval mode; ``sharpness`` multiplies the logits."""
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
    )
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    return model.to(dtype).eval()


def random_prompts(seed: int, n: int, vocab_size: int) -> list[list[int]]:
    """``n`` seeded random prompts of 2-10 tokens (lengths cycle, so batches are ragged)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (2 + i % 9,), generator=gen).tolist() for i in range(n)]
