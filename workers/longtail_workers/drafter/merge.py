"""Token-weighted averaging of drafters trained by several workers in the same window.

Called by :meth:`longtail_workers.drafter.registry.DrafterRegistry.merge_candidates` at the step
boundary, when every harvested worker has submitted the drafter it trained from the same
published version ``d``. The merged version ``d+1`` is::

    theta_{d+1} = sum_i n_i * theta_i / sum_i n_i        (n_i = worker i's tokens)

where ``n_i`` is, at the trainer, the smaller of the pairs worker ``i`` says it trained on and
the answer tokens the trainer handed out in that window (``trainer/candidate_checks.py``): a
worker's self-report alone never sets its weight.

over the trainable weights only (``fc`` and the decoder layer; the shared embedding and LM head
are never part of a drafter checkpoint, so a merge can never touch them).

Why averaging is acceptable here: every candidate starts from the same weights ``theta_d``,
takes at most ``max_steps_per_window`` small AdamW steps, on rollouts of the same policy (the
same data distribution). The candidates therefore stay in a small neighbourhood of ``theta_d``
where the loss is close to linear, and the average of the weights is the average of the
updates: one round of local-SGD/FedAvg, which behaves like a larger-batch step; weighting by
tokens gives each worker's data its share, as one big batch would.

Limits: the argument weakens as windows get long (many steps, high learning rate), because the
candidates drift apart and the loss between them is no longer flat, so the average can be worse
than each part. Workers that trained on different policy versions, or from different base
versions, must not be merged (the registry refuses the latter). Optimizer moments are not
merged: each worker keeps its own, which then belong to slightly different weights. Held-out
accuracy of the merge is not the average of the parts: the trainer measures it on its own
held-out sample and refuses to publish a merge that scores below the current version (without
the trainer's checks the registry records the token-weighted mean of the candidates' numbers
and marks it an estimate in the version's metadata).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch


def merge_state_dicts(
    parts: Sequence[tuple[Mapping[str, torch.Tensor], int]],
) -> dict[str, torch.Tensor]:
    """Token-weighted average of ``[(state_dict, tokens), ...]`` (see the module text).

    Computed in float64 and cast back to each tensor's dtype. Parts with 0 tokens get weight 0.
    Raises ``ValueError`` when there is nothing to merge or the state dicts do not match.
    """
    if not parts:
        raise ValueError("merge_state_dicts: no candidates to merge")
    bad = [n for _, n in parts if n < 0]
    if bad:
        raise ValueError(f"merge_state_dicts: token counts must be >= 0, got {bad}")
    total = sum(n for _, n in parts)
    if total == 0:
        raise ValueError(
            "merge_state_dicts: every candidate trained on 0 tokens; nothing to merge "
            "(publish the base version again instead)"
        )
    first = parts[0][0]
    for i, (state, _) in enumerate(parts[1:], start=1):
        if set(state) != set(first):
            diff = sorted(set(state) ^ set(first))
            raise ValueError(f"merge_state_dicts: candidate {i} has different weights: {diff}")
        shapes = [k for k in first if state[k].shape != first[k].shape]
        if shapes:
            raise ValueError(f"merge_state_dicts: candidate {i} has other shapes for {shapes}")
    merged = {}
    for key, ref in first.items():
        acc = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        for state, n in parts:
            if n:
                acc += state[key].to(device=ref.device, dtype=torch.float64) * (n / total)
        merged[key] = acc.to(ref.dtype)
    return merged
