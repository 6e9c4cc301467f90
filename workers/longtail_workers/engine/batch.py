"""Per-sequence generation state and the running batch the engine decodes.

Owned by :class:`~longtail_workers.engine.torch_engine.TorchEngine`; speculative decoding reads
and commits through it. A :class:`SequenceState` is the host-side record of one request (tokens,
log-probs, the target hidden states kept for the drafter and for the result). A
:class:`RunningBatch` holds the rows being decoded together: device tensors of their sampling
settings and last token, and the target's (and, while SD is on, the drafter's) KV caches, whose
rows always line up with ``seqs``.

Hidden-state bookkeeping follows the drafter's pairing convention (``drafter/pairs.py``): for the
committed tokens ``x_0 .. x_{N-1}`` the engine records ``h_j`` (the target state at position j,
which produced ``x_{j+1}``) for every ``j``. The record is called "pair states": pair ``j`` is
``(x_{j+1}, h_j)`` at position ``j``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np
import torch

from longtail_workers.engine.interface import FinishReason, GenerationRequest, GenerationResult
from longtail_workers.kvcache.cache import PaddedKVCache


@dataclass
class SequenceState:
    """Host-side record of one request while it is waiting, running or done."""

    index: int
    request: GenerationRequest
    seed: int
    keep_hidden: bool
    """Record pair states of generated tokens (drafter or ``return_hidden_states``)."""
    prompt: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    hidden_chunks: list[torch.Tensor] = field(default_factory=list)
    chunk_starts: list[int] = field(default_factory=list)
    """Pair index of the first state in each chunk (ascending)."""
    num_pairs: int = 0
    """Pairs committed so far = number of tokens - 1."""
    drafter_done: int = 0
    """Pairs already in the drafter's KV cache, counted from pair 0 (only meaningful while SD is
    on). A fresh drafter cache (switch-on, or a row admitted while SD is on) sets it to the first
    response pair: the drafter never reads the prompt's pairs (``drafter/pairs.py``)."""
    spec_steps: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def first_response_pair(self) -> int:
        """Pair index P-1: ``(y_0, h_{P-1})``, where the drafter's context starts (``pairs.py``).

        Also the first pair whose state is recorded: neither the drafter nor a result needs the
        prompt's states."""
        return len(self.prompt) - 1

    def record_pairs(self, states: torch.Tensor) -> None:
        """Append ``[n, H]`` states of the next ``n`` pairs (kept only when needed)."""
        first = self.num_pairs
        self.num_pairs += int(states.shape[0])
        if not self.keep_hidden:
            return
        if first < self.first_response_pair:  # prompt states (prefill) are not kept
            states = states[self.first_response_pair - first :]
            first = self.first_response_pair
        if states.shape[0] > 0:
            # A copy, so a row never pins the whole [B, k+1, H] block it was sliced from.
            self.hidden_chunks.append(states.clone())
            self.chunk_starts.append(first)

    def pair_states(self, start: int) -> torch.Tensor:
        """States of pairs ``start .. num_pairs-1`` ``[n, H]``.

        Only the chunks that overlap the range are concatenated, so the per-step cost is the
        number of pending pairs, not the sequence length.
        """
        if start < self.first_response_pair or not self.hidden_chunks:
            raise RuntimeError(
                f"pair states from {start} were not kept (kept from {self.first_response_pair}, "
                f"{len(self.hidden_chunks)} chunks)"
            )
        i = bisect.bisect_right(self.chunk_starts, start) - 1
        chunks = self.hidden_chunks[i:]
        joined = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
        return joined[start - self.chunk_starts[i] :]

    def pair_tokens(self, start: int) -> list[int]:
        """Input tokens of pairs ``start ..`` (pair j carries token j+1), without copying all."""
        first = start + 1
        if first >= len(self.prompt):
            return self.output[first - len(self.prompt) :]
        return self.prompt[first:] + self.output

    def result(self) -> GenerationResult:
        assert self.finish_reason is not None
        hidden = None
        if self.request.return_hidden_states and self.output:
            hidden = self.pair_states(self.first_response_pair)
        return GenerationResult(
            request_id=self.request.request_id,
            prompt_token_ids=list(self.prompt),
            output_token_ids=list(self.output),
            output_logprobs=list(self.logprobs),
            finish_reason=self.finish_reason,
            hidden_states=hidden,
            spec_steps=self.spec_steps,
            drafted_tokens=self.drafted,
            accepted_tokens=self.accepted,
        )


