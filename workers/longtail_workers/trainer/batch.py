"""The tensors of one GRPO update, and their split into micro-batches by token budget.

The step driver builds a :class:`GrpoBatch` from a finished rollout (token ids, masks, the
rollout policy's log-probs, the advantages); :func:`~longtail_workers.trainer.optim.train_step`
splits it with :func:`micro_batches` so one forward pass never holds more than a budget of
padded tokens. Long-tailed rollouts make this matter: a few 32K-token answers next to many
short ones would otherwise pad every row to 32K. With a sharded trainer (``trainer/world.py``)
:func:`shard_rows` first deals the rows out to the ranks, each of which micro-batches its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class GrpoBatch:
    """One policy update's data; rows are sequences (prompt + response, padded)."""

    input_ids: Tensor  # [B, T] long
    attention_mask: Tensor  # [B, T] 1 for real tokens, 0 for padding
    response_mask: Tensor  # [B, T] 1 for response tokens (the ones that carry loss)
    old_logprobs: Tensor  # [B, T] rollout policy's log-probs of input_ids (see grpo.py)
    advantages: Tensor  # [B] one per sequence
    ref_logprobs: Tensor | None = None  # [B, T] reference policy's log-probs, for the KL term

    def __post_init__(self) -> None:
        if self.input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got {tuple(self.input_ids.shape)}")
        shape = self.input_ids.shape
        for name in ("attention_mask", "response_mask", "old_logprobs", "ref_logprobs"):
            value = getattr(self, name)
            if value is not None and value.shape != shape:
                raise ValueError(
                    f"GrpoBatch.{name} must be [B, T] = {tuple(shape)}, got {tuple(value.shape)}"
                )
        if self.advantages.shape != shape[:1]:
            raise ValueError(
                f"GrpoBatch.advantages must be [B] = [{shape[0]}], "
                f"got {tuple(self.advantages.shape)}"
            )

    @property
    def num_sequences(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """Response tokens: the denominator of the token-mean loss."""
        return int(self.response_mask.bool().sum())

    def to(self, device: torch.device) -> GrpoBatch:
        """This batch on ``device`` (the policy's): the driver builds it on the host, each
        micro-batch travels to the GPU just before its forward pass."""
        ref = self.ref_logprobs
        return GrpoBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            response_mask=self.response_mask.to(device),
            old_logprobs=self.old_logprobs.to(device),
            advantages=self.advantages.to(device),
            ref_logprobs=None if ref is None else ref.to(device),
        )

    def select(self, rows: list[int]) -> GrpoBatch:
        """Rows ``rows``, cut to the column span where any of them has a real token.

        Dropping all-padding columns at either end changes nothing for the kept rows: position
        ids come from the attention mask, and causal attention never looks at later columns.
        """
        attended = self.attention_mask[rows].bool().any(dim=0)  # [T]
        cols = attended.nonzero().flatten()
        lo, hi = (int(cols[0]), int(cols[-1]) + 1) if cols.numel() else (0, 1)

        def cut(t: Tensor) -> Tensor:
            return t[rows, lo:hi]

        return GrpoBatch(
            input_ids=cut(self.input_ids),
            attention_mask=cut(self.attention_mask),
            response_mask=cut(self.response_mask),
            old_logprobs=cut(self.old_logprobs),
            advantages=self.advantages[rows],
            ref_logprobs=None if self.ref_logprobs is None else cut(self.ref_logprobs),
        )


def shard_rows(batch: GrpoBatch, world_size: int) -> list[list[int]]:
    """The rows of each trainer rank: ``out[r]`` is rank ``r``'s slice, ascending.

    Only rows with response tokens are dealt (the others carry no loss). Longest first, each to
    the rank with the fewest real tokens so far (ties: the lowest rank), so the ranks' forward
    passes take about as long. A pure function of the batch: every rank computes the same deal.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    has_loss = batch.response_mask.bool().any(dim=1)  # [B]
    lengths = batch.attention_mask.bool().sum(dim=1)  # [B]
    rows = [i for i in range(batch.num_sequences) if bool(has_loss[i])]
    rows.sort(key=lambda i: (-int(lengths[i]), i))
    load: list[int] = [0] * world_size  # real tokens dealt to each rank
    out: list[list[int]] = [[] for _ in range(world_size)]
    for i in rows:
        r = min(range(world_size), key=lambda k: (load[k], k))
        out[r].append(i)
        load[r] += int(lengths[i])
    return [sorted(x) for x in out]


def micro_batches(
    batch: GrpoBatch, max_tokens: int | None, rows: Sequence[int] | None = None
) -> list[GrpoBatch]:
    """Split ``batch`` (only ``rows`` of it, when given) into micro-batches of at most
    ``max_tokens`` padded tokens each.

    Rows are sorted by their real-token span so similar lengths share a micro-batch (less
    padding), then packed greedily: a micro-batch of ``n`` rows spanning ``L`` columns costs
    ``n * L``. A row longer than the budget gets a micro-batch of its own (a sequence cannot be
    split). Rows without response tokens carry no loss and are left out. ``None`` keeps the
    whole batch in one micro-batch (still trimmed).
    """
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 or None, got {max_tokens}")
    has_loss = batch.response_mask.bool().any(dim=1)  # [B]
    wanted = range(batch.num_sequences) if rows is None else rows
    rows = [i for i in wanted if bool(has_loss[i])]
    if not rows:
        raise ValueError("batch has no response tokens; nothing to train on")
    if max_tokens is None:
        return [batch.select(rows)]
    spans = [_span(batch.attention_mask[i]) for i in rows]
    order = sorted(range(len(rows)), key=lambda j: spans[j][1] - spans[j][0])
    groups: list[list[int]] = []
    current: list[int] = []
    lo = hi = 0
    for j in order:
        first, last = spans[j]
        new_lo, new_hi = (min(lo, first), max(hi, last)) if current else (first, last)
        if current and (len(current) + 1) * (new_hi - new_lo) > max_tokens:
            groups.append(current)
            current, (new_lo, new_hi) = [], (first, last)
        current.append(rows[j])
        lo, hi = new_lo, new_hi
    groups.append(current)
    return [batch.select(g) for g in groups]


def _span(attention_row: Tensor) -> tuple[int, int]:
    """``(first, last + 1)`` column of the real tokens of one row (``[T]``)."""
    cols = attention_row.bool().nonzero().flatten()
    if cols.numel() == 0:
        return 0, 1
    return int(cols[0]), int(cols[-1]) + 1
