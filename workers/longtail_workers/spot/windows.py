"""Training windows over captured responses, packed several to a row with a block-diagonal mask.

Used by the spot trainer (``trainer.py``) for every optimizer step and for held-out evaluation.

**What a window is.** A captured sequence (``buffer.CapturedSequence``) holds the aligned tokens
``a = [x_{P-1}, y_0, .., y_{T-2}]`` and the target states ``h`` after each (``h[0]`` is the state
at the last prompt position P-1). Window ``k`` of size ``W`` (``window_tokens``) is the slice
``a[kW : kW+W+1]``, ``h[kW : kW+W+1]`` with ``start_position = P-1+kW``: W+1 tokens, i.e. W
pairs, and consecutive windows overlap by exactly one token, so every pair of the response is in
exactly one window. Feeding a window to ``pairs.build_training_pairs(tokens, hidden, start)``
gives, for pair ``t`` (absolute position ``p = start+t``)::

    drafter input  (embedding of a[t+1], h[t]) at position p    ->  target h[t+1]

so window 0's first pair is (embed(y_0), h_{P-1}) -> h_P: the drafter learns from the state at
the last prompt position on, exactly the pairs the engine's draft step consumes
(``tests/unit/workers/drafter/test_drafter_pairs.py``). The last output token never appears as
an input (it has no state), like in ``sequence_from_result``.

**Packing.** Windows are concatenated into rows of at most ``row_tokens`` pairs. Position ids
restart at each window's true absolute position (RoPE sees the same positions as in the
rollout) and the attention mask ``[B, 1, T, T]`` is block-diagonal causal: a pair attends to the
earlier pairs of its own window only; padding attends to itself (no NaN rows) and nothing
attends to it. Packed outputs therefore equal per-window outputs. The price (as in TLT): a
window other than the first does not see the response before it, while the engine's drafter
attends over the whole context; windows of ~512 tokens make that difference small.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from longtail_api.policies import LossWeightsSpec
from longtail_workers.drafter.loss import DrafterLoss, drafter_loss
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.pairs import build_training_pairs
from longtail_workers.spot.buffer import CapturedSequence


@dataclass(frozen=True)
class Window:
    """A slice of one captured sequence: ``num_pairs + 1`` tokens and their states."""

    tokens: torch.Tensor
    """``[n + 1]`` int64."""
    hidden: torch.Tensor
    """``[n + 1, H]``."""
    start_position: int
    """Absolute position of ``tokens[0]``."""
    seq_id: int = -1
    """The captured sequence it came from."""

    @property
    def num_pairs(self) -> int:
        return int(self.tokens.shape[0]) - 1


def make_windows(seq: CapturedSequence, window_tokens: int) -> list[Window]:
    """Cut ``seq`` into windows of at most ``window_tokens`` pairs (see the module text)."""
    if window_tokens < 1:
        raise ValueError(f"window_tokens={window_tokens}; must be >= 1")
    n = seq.num_tokens
    out = []
    for begin in range(0, n - 1, window_tokens):
        end = min(begin + window_tokens, n - 1)  # inclusive: the target of the last pair
        out.append(
            Window(
                tokens=seq.tokens[begin : end + 1],
                hidden=seq.hidden[begin : end + 1],
                start_position=seq.start_position + begin,
                seq_id=seq.seq_id,
            )
        )
    return out


def windows_of(sequences: Sequence[CapturedSequence], window_tokens: int) -> list[Window]:
    """All windows of ``sequences``, in order."""
    return [w for s in sequences for w in make_windows(s, window_tokens)]


@dataclass
class PackedBatch:
    """Windows packed into rows; every tensor is ``[B, T, ...]``."""

    input_ids: torch.Tensor
    """``[B, T]`` token ``x_{t+1}`` of each pair (0 on padding)."""
    hidden: torch.Tensor
    """``[B, T, H]`` state ``h_t`` of each pair."""
    position_ids: torch.Tensor
    """``[B, T]`` absolute position ``t``, restarting per window."""
    target_hidden: torch.Tensor
    """``[B, T, H]`` next state ``h_{t+1}`` (what the drafter must predict)."""
    segments: torch.Tensor
    """``[B, T]`` int64 window index within its row; -1 on padding."""

    @property
    def valid(self) -> torch.Tensor:
        """``[B, T]`` bool: real pairs."""
        return self.segments >= 0

    @property
    def num_pairs(self) -> int:
        return int(self.valid.sum())

    def allowed(self) -> torch.Tensor:
        """``[B, 1, T, T]`` bool: block-diagonal causal attention (see the module text)."""
        return block_causal_allowed(self.segments)


def block_causal_allowed(segments: torch.Tensor) -> torch.Tensor:
    """``[B, 1, T, T]`` bool from ``segments`` ``[B, T]`` (-1 = padding)."""
    t = segments.shape[1]
    idx = torch.arange(t, device=segments.device)
    causal = idx[None, :] <= idx[:, None]  # [T(q), T(k)]
    same = segments[:, :, None] == segments[:, None, :]  # [B, T, T]
    valid = segments >= 0  # [B, T]
    allowed = same & causal[None] & valid[:, :, None] & valid[:, None, :]
    self_only = torch.eye(t, dtype=torch.bool, device=segments.device)[None]  # padding rows
    allowed = torch.where(valid[:, :, None], allowed, self_only)
    return allowed[:, None]


def drafter_attention_mask(drafter: EagleDrafter, allowed: torch.Tensor) -> torch.Tensor:
    """``allowed`` in the form the drafter's attention implementation takes (bool or additive)."""
    if drafter.config._attn_implementation == "sdpa":
        return allowed
    dtype = drafter.fc.weight.dtype
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)


