"""Timed training steps: the online drafter trainer's packed step and one GRPO policy update.

Called by :mod:`longtail_workers.profile.main` after the forwards (the GRPO update moves the
policy's weights, which does not matter for timing but must come last). The drafter step is the
spot trainer's (``spot/trainer.py``): :func:`~longtail_workers.spot.windows.packed_loss`,
backward, AdamW step, on a packed batch of random pairs. The policy update is the trainer's
:func:`~longtail_workers.trainer.optim.train_step` (micro-batched GRPO loss, backward, clipping,
AdamW) on a small batch of random rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from longtail_api.policies import LossWeightsSpec
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.profile.timing import Repeats, first_and_median, median_seconds
from longtail_workers.spot.windows import PackedBatch, packed_loss
from longtail_workers.trainer.batch import GrpoBatch
from longtail_workers.trainer.optim import (
    TrainConfig,
    build_optimizer,
    micro_batch_budget,
    train_step,
)


@dataclass(frozen=True)
class TrainShape:
    """The batches the two training steps are timed on."""

    drafter_rows: int
    """Packed rows of the drafter step."""
    drafter_pairs: int
    """Training pairs per packed row (one window per row)."""
    sequences: int
    """Rollouts in the GRPO update."""
    prompt_tokens: int
    """Prompt tokens per rollout."""
    response_tokens: int
    """Response tokens per rollout (the ones that carry loss)."""


def drafter_train_tokens_per_s(
    drafter: EagleDrafter, shape: TrainShape, runs: Repeats, gen: torch.Generator
) -> float:
    """Training pairs per second of the spot trainer's step (loss, backward, AdamW)."""
    dev, dtype = drafter.fc.weight.device, drafter.fc.weight.dtype
    rows, pairs, hidden = shape.drafter_rows, shape.drafter_pairs, drafter.info.hidden_size
    batch = PackedBatch(
        input_ids=torch.randint(0, drafter.info.vocab_size, (rows, pairs), generator=gen).to(dev),
        hidden=torch.randn(rows, pairs, hidden, generator=gen).to(dev, dtype),  # [B, T, H]
        position_ids=torch.arange(pairs, device=dev).expand(rows, pairs).contiguous(),  # [B, T]
        target_hidden=torch.randn(rows, pairs, hidden, generator=gen).to(dev, dtype),
        segments=torch.zeros(rows, pairs, dtype=torch.long, device=dev),  # one window a row
    )
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-5)
    weights = LossWeightsSpec()

    def run() -> None:
        loss = packed_loss(drafter, batch, weights)
        optimizer.zero_grad(set_to_none=True)
        loss.total.backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    drafter.train()
    try:
        seconds = median_seconds(run, dev, runs)
    finally:
        drafter.eval()
    return rows * pairs / seconds


def grpo_update_costs(
    policy: nn.Module,
    shape: TrainShape,
    runs: Repeats,
    gen: torch.Generator,
    rows: Sequence[tuple[int, int]] | None = None,
) -> tuple[float, float]:
    """``(seconds per sequence token, warm-up seconds)`` of one GRPO update: per token, prompt
    and response alike (the trainer's default token budget), as the cost follows every token
    the passes run over; the warm-up is how much longer the first update on a fresh optimizer
    takes than a later one (the job's first step pays it). ``rows``: ``(prompt, response)``
    tokens per sequence of a real batch (a run's step: mixed lengths cost more per token than
    one length, through the micro-batches' padding and the long sequences' attention);
    default: ``shape``'s uniform batch."""
    dev = next(policy.parameters()).device
    vocab = int(policy.get_output_embeddings().out_features)  # type: ignore[operator]
    rows = rows or [(shape.prompt_tokens, shape.response_tokens)] * shape.sequences
    b, width = len(rows), max(p + r for p, r in rows)
    ids = torch.randint(0, vocab, (b, width), generator=gen).to(dev)  # [B, T]
    attention = torch.zeros(b, width, dtype=torch.long, device=dev)  # [B, T], right-padded
    response = torch.zeros(b, width, dtype=torch.long, device=dev)  # [B, T]
    for i, (p, r) in enumerate(rows):  # as the trainer's rollout_batch.py lays rows out
        attention[i, : p + r] = 1
        response[i, p : p + r] = 1
    batch = GrpoBatch(
        input_ids=ids,
        attention_mask=attention,
        response_mask=response,
        old_logprobs=torch.full((b, width), -1.0, device=dev),  # [B, T]
        advantages=torch.randn(b, generator=gen).to(dev),  # [B]
    )
    cfg = TrainConfig(micro_batch_tokens=micro_batch_budget(None, dev))
    optimizer = build_optimizer(policy, cfg)
    policy.train()
    try:
        first, seconds = first_and_median(
            lambda: train_step(policy, optimizer, batch, cfg), dev, runs
        )
    finally:
        policy.eval()
    return seconds / sum(p + r for p, r in rows), max(0.0, first - seconds)
