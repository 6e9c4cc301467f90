"""GRPO's maths: group-relative advantages, the clipped token-level loss, per-token log-probs.

Pure torch functions, no I/O. The trainer's step driver calls :func:`group_advantages` on the
verifier's rewards, :func:`sequence_logprobs` to score the rollouts under the current (and the
reference) policy, and :func:`~longtail_workers.trainer.optim.train_step`, which calls
:func:`sequence_logprobs_and_entropy` (the same scores plus the policy's token entropy, a
diagnostic) and :func:`grpo_loss`.

Conventions. A batch holds ``B`` sequences of ``T`` token positions (prompt + response, padded
on either side). Per-token tensors are ``[B, T]`` and aligned with ``input_ids``: position
``t`` holds the log-prob of token ``t`` given tokens ``< t``. ``mask`` / ``response_mask``
marks the response tokens, the only ones that carry loss. Rewards and advantages are laid out
group by group: the ``group_size`` answers to prompt 0 first, then those to prompt 1, ...
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

# exp() of a log-ratio above this overflows float32 gradients long before it means anything;
# veRL clamps at the same place.
MAX_LOG_RATIO = 20.0
ENTROPY_CHUNK_ELEMENTS = 1 << 24
"""Most logits one step of :func:`token_entropy` turns into probabilities at once: its extra
memory is a few float32 ``[rows, V]`` temporaries with ``rows * V`` at most this (one row if
``V`` alone is larger), whatever the batch, so it never doubles the ``[B, T, V]`` logits."""


def group_advantages(
    rewards: Tensor, group_size: int, eps: float = 1e-6, normalize_std: bool = True
) -> Tensor:
    """Advantages ``[N]`` of rewards ``[N]``: ``(r - group mean) / (group std + eps)``.

    ``std`` is the *unbiased* (Bessel-corrected, ``N - 1``) standard deviation, as
    ``torch.std`` computes it and as veRL and TRL use, so advantages match those frameworks'
    for the same rewards (group of 4 with rewards ``[1, 0, 0, 1]``: ``±0.866``, where the
    population std would give ``±1``). A group whose rewards are all equal (every answer right,
    or every answer wrong) carries no preference: its advantages are exactly 0, never the
    rounding noise of ``(r - mean) / eps``. With ``normalize_std=False`` the advantage is
    ``r - mean`` (Dr. GRPO's unscaled form).
    """
    if not isinstance(rewards, Tensor) or rewards.dim() != 1:
        shape = tuple(rewards.shape) if isinstance(rewards, Tensor) else type(rewards).__name__
        raise ValueError(f"rewards must be a 1-D tensor [num_prompts * group_size], got {shape}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise ValueError(
            f"group_size must be an int >= 2 (GRPO compares answers within a group), "
            f"got {group_size!r}"
        )
    n = rewards.numel()
    if n == 0 or n % group_size:
        raise ValueError(
            f"rewards has {n} entries, not a positive multiple of group_size={group_size}; "
            "pass one reward per answer, group_size answers per prompt"
        )
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    r = rewards.detach().to(torch.float64 if rewards.dtype == torch.float64 else torch.float32)
    if not torch.isfinite(r).all():
        bad = torch.nonzero(~torch.isfinite(r)).flatten()[:5].tolist()
        raise ValueError(f"rewards must be finite; non-finite at indices {bad}")
    groups = r.view(-1, group_size)  # [P, G]
    centred = groups - groups.mean(dim=1, keepdim=True)  # [P, G]
    flat = groups.amax(dim=1, keepdim=True) == groups.amin(dim=1, keepdim=True)  # [P, 1]
    if normalize_std:
        centred = centred / (groups.std(dim=1, keepdim=True) + eps)
    return torch.where(flat, torch.zeros_like(centred), centred).reshape(n)  # [N]


@dataclass(frozen=True)
class LossStats:
    """Diagnostics of one :func:`grpo_loss` call, each a mean over its valid tokens."""

    pg_loss: float
    """Clipped surrogate term alone."""
    kl_ref: float
    """k3 estimate of KL(policy || reference); 0 when no reference is given."""
    clip_fraction: float
    """Share of tokens where clipping was active (the token's gradient is zero)."""
    approx_kl: float
    """k3 estimate of KL(old || policy): how far this update moved from the rollout policy."""
    ratio_mean: float
    tokens: int
    """Valid (response) tokens in this call."""
    entropy: float = 0.0
    """Mean entropy of the policy's tempered next-token distribution at the response tokens
    (nats); 0 when no entropy is given. A diagnostic: it carries no gradient."""

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_ratio: float,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    *,
    num_tokens: int | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, LossStats]:
    """Token-level PPO-clipped GRPO loss, with an optional k3 KL penalty to a reference.

    Per token: ``-min(ratio * A, clip(ratio, 1 - clip_ratio, 1 + clip_ratio) * A)
    + kl_coef * (exp(ref - logp) - (ref - logp) - 1)`` with ``ratio = exp(logp - old)`` and
    ``A`` the sequence's advantage. The loss is the sum over valid tokens divided by
    ``num_tokens`` (default: the valid tokens here): DAPO/veRL "token-mean", so every token
    weighs the same and long answers are not down-weighted. Gradient accumulation passes the
    whole batch's token count as ``num_tokens`` so the micro-batch losses add up exactly.

    Shapes: ``logprobs``, ``old_logprobs``, ``ref_logprobs``, ``mask``, ``entropy`` (the
    per-token entropy of :func:`sequence_logprobs_and_entropy`, only averaged into the stats)
    ``[B, T]``; ``advantages`` ``[B]``. Values at masked positions are ignored, even NaN or inf.
    """
    _check_loss_inputs(logprobs, old_logprobs, advantages, mask, ref_logprobs, entropy)
    if not 0.0 < clip_ratio < 1.0:
        raise ValueError(f"clip_ratio must be in (0, 1), got {clip_ratio}")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    valid = mask.bool()  # [B, T]
    tokens = int(valid.sum())
    if tokens == 0:
        raise ValueError("mask selects no response tokens; nothing to train on")
    denom = tokens if num_tokens is None else num_tokens
    if denom < tokens:
        raise ValueError(f"num_tokens={num_tokens} is less than the {tokens} valid tokens here")

    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    # where() before exp(): masked positions may hold garbage, and NaN * 0 would still be NaN.
    log_ratio = torch.where(valid, logprobs - old_logprobs.detach(), zero)  # [B, T]
    log_ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)  # [B, T]
    adv = advantages.detach().to(logprobs.dtype).unsqueeze(1)  # [B, 1]
    unclipped = -adv * ratio  # [B, T]
    clipped = -adv * ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio)  # [B, T]
    pg = torch.maximum(unclipped, clipped)  # [B, T]; max of losses = min of objectives

    per_token = pg
    kl_ref = torch.zeros_like(pg)
    if ref_logprobs is not None:
        kl_ref = k3_kl(ref_logprobs.detach(), logprobs, valid)  # [B, T]
        per_token = pg + kl_coef * kl_ref
    loss = torch.where(valid, per_token, zero).sum() / denom

    with torch.no_grad():
        stats = LossStats(
            pg_loss=_masked_mean(pg, valid),
            kl_ref=_masked_mean(kl_ref, valid),
            clip_fraction=_masked_mean((clipped > unclipped).to(pg.dtype), valid),
            approx_kl=_masked_mean(ratio - 1.0 - log_ratio, valid),
            ratio_mean=_masked_mean(ratio, valid),
            tokens=tokens,
            entropy=0.0 if entropy is None else _masked_mean(entropy.detach(), valid),
        )
    return loss, stats


