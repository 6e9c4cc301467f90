"""Verification of one speculative step's drafts by the target, whatever proposed them.

Called inside the speculative step functions (``specdec.py`` for ``learned`` and ``hybrid``
strategies, ``history_drafts.py`` for ``history``), so it is captured with them on CUDA. The
target scores ``[x_last, d_1 .. d_k]`` in one forward (each query reads up to its own slot), the
acceptance rule (``engine/rejection.py``, pluggable) keeps ``a`` drafts plus one correction/bonus
token per row, and :func:`~longtail_workers.engine.native.steps.commit` commits them (cut at stop
tokens and ``max_new_tokens``). The target slots of rejected drafts lie past the row's new length:
the next step overwrites them, nothing is rolled back.

Deterministic drafts (the history drafter's) go through the same rule with ``q`` one-hot on the
draft: a draft ``x`` is accepted with probability ``p(x)`` under the target's processed
distribution, a rejection samples from ``p`` without ``x``, renormalised, and a greedy row
accepts iff ``x`` is its argmax; each emitted token is then distributed exactly as ``p``,
whatever chose ``x`` (as long as that choice does not read the step's random numbers).
"""

from __future__ import annotations

import torch

from longtail_workers.engine.native.rows import RowState
from longtail_workers.engine.native.steps import StepOutput, StepShape, commit, store_hidden
from longtail_workers.engine.rejection import AcceptanceRule
from longtail_workers.engine.sampling import (
    STREAM_ACCEPT,
    STREAM_CORRECT,
    counter_uniforms,
    sampling_probs,
    token_logprobs,
)
from longtail_workers.engine.target import TargetModel
from longtail_workers.kvcache.slots import SlotAttention


@torch.no_grad()
def verify(
    target: TargetModel,
    rows: RowState,
    drafts: torch.Tensor,
    q: torch.Tensor | None,
    shape: StepShape,
    rule: AcceptanceRule,
    deterministic: torch.Tensor | None = None,
) -> StepOutput:
    """Verify ``drafts`` ``[B, k]`` of rows ``[0, B)`` and commit what the rule accepts.

    ``q`` ``[B, k, V]``: the distributions the drafts were sampled from; ``None`` when every
    row's drafts are deterministic. ``deterministic`` ``[B]`` bool: rows whose drafts are
    deterministic although ``q`` is given (their ``q`` is replaced by the one-hot)."""
    bucket, k = drafts.shape
    n_tok = rows.n_tok[:bucket]
    last = n_tok - 1  # [B] position of each row's newest token
    pos = last[:, None] + torch.arange(k + 1, device=last.device)  # [B, k+1]
    inputs = torch.cat([rows.tokens[:bucket].gather(1, last[:, None]), drafts], dim=1)
    step = SlotAttention(pos, torch.zeros_like(pos), shape.span, backend=shape.backend)
    hidden = target.forward(inputs, rows.kv, step)  # [B, k+1, H]
    store_hidden(rows, 0, pos, hidden)
    target_logits = target.logits(hidden)  # [B, k+1, V]
    temperature, top_p = rows.temperature[:bucket], rows.top_p[:bucket]
    p = sampling_probs(
        target_logits,
        temperature,
        top_p,
        any_top_p=shape.any_top_p,
        any_greedy=shape.any_greedy,
    )  # [B, k+1, V]
    if q is None or deterministic is not None:
        one_hot = torch.zeros_like(p[:, :k]).scatter_(-1, drafts[..., None], 1.0)  # [B, k, V]
        if q is None:
            q = one_hot
        else:
            assert deterministic is not None
            q = torch.where(deterministic[:, None, None], one_hot, q.to(p.dtype))
    out_len, keys = rows.out_len[:bucket][:, None], rows.stream_key[:bucket]
    steps = torch.arange(k + 1, device=last.device)[None, :]
    u_acc = counter_uniforms(keys, out_len + steps[:, :k], STREAM_ACCEPT)  # [B, k]
    u_next = counter_uniforms(keys, out_len + steps, STREAM_CORRECT)  # [B, k+1]
    verdict = rule(p, q.to(p.dtype), drafts, u_acc, u_next)
    # Row b emits drafts[:a] then next_token at index a (later columns are ignored).
    tokens = torch.cat([drafts, drafts[:, :1]], dim=1)
    tokens.scatter_(1, verdict.accepted[:, None], verdict.next_token[:, None])  # [B, k+1]
    logprobs = token_logprobs(target_logits, temperature, tokens)  # as plain decoding's
    out = commit(rows, 0, tokens, verdict.accepted + 1, logprobs)
    out.accepted = verdict.accepted
    return out
