"""One speculative-decoding step for a running batch: draft k, verify k+1, accept, roll back.

Called by :class:`~longtail_workers.engine.torch_engine.TorchEngine` for the steps the SD policy
marks as speculative. A step, for every row at once:

1. **Drafter catch-up.** The drafter's KV cache holds the pairs it has already read; the pairs
   committed since (``drafter/pairs.py`` convention: pair j = (x_{j+1}, h_j) at position j) are
   fed in one forward, right-aligned in a ``[B, m]`` block (rows have different counts: ragged
   acceptance last step; the whole response so far right after SD switches on or a row was
   admitted, which is the "re-prefill"). The drafter's context is the response from pair P-1
   on, never the prompt's pairs, because that is what every trainer trains it on. The output at
   the newest pair is the feature ``f`` that proposes the next token.
2. **Drafting.** k tokens from the drafter's processed distribution ``q`` (same temperature and
   top-p as the target), feeding ``(d_i, f_i)`` back for steps 2..k. Those speculative entries
   are dropped from the drafter cache afterwards; only real pairs stay in it.
3. **Verification.** The target scores ``[x_last, d_1 .. d_k]`` in one cached forward.
4. **Acceptance** by the pluggable rule (``rejection.py``); each row keeps ``a`` drafts plus one
   correction/bonus token.
5. **Rollback / commit.** Target KV slots of rejected drafts become holes in that row; tokens,
   target log-probs and target hidden states are committed through the batch, which also cuts
   at stop tokens and ``max_new_tokens`` inside the accepted run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.batch import RunningBatch, SequenceState
from longtail_workers.engine.rejection import AcceptanceRule, rejection_sample
from longtail_workers.engine.sampling import (
    STREAM_ACCEPT,
    STREAM_CORRECT,
    STREAM_DRAFT,
    counter_uniforms,
    sample_from_probs,
    sampling_probs,
    token_logprobs,
)
from longtail_workers.engine.target import TargetModel
from longtail_workers.kvcache.cache import PaddedKVCache


@dataclass
class SpecStepOutcome:
    """What one speculative step did (host arrays, row-aligned with the batch at step start)."""

    draft_depth: int
    accepted: np.ndarray
    """Drafts accepted per row, before stop/length truncation."""
    emitted: np.ndarray
    """Tokens committed per row."""
    cut_by_stop: int = 0
    """Rows whose accepted run was cut after a stop token (tokens after it were discarded)."""
    cut_by_length: int = 0
    """Rows whose accepted run was cut at ``max_new_tokens``."""


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


class SpeculativeDecoder:
    """Runs speculative steps of a :class:`RunningBatch` with an EAGLE drafter."""

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
        self.target = target
        self.drafter = drafter
        self.rule = rule
        self.context_window = context_window
        self.observer = observer

    def activate(self, batch: RunningBatch) -> None:
        """SD switches on: an empty drafter cache; every row's response so far becomes pending."""
        batch.draft_kv = PaddedKVCache(self.drafter.config, len(batch), batch.device)
        for seq in batch.seqs:
            seq.drafter_done = seq.first_response_pair

    @staticmethod
    def deactivate(batch: RunningBatch) -> None:
        """SD switches off: the drafter cache is dropped (rebuilt on the next activation)."""
        batch.draft_kv = None

    def _pending_start(self, seq: SequenceState) -> int:
        start = seq.drafter_done
        if self.context_window is not None:
            start = max(start, seq.num_pairs - self.context_window)
        return start

    @torch.no_grad()
    def _catch_up(self, batch: RunningBatch) -> torch.Tensor:
        """Feed every row's pending pairs to the drafter; returns the newest features ``[B, H]``."""
        kv = batch.draft_kv
        assert kv is not None
        starts = [self._pending_start(s) for s in batch.seqs]
        ids = [
            torch.tensor(s.pair_tokens(st), dtype=torch.long)
            for s, st in zip(batch.seqs, starts, strict=True)
        ]
        states = [s.pair_states(st) for s, st in zip(batch.seqs, starts, strict=True)]
        pos = [torch.arange(st, s.num_pairs) for s, st in zip(batch.seqs, starts, strict=True)]
        if any(len(t) == 0 for t in ids):
            raise RuntimeError(
                "a running row has no pending drafter pair; engine bookkeeping broke"
            )
        dev = batch.device
        # Right-aligned (left-padded): the last slot of every row is its newest pair.
        ids_pad = pad_sequence(ids, batch_first=True, padding_side="left").to(dev)  # [B, m]
        hid_pad = pad_sequence(states, batch_first=True, padding_side="left")  # [B, m, H]
        pos_pad = pad_sequence(pos, batch_first=True, padding_side="left").to(dev)  # [B, m]
        lengths = torch.tensor([len(t) for t in ids], device=dev)
        m = ids_pad.shape[1]
        valid = torch.arange(m, device=dev)[None, :] >= (m - lengths)[:, None]  # [B, m]
        mask = kv.mask_for(valid, self.target.dtype)
        feats: torch.Tensor = self.drafter(
            ids_pad, hid_pad, pos_pad, attention_mask=mask, cache=kv.cache
        )
        kv.commit(valid)
        for seq in batch.seqs:
            seq.drafter_done = seq.num_pairs
        if self.context_window is not None and kv.num_slots > 2 * self.context_window:
            # Sliding window: the drafter reads the newest W..2W slots, so a draft step costs
            # O(W), not O(context). Cut at 2W so the cut (a view) happens every W slots.
            kv.keep_last(self.context_window)
        return feats[:, -1]  # [B, H]

    @torch.no_grad()
    def _draft(self, batch: RunningBatch, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Propose ``k`` tokens per row: ``(drafts [B, k], q [B, k, V])``."""
        kv = batch.draft_kv
        assert kv is not None
        f = self._catch_up(batch)  # [B, H]
        u = counter_uniforms(batch.seeds, batch.out_positions(k), STREAM_DRAFT, batch.device)
        ones = torch.ones(len(batch), 1, dtype=torch.bool, device=batch.device)
        drafts, qs, all_logits = [], [], []
        for i in range(k):
            logits = self.drafter.logits(f)[:, None, :]  # [B, 1, V]
            all_logits.append(logits)
            q = sampling_probs(logits, batch.temperature, batch.top_p)  # [B, 1, V]
            d = sample_from_probs(q, u[:, i : i + 1])  # [B, 1]
            drafts.append(d)
            qs.append(q)
            if i == k - 1:
                break
            # Draft step i+1 reads (d_{i+1}, f) at the position after the newest pair.
            pos = (batch.last_pos + i)[:, None]  # [B, 1]
            mask = kv.mask_for(ones, self.target.dtype)
            f = self.drafter(d, f[:, None, :], pos, attention_mask=mask, cache=kv.cache)[:, 0]
            kv.commit(ones)
        kv.drop_last(k - 1)  # speculative drafter entries never become context
        drafts_t, q_t = torch.cat(drafts, dim=1), torch.cat(qs, dim=1)  # [B, k], [B, k, V]
        if self.observer is not None:
            contexts = [s.tokens for s in batch.seqs]
            prompts = [len(s.prompt) for s in batch.seqs]
            self.observer(DraftTrace(contexts, prompts, torch.cat(all_logits, dim=1), drafts_t))
        return drafts_t, q_t

    @torch.no_grad()
    def step(self, batch: RunningBatch, k: int) -> SpecStepOutcome:
        """One speculative step with draft depth ``k`` (>= 1) for every row of ``batch``."""
        if batch.draft_kv is None:
            self.activate(batch)
        drafts, q = self._draft(batch, k)
        b = len(batch)
        inputs = torch.cat([batch.last_token[:, None], drafts], dim=1)  # [B, k+1]
        positions = batch.last_pos[:, None] + torch.arange(k + 1, device=batch.device)
        all_valid = torch.ones(b, k + 1, dtype=torch.bool, device=batch.device)
        logits, hidden = self.target.forward(inputs, positions, batch.kv, all_valid)  # [B,k+1,*]
        p = sampling_probs(logits, batch.temperature, batch.top_p)  # [B, k+1, V]
        u_acc = counter_uniforms(batch.seeds, batch.out_positions(k), STREAM_ACCEPT, batch.device)
        u_next = counter_uniforms(
            batch.seeds, batch.out_positions(k + 1), STREAM_CORRECT, batch.device
        )
        verdict = self.rule(p, q.to(p.dtype), drafts, u_acc, u_next)
        accepted = verdict.accepted  # [B]
        # Row b emits drafts[:a] then next_token at index a (later columns are ignored).
        tokens = torch.cat([drafts, drafts[:, :1]], dim=1)
        tokens.scatter_(1, accepted[:, None], verdict.next_token[:, None])  # [B, k+1]
        emitted = accepted + 1
        logprobs = token_logprobs(logits, batch.temperature, tokens)  # target's, as plain decode
        # Keep target KV of [x_last, d_1..d_a]; the slots of rejected drafts become holes.
        batch.kv.invalidate_tail(
            torch.arange(k + 1, device=batch.device)[None, :] < emitted[:, None]
        )
        accepted_h = accepted.cpu().numpy()
        for seq, a in zip(batch.seqs, accepted_h, strict=True):
            seq.spec_steps += 1
            seq.drafted += k
            seq.accepted += int(a)
        seqs = list(batch.seqs)
        kept = batch.commit(tokens, emitted, logprobs, hidden)
        cut = [s for s, n, e in zip(seqs, kept, accepted_h + 1, strict=True) if n < e]
        by_stop = sum(1 for s in cut if s.finish_reason == "stop")
        return SpecStepOutcome(k, accepted_h, kept, by_stop, len(cut) - by_stop)