class RunningBatch:
    """Rows decoded together; tensors are row-aligned with ``seqs`` (see module text)."""

    def __init__(self, seqs: list[SequenceState], kv: PaddedKVCache, device: torch.device) -> None:
        self.seqs = seqs
        self.kv = kv
        self.draft_kv: PaddedKVCache | None = None
        self.device = device
        reqs = [s.request for s in seqs]
        self.temperature = torch.tensor(
            [r.temperature for r in reqs], dtype=torch.float64, device=device
        )
        self.top_p = torch.tensor([r.top_p for r in reqs], dtype=torch.float64, device=device)
        width = max([len(r.stop_token_ids) for r in reqs] + [1])
        stops = [list(r.stop_token_ids) + [-1] * (width - len(r.stop_token_ids)) for r in reqs]
        self.stop_ids = torch.tensor(stops, dtype=torch.long, device=device).view(len(seqs), width)
        self.seeds = np.array([s.seed for s in seqs], dtype=np.uint64)
        self.max_new = np.array([r.max_new_tokens for r in reqs], dtype=np.int64)
        self.out_len = np.zeros(len(seqs), dtype=np.int64)
        self.last_token = torch.zeros(len(seqs), dtype=torch.long, device=device)  # [B]
        self.last_pos = torch.zeros(len(seqs), dtype=torch.long, device=device)  # [B]

    def __len__(self) -> int:
        return len(self.seqs)

    def remaining(self) -> np.ndarray:
        """Tokens each row may still emit ``[B]`` (host)."""
        return self.max_new - self.out_len

    def out_positions(self, n: int) -> np.ndarray:
        """Output indices of the next ``n`` tokens of every row ``[B, n]`` (host)."""
        return self.out_len[:, None] + np.arange(n)[None, :]

    def commit(
        self,
        tokens: torch.Tensor,
        emitted: torch.Tensor,
        logprobs: torch.Tensor,
        states: torch.Tensor,
    ) -> np.ndarray:
        """Commit up to ``emitted[b]`` of ``tokens[b]`` ``[B, n]``, cut at stop/max_new_tokens.

        ``states`` ``[B, n, H]`` are the pair states that produced each token. Returns the number
        of tokens kept per row (host ``[B]``); finished rows get their ``finish_reason``.
        """
        n = tokens.shape[1]
        idx = torch.arange(n, device=tokens.device)
        in_range = idx[None, :] < emitted[:, None]  # [B, n]
        is_stop = (tokens[..., None] == self.stop_ids[:, None, :]).any(-1) & in_range
        first_stop = torch.where(is_stop.any(1), is_stop.int().argmax(1), n)  # [B]
        budget = torch.from_numpy(self.remaining()).to(tokens.device)
        keep = torch.minimum(torch.minimum(emitted, first_stop + 1), budget)  # [B]
        keep_h = keep.cpu().numpy()
        stopped = (first_stop < keep).cpu().tolist()
        tok_h, lp_h = tokens.cpu().tolist(), logprobs.cpu().tolist()
        for b, seq in enumerate(self.seqs):
            k = int(keep_h[b])
            seq.output.extend(tok_h[b][:k])
            seq.logprobs.extend(lp_h[b][:k])
            seq.record_pairs(states[b, :k])
            if stopped[b]:
                seq.finish_reason = "stop"
            elif self.out_len[b] + k >= self.max_new[b]:
                seq.finish_reason = "length"
        self.last_token = tokens.gather(1, (keep - 1).clamp(min=0)[:, None]).squeeze(1)
        self.last_pos = self.last_pos + keep
        self.out_len = self.out_len + keep_h
        return keep_h

    def select(self, rows: list[int]) -> None:
        """Keep only ``rows`` (host indices), in that order, in every row-aligned structure."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.seqs = [self.seqs[i] for i in rows]
        self.kv.select(idx)
        if self.draft_kv is not None:
            self.draft_kv.select(idx)
        for name in ("temperature", "top_p", "stop_ids", "last_token", "last_pos"):
            setattr(self, name, getattr(self, name)[idx])
        self.seeds, self.max_new, self.out_len = (
            self.seeds[rows],
            self.max_new[rows],
            self.out_len[rows],
        )

    def extend(self, other: RunningBatch) -> None:
        """Append ``other``'s rows (a freshly prefilled group) below ours."""
        self.seqs = self.seqs + other.seqs
        self.kv.extend(other.kv)
        if self.draft_kv is not None:
            # New rows have nothing in the drafter yet: an empty cache, their response pending.
            fresh = PaddedKVCache(self.draft_kv.config, len(other), self.device)
            self.draft_kv.extend(fresh)
            for seq in other.seqs:
                seq.drafter_done = seq.first_response_pair
        width = max(self.stop_ids.shape[1], other.stop_ids.shape[1])
        self.stop_ids = torch.cat(
            [_pad_cols(self.stop_ids, width), _pad_cols(other.stop_ids, width)]
        )
        for name in ("temperature", "top_p", "last_token", "last_pos"):
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        self.seeds = np.concatenate([self.seeds, other.seeds])
        self.max_new = np.concatenate([self.max_new, other.max_new])
        self.out_len = np.concatenate([self.out_len, other.out_len])


def _pad_cols(x: torch.Tensor, width: int) -> torch.Tensor:
    if x.shape[1] == width:
        return x
    pad = x.new_full((x.shape[0], width - x.shape[1]), -1)
    return torch.cat([x, pad], dim=1)
