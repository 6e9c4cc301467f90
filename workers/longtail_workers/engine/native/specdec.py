"""One speculative-decoding step for the running batch: catch up, draft k, verify k+1, accept.

Called by :class:`~longtail_workers.engine.native.torch_engine.TorchEngine` for the steps the SD
policy marks as speculative. :func:`speculate` is one static step function (captured per batch
bucket and draft depth on CUDA, ``graphs.py``); for every row at once:

1. **Drafter catch-up.** The drafter's cache holds the pairs it has read (``drafter/pairs.py``:
   pair j = (x_{j+1}, h_j) at position j, read from the token and hidden-state stores); the
   pairs committed since (1..k+1 after a speculative step) are fed in one forward of a fixed
   ``width`` = largest depth + 1, the unused queries sitting at slots past the row's pairs. Its
   output at the newest pair is the feature ``f`` that proposes the next token. The drafter's
   context is the response from pair P-1 on, never the prompt's pairs (what every trainer trains
   it on); with a context window of W tokens (``speculative.drafterContextWindow``; one pair
   per answer token) a query reads only the W newest pairs. When a row has more
   pending pairs than ``width`` (SD has just switched on, was off for a while, or the last
   steps drafted from history, which never feeds the drafter) the engine first feeds all but
   the newest in one eager forward (:meth:`SpeculativeDecoder.catch_up`).
2. **Drafting.** k tokens from the drafter's processed distribution ``q`` (same temperature and
   top-p as the target), feeding ``(d_i, f_i)`` back for steps 2..k at the slots after the
   newest pair; those speculative entries lie past the drafter's read pairs and are overwritten
   by the next catch-up.
3. **Hybrid override** (``hybrid`` strategies): rows whose history match is long enough
   (``history_drafts.py``, a static buffer filled on the host before the step) take the history
   drafter's tokens instead, verified as deterministic drafts (``q`` one-hot).
4. **Verification and acceptance** (``verify.py``): the target scores ``[x_last, d_1 .. d_k]``
   in one forward; the pluggable rule (``engine/rejection.py``) keeps ``a`` drafts plus one
   correction/bonus token per row, committed through ``steps.commit``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.native.rows import RowState
from longtail_workers.engine.native.steps import StepOutput, StepShape
from longtail_workers.engine.native.verify import verify
from longtail_workers.engine.rejection import AcceptanceRule, rejection_sample
from longtail_workers.engine.sampling import (
    STREAM_DRAFT,
    counter_uniforms,
    sample_from_probs,
    sampling_probs,
)
from longtail_workers.engine.target import TargetModel
from longtail_workers.kvcache.slot_attention import use_slot_attention
from longtail_workers.kvcache.slots import SlotAttention, SlotKVCache


@dataclass
class DraftTrace:
    """Diagnostics of one drafting phase, for tests and debugging (see ``draft_observer``)."""

    contexts: list[list[int]]
    """Committed tokens of each row when drafting started."""
    prompt_lengths: list[int]
    """Prompt tokens of each row (the drafter's context starts at pair ``P-1``)."""
    draft_logits: torch.Tensor
    """``[B, k, V]`` drafter logits that proposed each draft token."""
    drafts: torch.Tensor
    """``[B, k]`` proposed tokens."""


DraftObserver = Callable[[DraftTrace], None]


def _window_lo(prompt_len: torch.Tensor, pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """First drafter slot a query at ``pos`` ``[B, Q]`` reads: the first response pair, or the
    window's start."""
    first = (prompt_len - 1)[:, None].expand_as(pos)  # [B, Q]
    return first if window is None else torch.maximum(first, pos - (window - 1))


def same_layout(a: EagleDrafter, b: EagleDrafter) -> bool:
    """Whether ``b``'s weights can be copied into ``a`` (same names, shapes and dtypes): a new
    version the engine loads into its drafter in place (``TorchEngine.set_drafter``)."""
    sa, sb = a.state_dict(), b.state_dict()
    return (
        sa.keys() == sb.keys()
        and all(sa[k].shape == sb[k].shape and sa[k].dtype == sb[k].dtype for k in sa)
        and (a.input_norm, a.fc_bias) == (b.input_norm, b.fc_bias)
    )


class SpeculativeDecoder:
    """Speculative steps of the running batch with an EAGLE drafter (see the module text)."""

    def __init__(
        self,
        target: TargetModel,
        drafter: EagleDrafter,
        *,
        rule: AcceptanceRule = rejection_sample,
        context_window: int | None = None,
        observer: DraftObserver | None = None,
    ) -> None:
        if drafter.lm_head is not target.lm_head:
            raise ValueError(
                "the drafter was built on another model instance (its LM head is not the "
                "target's); build or load it with this engine's model"
            )
        if drafter.training:
            raise ValueError(
                "the drafter is in training mode; call drafter.eval() (or load a published "
                "version) before handing it to the rollout engine"
            )
        use_slot_attention(drafter.config)
        self.target = target
        self.drafter = drafter
        self.rule = rule
        self.context_window = context_window
        self.observer = observer

    def new_cache(self, rows: int, length: int) -> SlotKVCache:
        w = self.drafter.fc.weight
        return SlotKVCache(self.drafter.config, rows, length, w.device, w.dtype, num_layers=1)

    @torch.no_grad()
    def _feed(
        self, rows: RowState, bucket: int, count: torch.Tensor, width: int, shape: StepShape
    ) -> torch.Tensor:
        """Feed each row's next ``count[b]`` pending pairs (``<= width``) to the drafter.

        Returns the features of the fed pairs ``[B, width, H]`` (garbage past ``count``)."""
        assert rows.hidden is not None and rows.draft_kv is not None
        done = rows.drafter_done[:bucket]  # [B]
        j = done[:, None] + torch.arange(width, device=done.device)  # [B, W] pair indices
        j = j.clamp(max=rows.length - 2)  # unused queries only; keeps token j+1 in range
        ids = rows.tokens[:bucket].gather(1, j + 1)  # [B, W] token x_{j+1}
        h = rows.hidden.shape[-1]
        states = rows.hidden[:bucket].gather(1, j[..., None].expand(bucket, width, h))
        lo = _window_lo(rows.prompt_len[:bucket], j, self.context_window)
        step = SlotAttention(j, lo, shape.span, backend=shape.backend)
        rows.draft_kv.step = step
        feats: torch.Tensor = self.drafter(
            ids, states, j, attention_mask=step, cache=rows.draft_kv
        )  # [B, W, H]
        rows.drafter_done[:bucket] = done + count
        return feats

    def catch_up(self, rows: RowState, shape: StepShape) -> None:
        """Eagerly feed every live row's pending pairs but the newest (one forward, not
        captured): afterwards :func:`speculate`'s fixed-width catch-up covers what is left.
        With a context window, pairs older than the window are skipped, never fed."""
        n = len(rows)
        pending = rows.pending_pairs()  # [n] host
        if self.context_window is not None:
            skip = np.maximum(pending - self.context_window, 0)
            rows.drafter_done[:n] += torch.from_numpy(skip).to(rows.device)
            rows.drafter_done_h[:n] += skip
            pending = pending - skip
        feed = np.maximum(pending - 1, 0)
        width = int(feed.max())
        if width > 0:
            # The reference attention: this forward is not captured, and hundreds of queries
            # per row are a prefill's shape, not what the Triton decode kernel is tiled for.
            eager = dataclasses.replace(shape, backend="torch")
            self._feed(rows, n, torch.from_numpy(feed).to(rows.device), width, eager)
            rows.drafter_done_h[:n] += feed

    @torch.no_grad()
    def speculate(
        self,
        rows: RowState,
        bucket: int,
        k: int,
        width: int,
        shape: StepShape,
        observe: bool,
        history: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> StepOutput:
        """One speculative step of depth ``k`` for rows ``[0, bucket)`` (capturable unless
        ``observe``). Every row must have 1..``width`` pending pairs. ``history``: the hybrid
        override, ``(drafts [B, k], use [B] bool)``: rows with ``use`` verify those drafts."""
        assert rows.draft_kv is not None
        pending = (rows.n_tok[:bucket] - 1) - rows.drafter_done[:bucket]  # [B]
        feats = self._feed(rows, bucket, pending, width, shape)  # [B, width, H]
        newest = (pending - 1).clamp(min=0)[:, None, None].expand(bucket, 1, feats.shape[-1])
        f = feats.gather(1, newest)[:, 0]  # [B, H] feature of each row's newest pair
        drafts, q, logits = self._draft(rows, bucket, k, f, shape)
        if history is None:
            out = verify(self.target, rows, drafts, q, shape, self.rule)
        else:
            chosen = torch.where(history[1][:, None], history[0], drafts)  # [B, k]
            out = verify(self.target, rows, chosen, q, shape, self.rule, history[1])
        if observe:
            out.draft_logits, out.drafts = logits, drafts
        return out

    def _draft(
        self, rows: RowState, bucket: int, k: int, f: torch.Tensor, shape: StepShape
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Propose ``k`` tokens per row from feature ``f`` ``[B, H]``:
        ``(drafts [B, k], q [B, k, V], logits [B, k, V])``."""
        assert rows.draft_kv is not None
        temperature, top_p = rows.temperature[:bucket], rows.top_p[:bucket]
        last = rows.n_tok[:bucket] - 1  # [B]
        steps = torch.arange(k, device=last.device)[None, :]
        u = counter_uniforms(
            rows.stream_key[:bucket], rows.out_len[:bucket][:, None] + steps, STREAM_DRAFT
        )
        drafts, qs, all_logits = [], [], []
        for i in range(k):
            logits = self.drafter.logits(f)[:, None, :]  # [B, 1, V]
            q = sampling_probs(
                logits, temperature, top_p, any_top_p=shape.any_top_p, any_greedy=shape.any_greedy
            )  # [B, 1, V]
            d = sample_from_probs(q, u[:, i : i + 1])  # [B, 1]
            drafts.append(d)
            qs.append(q)
            all_logits.append(logits)
            if i == k - 1:
                break
            # Draft step i+1 reads (d_{i+1}, f) at the slot after the newest pair (position N-1+i).
            pos = (last + i)[:, None]  # [B, 1]
            lo = _window_lo(rows.prompt_len[:bucket], pos, self.context_window)
            step = SlotAttention(pos, lo, shape.span, backend=shape.backend)
            rows.draft_kv.step = step
            f = self.drafter(d, f[:, None, :], pos, attention_mask=step, cache=rows.draft_kv)[:, 0]
        return torch.cat(drafts, dim=1), torch.cat(qs, dim=1), torch.cat(all_logits, dim=1)
