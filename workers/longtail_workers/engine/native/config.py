"""The native torch engine's configuration: capacity, buffer sizing, graphs and attention backend.

Read by :class:`~longtail_workers.engine.native.torch_engine.TorchEngine` (which re-exports it) and
built by the rollout worker and the benches. Validated when the engine is made.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LENGTH_ROUNDING", "EngineConfig"]

LENGTH_ROUNDING = 256
"""Slots per row are rounded up to a multiple of this when sized from the requests."""


@dataclass
class EngineConfig:
    """Capacity knobs of the torch engine."""

    max_running: int = 256
    """Most sequences decoded together; more prompts wait and are admitted as others finish.
    The rollout worker runs with this default, as with vLLM's (``VllmEngineConfig``)."""
    max_prefill_tokens: int = 16384
    """Padded prompt tokens prefilled in one admission group."""
    prefill_split_cost: int = 64
    """What one more prefill forward is worth, in padded prompt tokens. An admitted group is
    split by prompt length where that saves more padding than this (``length_groups``); for a
    batch of the built-in task's prompts that removes most of the padding and most of the
    prefill time (docs/performance.md, "Prefill by length groups"). 0 prefills every distinct
    length apart; a very large value never splits. Tuned on CPU only: on a GPU, where padding is
    nearly free until a forward is compute-bound, a larger value (thousands) is likely better."""
    drafter_context_window: int | None = None
    """Sliding window of the drafter's own context, in tokens of the answer, as the spec's
    ``speculative.drafterContextWindow`` (None: the whole answer). The drafter reads one pair
    per answer token (``drafter/pairs.py``), so a drafter query reads at most this many of the
    newest pairs, and when SD switches on only the newest W pairs of each row are fed to the
    drafter: re-prefill and each draft step cost O(W) instead of O(context). The first draft
    token reads the target's own hidden state, so a short window costs little acceptance
    (docs/performance.md)."""
    max_model_len: int | None = None
    """Slots per row of the static buffers: the longest prompt + output (+ a speculative step's
    overhang) a request may have. None sizes them to each call's longest request (rounded up to
    a multiple of 256), reallocating when a later call needs more; set it on a GPU so the buffers
    and the captured graphs are made once. A request that does not fit is refused."""
    kv_cache_gb: float | None = None
    """Budget, in GiB, of the static buffers (target and drafter KV caches, hidden-state and
    token stores). Rows are capped to what fits (fewer sequences decode together); a budget
    that cannot hold one row is refused. None: ``max_running`` rows, whatever they take."""
    cuda_graphs: bool = True
    """Capture decode and speculative steps as CUDA graphs (CUDA only; a CPU runs them eagerly)."""
    batch_buckets: tuple[int, ...] | None = None
    """Batch sizes steps are padded to (each is a captured graph on CUDA). None: the default
    ladder on CUDA with graphs, the exact running count otherwise."""
    attention_backend: str | None = None
    """``triton`` (reads only each row's real length; CUDA) or ``torch`` (masked SDPA, the
    reference). None: ``triton`` on CUDA for half/single precision, else ``torch``."""
    policy_seed: int = 0
    """Seed of the SD strategy bandit."""

    def validate(self) -> None:
        if self.prefill_split_cost < 0:
            raise ValueError(
                f"EngineConfig.prefill_split_cost={self.prefill_split_cost}; must be >= 0 "
                "(padded prompt tokens one more prefill forward is worth)"
            )
        window = self.drafter_context_window
        if window is not None and window < 1:
            raise ValueError(
                f"EngineConfig.drafter_context_window={window}; must be >= 1 token, or None "
                "for the whole answer (spec field speculative.drafterContextWindow)"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"EngineConfig.max_model_len={self.max_model_len}; must be >= 2")
        if self.kv_cache_gb is not None and self.kv_cache_gb <= 0:
            raise ValueError(f"EngineConfig.kv_cache_gb={self.kv_cache_gb}; must be > 0 or None")
        if self.attention_backend not in (None, "torch", "triton"):
            raise ValueError(
                f"EngineConfig.attention_backend={self.attention_backend!r}; use 'triton', "
                "'torch' or None (automatic)"
            )
        if self.batch_buckets is not None and (
            not self.batch_buckets or min(self.batch_buckets) < 1
        ):
            raise ValueError(
                f"EngineConfig.batch_buckets={self.batch_buckets}; need positive batch sizes"
            )
