"""Token sampling: logits -> sampling distribution, counter-based random numbers, log-probs.

Used by the native engine (prefill and plain decode, ``native/steps.py``), by its speculative
decoding (draft sampling and rejection), by the vLLM engine (:func:`token_logprobs`, the
contract's log-probs from the torch copy's logits) and by tests that compute the exact target
distribution. Keeping the one definition of
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


def _signed(u: int) -> int:
    """A 64-bit pattern as the int64 holding the same bits (torch has no full uint64 math)."""
    u %= 1 << 64
    return u - (1 << 64) if u >= 1 << 63 else u


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_POS_MUL = _signed(0xD1B54A32D192ED03)
_STREAM_MUL = 0x8CB92BA72F3D8DD7
_MIX_1 = _signed(0xBF58476D1CE4E5B9)
_MIX_2 = _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (``>>`` on int64 sign-extends)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finaliser on int64 bit patterns: a bijective 64-bit mixer. int64 products
    wrap modulo 2^64 exactly as the uint64 ones of the reference definition."""
    x = (x ^ _shr(x, 30)) * _MIX_1
    x = (x ^ _shr(x, 27)) * _MIX_2
    return x ^ _shr(x, 31)


def seed_bits(seed: int) -> int:
    """A request seed (any int) as the int64 holding its low 64 bits (the key of its stream)."""
    return _signed(seed)


def stream_keys(seeds: torch.Tensor) -> torch.Tensor:
    """The key of each request's random stream ``[B]`` from its seed bits (:func:`seed_bits`).

    Computed once per request (the engine does it at admission), so a step draws its uniforms
    with two mixing rounds instead of three."""
    return _mix64(seeds + _GOLDEN)


def counter_uniforms(keys: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """Uniforms in [0, 1), float64, one per (request, output position) for the given stream.

    ``keys`` ``[B]`` int64 (:func:`stream_keys`), ``positions`` ``[B, n]`` int64 output indices,
    both on the device the result is wanted on; the result is ``[B, n]``. Deterministic: the
    same (seed, position, stream) always gives the same number. Pure device arithmetic (no host
    round trip), so a captured step can draw its own random numbers.
    """
    if keys.device.type == "cpu":
        return _counter_uniforms_numpy(keys, positions, stream)
    return torch_uniforms(keys, positions, stream)


def torch_uniforms(keys: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """:func:`counter_uniforms` in torch int64 arithmetic, on any device (what CUDA runs)."""
    key = positions * _POS_MUL + _signed((stream + 1) * _STREAM_MUL)  # [B, n]
    h = _mix64(_mix64(keys[:, None] ^ key))  # [B, n]
    # Top 53 bits -> an exactly representable double in [0, 1).
    return _shr(h, 11).to(torch.float64) * (1.0 / 9007199254740992.0)


def _counter_uniforms_numpy(
    keys: torch.Tensor, positions: torch.Tensor, stream: int
) -> torch.Tensor:
    """The same bits on a CPU, in NumPy's uint64 (no graphs on a CPU; a NumPy op on a few
    numbers costs a fraction of a torch op, and a decode step of a small model is mostly such
    ops)."""
    k = keys.numpy().view(np.uint64)
    p = positions.numpy().astype(np.uint64)
    with np.errstate(over="ignore"):
        x = k[:, None] ^ (
            p * np.uint64(_POS_MUL % 2**64) + np.uint64((stream + 1) * _STREAM_MUL % 2**64)
        )
        for _ in range(2):
            x = (x ^ (x >> np.uint64(30))) * np.uint64(_MIX_1 % 2**64)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(_MIX_2 % 2**64)
            x = x ^ (x >> np.uint64(31))
    return torch.from_numpy((x >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0))


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
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    *,
    any_top_p: bool | None = None,
    any_greedy: bool | None = None,
) -> torch.Tensor:
    """The distribution each row samples from: softmax(logits / T), then top-p, renormalised.

    ``logits`` ``[B, n, V]``; ``temperature`` and ``top_p`` ``[B]`` (float). Rows with
    temperature 0 get a one-hot on the argmax (first index on ties, like ``torch.argmax``), so
    greedy decoding is the same code path as sampling, and rejection sampling between two one-hots
    reduces to "accept iff the draft equals the target's argmax".

    ``any_top_p`` / ``any_greedy``: whether some row has ``top_p < 1`` / temperature 0, when the
    caller knows it from the requests (the engine does). ``None`` reads it from the tensors, a
    host synchronisation each, which a captured step cannot do. Passing ``True`` is always correct
    (the filtered branch is applied per row), only slower.
    """
    dtype = _compute_dtype(logits)
    x = logits.to(dtype)
    greedy = temperature <= 0  # [B]
    safe_t = torch.where(greedy, torch.ones_like(temperature), temperature).to(dtype)
    probs = torch.softmax(x / safe_t[:, None, None], dim=-1)  # [B, n, V]
    if any_top_p if any_top_p is not None else bool((top_p < 1.0).any()):
        filtered = _top_p_filter(probs, top_p.to(dtype))
        probs = torch.where((top_p < 1.0)[:, None, None], filtered, probs)
    if any_greedy if any_greedy is not None else bool(greedy.any()):
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
