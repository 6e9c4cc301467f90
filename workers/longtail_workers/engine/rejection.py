"""Lossless acceptance of draft tokens: speculative rejection sampling, batched.

The native engine's default acceptance rule (``TorchEngine(acceptance_rule=...)``), called by
``native/verify.py`` once per speculative step with the target's and the drafter's
processed distributions (same temperature and top-p, from ``sampling.sampling_probs``). The rule
(Leviathan et al. 2023; Chen et al. 2023): walk the k draft tokens in order; accept draft ``x``
with probability ``min(1, p(x) / q(x))``; at the first rejection sample the replacement from
``norm(max(0, p - q))`` and stop; if all k are accepted, sample a bonus token from the target's
next distribution ``p_{k}``. Every emitted token is then distributed exactly as the target's
own sampling would be. Greedy rows arrive as one-hot ``p`` and ``q``, for which the same rule is
"accept while the draft equals the target's argmax, then emit the target's argmax".

Freshness of randomness: the uniforms passed in are counter-based on (seed, output position,
stream), and a position's uniforms only influence the state once (the step that finalises the
token at that position), so each step uses randomness independent of everything before it.

The rule is a plain function so that tests can plug in deliberately broken ones through
``TorchEngine(acceptance_rule=...)`` and check that the distribution test catches them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from longtail_workers.engine.sampling import sample_from_probs


@dataclass
class Verdict:
    """Outcome of verifying one speculative step for every row."""

    accepted: torch.Tensor
    """``[B]`` int64: leading draft tokens accepted, 0..k."""
    next_token: torch.Tensor
    """``[B]`` int64: the correction (when ``accepted < k``) or bonus token."""


AcceptanceRule = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], Verdict
]
"""``rule(p [B,k+1,V], q [B,k,V], drafts [B,k], u_accept [B,k], u_next [B,k+1]) -> Verdict``.

``p[:, i]`` is the target's distribution for draft position i (``p[:, k]`` the bonus position),
``q[:, i]`` the drafter's, ``drafts[:, i] ~ q[:, i]``; ``u_accept[:, i]`` is the uniform of the
test at position i and ``u_next[:, i]`` the uniform for sampling the token at position i when
the walk stops there.
"""


def rejection_sample(
    p: torch.Tensor,
    q: torch.Tensor,
    drafts: torch.Tensor,
    u_accept: torch.Tensor,
    u_next: torch.Tensor,
) -> Verdict:
    """The standard, lossless rule (see module text)."""
    b, k = drafts.shape
    px = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)  # [B, k]
    qx = q.gather(-1, drafts[..., None]).squeeze(-1)  # [B, k]
    # u < p/q without dividing: accepts surely when p >= q, never when p == 0.
    ok = u_accept.to(p.dtype) * qx < px  # [B, k]
    accepted = torch.cumprod(ok.long(), dim=1).sum(dim=1)  # [B]
    rows = torch.arange(b, device=p.device)
    # With q padded by a zero row at index k, "bonus from p_k" is the residual at k as well.
    q_ext = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)  # [B, k+1, V]
    p_stop, q_stop = p[rows, accepted], q_ext[rows, accepted]  # [B, V]
    residual = (p_stop - q_stop).clamp_(min=0)
    mass = residual.sum(-1, keepdim=True)
    # mass == 0 only if p <= q everywhere at a rejected position, i.e. p == q up to rounding;
    # then a rejection had probability ~0 and p itself is the right distribution.
    dist = torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(p.dtype).tiny), p_stop)
    u = u_next[rows, accepted]  # [B]
    next_token = sample_from_probs(dist[:, None, :], u[:, None]).squeeze(1)
    return Verdict(accepted=accepted, next_token=next_token)
