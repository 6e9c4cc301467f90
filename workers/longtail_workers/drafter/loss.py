"""TLT's drafter loss: SmoothL1 on the next hidden state + soft cross-entropy on next tokens.

Used by the offline fitter (``fit.py``) and by the online spot trainer. For each training pair
(``pairs.py``) the drafter predicts ``f_t`` for the target's next state ``h_{t+1}``::

    loss = w1 * SmoothL1(f_t, h_{t+1})
         + w2 * CE(softmax(lm_head(h_{t+1})), log_softmax(lm_head(f_t)))

with ``w1 = smooth_l1`` (1.0) and ``w2 = cross_entropy`` (0.1) from ``LossWeightsSpec``. The
soft target is the target's full next-token distribution at temperature 1 (richer than the
sampled token). Both terms average over valid pairs only (padding in packed batches is masked);
SmoothL1 also averages over the hidden dimension, like EAGLE.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from longtail_api.policies import LossWeightsSpec
from longtail_workers.drafter.model import EagleDrafter


@dataclass
class DrafterLoss:
    """The weighted total (to backprop) and its two unweighted parts (to log)."""

    total: torch.Tensor
    smooth_l1: torch.Tensor
    cross_entropy: torch.Tensor


def drafter_loss(
    drafter: EagleDrafter,
    predicted: torch.Tensor,
    target_hidden: torch.Tensor,
    weights: LossWeightsSpec,
    valid: torch.Tensor | None = None,
) -> DrafterLoss:
    """Loss of ``predicted`` ``[..., H]`` against ``target_hidden`` ``[..., H]``.

    ``valid`` (bool, ``predicted.shape[:-1]``) masks padding; all pairs count when omitted.
    """
    if predicted.shape != target_hidden.shape:
        raise ValueError(
            f"predicted {tuple(predicted.shape)} and target_hidden "
            f"{tuple(target_hidden.shape)} must have the same shape"
        )
    target_hidden = target_hidden.to(predicted.dtype).detach()
    if valid is None:
        valid = torch.ones(predicted.shape[:-1], dtype=torch.bool, device=predicted.device)
    w = valid.to(predicted.dtype)  # [...]
    count = w.sum().clamp(min=1.0)
    l1 = F.smooth_l1_loss(predicted, target_hidden, reduction="none").mean(dim=-1)  # [...]
    with torch.no_grad():
        target_probs = torch.softmax(drafter.logits(target_hidden).float(), dim=-1)
    log_q = torch.log_softmax(drafter.logits(predicted).float(), dim=-1)
    ce = -(target_probs * log_q).sum(dim=-1)  # [...]
    l1_mean = (l1 * w).sum() / count
    ce_mean = (ce * w.float()).sum() / count.float()
    total = weights.smooth_l1 * l1_mean + weights.cross_entropy * ce_mean.to(l1_mean.dtype)
    return DrafterLoss(total=total, smooth_l1=l1_mean.detach(), cross_entropy=ce_mean.detach())
