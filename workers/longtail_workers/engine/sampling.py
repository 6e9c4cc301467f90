"""Token sampling: logits -> sampling distribution, counter-based random numbers, log-probs.

Used by the torch engine (prefill and plain decode), by speculative decoding (draft sampling and
rejection) and by tests that compute the exact target distribution. Keeping the one definition of
"the distribution a request samples from" here is what lets SD be lossless: the target's ``p``
and the drafter's ``q`` go through :func:`sampling_probs` with the same temperature and top-p.

Random numbers are counter-based, not drawn from a stateful generator: the uniform used for a
draw is a hash of (request seed, output position, stream). A request's tokens therefore depend
only on its own seed, never on which other requests share the batch or in which order rows sit,
and the whole batch is sampled with vectorised ops (one searchsorted, no per-row generator loop).
Each (position, stream) pair is consumed at most once per accepted token, which is what the
lossless argument of rejection sampling needs (see ``rejection.py``).
"""

from __future__ import annotations

import numpy as np
import torch

STREAM_SAMPLE = 0
"""Plain sampling from the target (prefill, non-speculative decode)."""
STREAM_DRAFT = 1
"""Sampling a draft token from the drafter."""
STREAM_ACCEPT = 2
"""The uniform of the accept/reject test of a draft token."""
STREAM_CORRECT = 3
"""Sampling the correction (residual) or bonus token after verification."""

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_POS_MUL = np.uint64(0xD1B54A32D192ED03)
_STREAM_MUL = np.uint64(0x8CB92BA72F3D8DD7)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a bijective 64-bit mixer (uint64 arithmetic wraps by definition)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    mixed: np.ndarray = x ^ (x >> np.uint64(31))
    return mixed


def counter_uniforms(
    seeds: np.ndarray, positions: np.ndarray, stream: int, device: torch.device
) -> torch.Tensor:
    """Uniforms in [0, 1), float64, one per (row seed, output position) for the given stream.

    ``seeds`` is ``[B]`` (uint64-castable), ``positions`` ``[B, n]`` output indices; the result is
    ``[B, n]``. Deterministic: the same triple always gives the same number.
    """
    with np.errstate(over="ignore"):
        s = _mix64(seeds.astype(np.uint64) + _GOLDEN)  # [B]
        key = positions.astype(np.uint64) * _POS_MUL + np.uint64(stream + 1) * _STREAM_MUL
        h = _mix64(_mix64(s[:, None] ^ key))  # [B, n]
    # Top 53 bits -> an exactly representable double in [0, 1).
    u = (h >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
    return torch.from_numpy(u).to(device)


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    # Half-precision softmax/cumsum over a large vocabulary loses mass; compute in >= fp32.
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _top_p_filter(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero all but the smallest prefix (by descending prob) whose mass reaches top_p; renorm.

    ``probs`` ``[B, n, V]``, ``top_p`` ``[B]``. The most likely token is always kept.
    """
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # [B, n, V]
    mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
    keep_sorted = mass_before < top_p[:, None, None]
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)


def sampling_probs(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """The distribution each row samples from: softmax(logits / T), then top-p, renormalised.

    ``logits`` ``[B, n, V]``; ``temperature`` and ``top_p`` ``[B]`` (float). Rows with
    temperature 0 get a one-hot on the argmax (first index on ties, like ``torch.argmax``), so
    greedy decoding is the same code path as sampling, and rejection sampling between two one-hots
    reduces to "accept iff the draft equals the target's argmax".
    """
    dtype = _compute_dtype(logits)
    x = logits.to(dtype)
    greedy = temperature <= 0  # [B]
    safe_t = torch.where(greedy, torch.ones_like(temperature), temperature).to(dtype)
    probs = torch.softmax(x / safe_t[:, None, None], dim=-1)  # [B, n, V]
    if bool((top_p < 1.0).any()):
        filtered = _top_p_filter(probs, top_p.to(dtype))
        probs = torch.where((top_p < 1.0)[:, None, None], filtered, probs)
    if bool(greedy.any()):
        onehot = torch.zeros_like(probs).scatter(-1, x.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None, None], onehot, probs)
    return probs


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: ``probs`` ``[B, n, V]`` (rows sum to 1), ``uniforms`` ``[B, n]``.

    Returns token ids ``[B, n]``. A zero-probability token is never returned: on the (rounding)
    edge where the scaled uniform lands past the CDF, the row's most likely token is used.
    """
    cdf = torch.cumsum(probs.to(torch.float64), dim=-1)  # [B, n, V]
    target = uniforms.to(torch.float64) * cdf[..., -1]  # scale so rows need not sum to 1 exactly
    idx = torch.searchsorted(cdf, target[..., None], right=True).squeeze(-1)  # [B, n]
    idx = idx.clamp_(max=probs.shape[-1] - 1)
    picked = probs.gather(-1, idx[..., None]).squeeze(-1)
    return torch.where(picked > 0, idx, probs.argmax(dim=-1))


def token_logprobs(
    logits: torch.Tensor, temperature: torch.Tensor, tokens: torch.Tensor
) -> torch.Tensor:
    """``log_softmax(logits / T)[token]`` per position, T = 1 for greedy rows (see interface).

    ``logits`` ``[B, n, V]``, ``temperature`` ``[B]``, ``tokens`` ``[B, n]`` -> ``[B, n]`` float.
    """
    dtype = _compute_dtype(logits)
    t = torch.where(temperature <= 0, torch.ones_like(temperature), temperature).to(dtype)
    logp = torch.log_softmax(logits.to(dtype) / t[:, None, None], dim=-1)
    return logp.gather(-1, tokens[..., None]).squeeze(-1)