def k3_kl(ref_logprobs: Tensor, logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(policy || ref): ``exp(d) - d - 1`` with ``d = ref - logp``.

    Non-negative, unbiased for tokens sampled from the policy, and lower-variance than
    ``-d`` (Schulman's k3; the GRPO paper's form). Masked positions give 0. ``[B, T]``.
    """
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    d = torch.where(mask.bool(), ref_logprobs - logprobs, zero)  # [B, T]
    d = d.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.exp(d) - d - 1.0


def sequence_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_mask: Tensor,
    temperature: float = 1.0,
) -> Tensor:
    """Per-token log-probs ``[B, T]`` of ``input_ids`` under a HF causal LM, at ``temperature``.

    What :func:`sequence_logprobs_and_entropy` computes, without the entropy.
    """
    return _score(model, input_ids, attention_mask, response_mask, temperature, False)[0]


def sequence_logprobs_and_entropy(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_mask: Tensor,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Per-token log-probs and entropies ``[B, T]`` of ``input_ids`` under a HF causal LM.

    The log-probs are :func:`sequence_logprobs`'s. ``entropy[b, t]`` is the entropy of the
    tempered distribution the token at ``t`` was drawn from (:func:`token_entropy`, from the
    same logits, under ``no_grad``; 0 off the response), as veRL logs it: the loss and its
    gradients do not change.
    """
    logprobs, entropy = _score(model, input_ids, attention_mask, response_mask, temperature, True)
    assert entropy is not None
    return logprobs, entropy


def token_entropy(
    logits: Tensor, valid: Tensor, chunk_elements: int = ENTROPY_CHUNK_ELEMENTS
) -> Tensor:
    """Entropy ``H(softmax(logits[b, t]))`` in nats where ``valid[b, t]``, else 0: ``[B, T]``.

        ``logits`` ``[B, T, V]`` (already divided by the temperature), ``valid`` ``[B, T]``. Only
        the valid positions are computed, ``chunk_elements // V`` rows at a time (at least one), so
        the extra memory is bounded by ``chunk_elements`` (:data:`ENTROPY_CHUNK_ELEMENTS`), not by
        the batch. ``H = -sum(p log p)`` with ``p = softmax(z)``, in float32 at least, so a logit of
    ``-inf`` (a token the model rules out) adds nothing rather than NaN. No gradient.
    """
    if logits.dim() != 3 or valid.shape != logits.shape[:2]:
        raise ValueError(
            f"logits must be [B, T, V] and valid [B, T]; got {tuple(logits.shape)} "
            f"and {tuple(valid.shape)}"
        )
    if chunk_elements < 1:
        raise ValueError(f"chunk_elements must be >= 1, got {chunk_elements}")
    dtype = torch.promote_types(logits.dtype, torch.float32)
    out = torch.zeros(valid.shape, dtype=dtype, device=logits.device)  # [B, T]
    rows, cols = torch.nonzero(valid, as_tuple=True)  # [N] each
    step = max(1, chunk_elements // logits.shape[-1])
    with torch.no_grad():
        for start in range(0, rows.numel(), step):
            r, c = rows[start : start + step], cols[start : start + step]
            z = logits[r, c].detach().to(dtype)  # [n, V]: a copy of n rows only
            p = torch.softmax(z, dim=-1)  # [n, V]
            out[r, c] = -torch.special.xlogy(p, p).sum(dim=-1)  # a 0 probability adds 0
    return out


def _score(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_mask: Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropies) of :func:`sequence_logprobs_and_entropy`; see there.

    ``out[b, t] = log_softmax(logits[b, t - 1] / temperature)[input_ids[b, t]]`` where
    ``response_mask[b, t]``, else 0. The rollout sampled from ``softmax(logits / T)``, so the
    ratio and the KL must use the same tempered distribution. Position ids come from the
    attention mask (``cumsum - 1``), so a left-padded row scores exactly like the unpadded
    sequence. Computed in float32 as ``logit[token] - logsumexp(logits)``, which never
    materialises a second ``[B, T, V]`` tensor. Gradients flow when called outside
    ``torch.no_grad``.
    """
    if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"input_ids and attention_mask must both be [B, T]; got {tuple(input_ids.shape)} "
            f"and {tuple(attention_mask.shape)}"
        )
    if response_mask.shape != input_ids.shape:
        raise ValueError(
            f"response_mask must be [B, T] = {tuple(input_ids.shape)}, "
            f"got {tuple(response_mask.shape)}"
        )
    if not temperature > 0:
        raise ValueError(
            f"temperature must be > 0, got {temperature}; a greedy (temperature 0) rollout has "
            "no sampling distribution: score it at 1.0"
        )
    valid = response_mask.bool()
    if valid[:, 0].any():
        raise ValueError("response_mask[:, 0] is set, but the first position has no context")
    if (valid & ~attention_mask.bool()).any():
        raise ValueError("response_mask marks padding positions (attention_mask == 0)")
    positions = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)  # [B, T]
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=positions
    ).logits  # [B, T, V]
    logits = logits[:, :-1].float() / temperature  # [B, T-1, V]: predicts tokens 1..T-1
    targets = input_ids[:, 1:].unsqueeze(-1)  # [B, T-1, 1]
    picked = logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # [B, T-1]
    out = torch.cat([picked.new_zeros(picked.shape[0], 1), picked], dim=1)  # [B, T]
    entropy = None
    if with_entropy:  # position t's token was drawn from logits[:, t - 1]
        entropy = torch.cat(
            [picked.new_zeros(picked.shape[0], 1), token_entropy(logits, valid[:, 1:])], dim=1
        )  # [B, T]
    return torch.where(valid, out, out.new_zeros(())), entropy


def _masked_mean(x: Tensor, valid: Tensor) -> float:
    return float(torch.where(valid, x, x.new_zeros(())).sum() / valid.sum())


def _check_loss_inputs(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logprobs: Tensor | None,
    entropy: Tensor | None,
) -> None:
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got {tuple(logprobs.shape)}")
    named = {"old_logprobs": old_logprobs, "mask": mask}
    if ref_logprobs is not None:
        named["ref_logprobs"] = ref_logprobs
    if entropy is not None:
        named["entropy"] = entropy
    for name, tensor in named.items():
        if tensor.shape != logprobs.shape:
            raise ValueError(
                f"{name} must have the shape of logprobs {tuple(logprobs.shape)}, "
                f"got {tuple(tensor.shape)}"
            )
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(
            f"advantages must be [B] = [{logprobs.shape[0]}] (one per sequence), "
            f"got {tuple(advantages.shape)}"
        )