def _rows(windows: Sequence[Window], row_tokens: int) -> list[list[Window]]:
    rows: list[list[Window]] = []
    used = row_tokens  # forces a first row
    for w in windows:
        if w.num_pairs > row_tokens:
            raise ValueError(
                f"a window of {w.num_pairs} pairs does not fit a packed row of {row_tokens}; "
                "raise row_tokens (the trainer's pack_tokens) to at least window_tokens"
            )
        if used + w.num_pairs > row_tokens:
            rows.append([])
            used = 0
        rows[-1].append(w)
        used += w.num_pairs
    return rows


def pack_windows(
    windows: Sequence[Window], row_tokens: int, device: torch.device | None = None
) -> PackedBatch:
    """Pack ``windows`` in order into rows of at most ``row_tokens`` pairs (first fit)."""
    if not windows:
        raise ValueError("pack_windows needs at least one window")
    rows = _rows(windows, row_tokens)
    device = device if device is not None else windows[0].tokens.device
    width = max(sum(w.num_pairs for w in row) for row in rows)
    hidden_size, dtype = windows[0].hidden.shape[-1], windows[0].hidden.dtype
    b = len(rows)
    ids = torch.zeros(b, width, dtype=torch.long, device=device)
    pos = torch.zeros(b, width, dtype=torch.long, device=device)
    seg = torch.full((b, width), -1, dtype=torch.long, device=device)
    hid = torch.zeros(b, width, hidden_size, dtype=dtype, device=device)
    tgt = torch.zeros(b, width, hidden_size, dtype=dtype, device=device)
    for r, row in enumerate(rows):
        at = 0
        for k, w in enumerate(row):
            inputs, targets = build_training_pairs(w.tokens, w.hidden, w.start_position)
            n = w.num_pairs
            ids[r, at : at + n] = inputs.input_ids.to(device)
            pos[r, at : at + n] = inputs.position_ids.to(device)
            hid[r, at : at + n] = inputs.hidden.to(device)
            tgt[r, at : at + n] = targets.hidden.to(device)
            seg[r, at : at + n] = k
            at += n
    return PackedBatch(ids, hid, pos, tgt, seg)


def packed_forward(drafter: EagleDrafter, batch: PackedBatch) -> torch.Tensor:
    """Drafter features ``[B, T, H]`` for a packed batch (windows isolated by the mask)."""
    mask = drafter_attention_mask(drafter, batch.allowed())
    out: torch.Tensor = drafter(
        batch.input_ids, batch.hidden, batch.position_ids, attention_mask=mask
    )
    return out


def packed_loss(drafter: EagleDrafter, batch: PackedBatch, weights: LossWeightsSpec) -> DrafterLoss:
    """TLT's loss (``drafter/loss.py``) over the real pairs of a packed batch."""
    predicted = packed_forward(drafter, batch)  # [B, T, H]
    return drafter_loss(drafter, predicted, batch.target_hidden, weights, batch.valid)


@torch.no_grad()
def top1_accuracy(drafter: EagleDrafter, batch: PackedBatch) -> tuple[int, int]:
    """``(hits, pairs)``: drafter argmax == target argmax of the next token, over real pairs."""
    predicted = packed_forward(drafter, batch)  # [B, T, H]
    mine = drafter.logits(predicted).argmax(dim=-1)  # [B, T]
    theirs = drafter.logits(batch.target_hidden.to(predicted.dtype)).argmax(dim=-1)  # [B, T]
    valid = batch.valid
    return int((mine.eq(theirs) & valid).sum()), int(valid.sum())


@torch.no_grad()
def top1_over(
    drafter: EagleDrafter,
    windows: Sequence[Window],
    row_tokens: int,
    device: torch.device | None = None,
    windows_per_batch: int = 8,
) -> tuple[float | None, int]:
    """``(share, pairs)``: :func:`top1_accuracy` over ``windows``, packed a few at a time.

    ``share`` is None when there is no pair to score. Used by the spot trainer's held-out
    evaluation and quality gate, and by ``longtail drafter fit``.
    """
    hits = pairs = 0
    for i in range(0, len(windows), windows_per_batch):
        batch = pack_windows(windows[i : i + windows_per_batch], row_tokens, device)
        h, n = top1_accuracy(drafter, batch)
        hits, pairs = hits + h, pairs + n
    return (hits / pairs if pairs else None), pairs
