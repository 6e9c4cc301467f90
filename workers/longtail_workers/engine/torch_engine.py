"""The native torch rollout engine: batched, KV-cached generation with adaptive SD.

Used by the rollout worker on CPU (tests, local mode) and for the long tail on GPUs; it
implements :class:`~longtail_workers.engine.interface.RolloutEngine`. The loop, per iteration:

1. admit waiting prompts into free running slots (left-padded prefills of length-sorted groups,
   sampling each row's first token) and merge them into the running batch;
2. ask the SD policy whether this decode step speculates (running count vs threshold, warm-up
   latch) and with which draft depth (per batch-size bucket);
3. run one plain decode step (one token per row) or one speculative step (``specdec.py``);
4. retire finished rows (stop token or ``max_new_tokens``), compacting the KV caches when rows'
   rejected drafts or departed neighbours leave too much waste.

Sampling uses counter-based per-request random streams (``sampling.py``): a request's tokens do
not depend on which requests share the batch, as long as SD's on/off schedule is the same (SD
consumes randomness differently; its output distribution is the target's either way). Floating
point results of batched matmuls can differ in the last bits with batch composition; with
float32 models that can flip a near-tie, which is why the exactness tests run in float64.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from longtail_api.policies import SpeculativeSpec
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.batch import RunningBatch, SequenceState
from longtail_workers.engine.interface import GenerationRequest, GenerationResult, RolloutEngine
from longtail_workers.engine.rejection import AcceptanceRule, rejection_sample
from longtail_workers.engine.sampling import (
    STREAM_SAMPLE,
    counter_uniforms,
    sample_from_probs,
    sampling_probs,
    token_logprobs,
)
from longtail_workers.engine.scheduler import Scheduler, length_groups
from longtail_workers.engine.sd_policy import SpecDecodePolicy
from longtail_workers.engine.specdec import DraftObserver, SpeculativeDecoder
from longtail_workers.engine.stats import RolloutMetrics, RolloutStats, StepRecord
from longtail_workers.engine.target import TargetModel


@dataclass
class EngineConfig:
    """Capacity knobs of the torch engine."""

    max_running: int = 64
    """Most sequences decoded together; more prompts wait and are admitted as others finish."""
    max_prefill_tokens: int = 16384
    """Padded prompt tokens prefilled in one admission group."""
    prefill_split_cost: int = 64
    """What one more prefill forward is worth, in padded prompt tokens. An admitted group is
    split by prompt length where that saves more padding than this (``length_groups``); for a
    batch of the built-in task's prompts that removes most of the padding and most of the
    prefill time (docs/performance.md, "Prefill by length groups"). 0 prefills every distinct
    length apart; a very large value never splits. Tuned on CPU only: on a GPU, where padding is
    nearly free until a forward is compute-bound, a larger value (thousands) is likely better."""
    drafter_context_window: int | None = None
    """Sliding window of the drafter's own context, in pairs (None: the whole context). When SD
    switches on, the drafter is re-prefilled with at most this many recent pairs per row, and
    its KV cache is cut back to the newest W slots whenever it exceeds 2W, so re-prefill and
    each draft step cost O(W) instead of O(context). The first draft token reads the target's
    own hidden state, so a short window costs little acceptance (docs/performance.md)."""
    compact_min_waste: int = 32
    """KV slots that must be reclaimable before a cache is compacted."""
    policy_seed: int = 0
    """Seed of the SD strategy bandit."""


class TorchEngine(RolloutEngine):
    """Batched generation for a HF causal LM with optional adaptive speculative decoding."""

    def __init__(
        self,
        model: nn.Module,
        *,
        config: EngineConfig | None = None,
        speculative: SpeculativeSpec | None = None,
        drafter: EagleDrafter | None = None,
        metrics: RolloutMetrics | None = None,
        acceptance_rule: AcceptanceRule = rejection_sample,
        draft_observer: DraftObserver | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        if self.config.prefill_split_cost < 0:
            raise ValueError(
                f"EngineConfig.prefill_split_cost={self.config.prefill_split_cost}; must be >= 0 "
                "(padded prompt tokens one more prefill forward is worth)"
            )
        window = self.config.drafter_context_window
        if window is not None and window < 1:
            raise ValueError(
                f"EngineConfig.drafter_context_window={window}; must be >= 1 pair, or None for "
                "the whole context (spec field speculative.drafterContextWindow)"
            )
        self.target = TargetModel(model)
        self.spec = speculative or SpeculativeSpec(enabled=False)
        self.policy = SpecDecodePolicy(self.spec, seed=self.config.policy_seed)
        if self.spec.enabled and drafter is None:
            raise ValueError(
                "speculative.enabled is true but no drafter was given; pass "
                "drafter=EagleDrafter(model, target_id=...) (or load_drafter(...)), or set "
                "speculative.enabled=false"
            )
        self._rule = acceptance_rule
        self._observer = draft_observer
        self.sd: SpeculativeDecoder | None = None
        if drafter is not None:
            self.set_drafter(drafter)
        self.stats = RolloutStats()
        self.metrics = metrics
        self._scheduler: Scheduler | None = None
        self.running = 0
        """Sequences in the running batch right now (for a worker's status endpoint)."""

    def set_drafter(self, drafter: EagleDrafter) -> None:
        """Use ``drafter`` from the next :meth:`generate` on (a new drafter version)."""
        if drafter.info.hidden_size != self.target.hidden_size:
            raise ValueError(
                f"drafter hidden_size {drafter.info.hidden_size} != target hidden_size "
                f"{self.target.hidden_size}"
            )
        self.sd = SpeculativeDecoder(
            self.target,
            drafter,
            rule=self._rule,
            context_window=self.config.drafter_context_window,
            observer=self._observer,
        )

    @property
    def waiting(self) -> int:
        return self._scheduler.waiting if self._scheduler is not None else 0

    def _new_sequence(self, index: int, request: GenerationRequest) -> SequenceState:
        has_drafter = self.sd is not None and self.spec.enabled
        prompt = [int(t) for t in request.prompt_token_ids]
        return SequenceState(
            index=index,
            request=request,
            # Any int seeds the counter-based stream; folded into the uint64 key space.
            seed=(request.seed if request.seed is not None else secrets.randbits(63)) % 2**64,
            keep_hidden=has_drafter or request.return_hidden_states,
            prompt=prompt,
        )

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Complete every request (see :class:`RolloutEngine`); results in request order."""
        for r in requests:
            r.validate(self.target.vocab_size, self.target.max_positions)
        seqs = [self._new_sequence(i, r) for i, r in enumerate(requests)]
        self._scheduler = Scheduler(self.config.max_running, self.config.max_prefill_tokens)
        self._scheduler.add(seqs)
        self.policy.reset()
        batch: RunningBatch | None = None
        while self._scheduler.waiting or batch is not None:
            admitted = self._scheduler.admit(len(batch) if batch is not None else 0)
            if admitted:
                group = self._prefill(admitted)
                if batch is None:
                    batch = group
                else:
                    batch.extend(group)
            batch = self._retire(batch)
            if batch is not None:
                self._decode_step(batch)
                batch = self._retire(batch)
            self.running = len(batch) if batch is not None else 0
        return [s.result() for s in seqs]

    def _record(self, step: StepRecord) -> None:
        self.stats.record(step)
        if self.metrics is not None:
            self.metrics.observe(step, self.stats, self.waiting)

    def _prefill(self, seqs: list[SequenceState]) -> RunningBatch:
        """Prefill admitted prompts in length groups; one running batch of them all."""
        lengths = [len(s.prompt) for s in seqs]
        groups = length_groups(lengths, self.config.prefill_split_cost)
        # Widest group first: the narrower ones are left-padded once to its width when merged.
        batches = [self._prefill_group([seqs[i] for i in g]) for g in reversed(groups)]
        merged = batches[0]
        for other in batches[1:]:
            merged.extend(other)
        return merged

    @torch.no_grad()
    def _prefill_group(self, seqs: list[SequenceState]) -> RunningBatch:
        """Prefill a group of prompts (left-padded) and sample each row's first token."""
        t0 = time.perf_counter()
        dev = self.target.device
        lengths = torch.tensor([len(s.prompt) for s in seqs], device=dev)  # [n]
        width = int(lengths.max())
        ids = torch.zeros(len(seqs), width, dtype=torch.long, device=dev)
        for b, s in enumerate(seqs):
            ids[b, width - len(s.prompt) :] = torch.tensor(s.prompt, device=dev)
        slot = torch.arange(width, device=dev)[None, :]  # [1, W]
        pad = (width - lengths)[:, None]  # [n, 1]
        valid = slot >= pad  # [n, W]
        positions = (slot - pad).clamp(min=0)  # [n, W]
        kv = self.target.new_cache(len(seqs))
        logits, hidden = self.target.forward(ids, positions, kv, valid, logits_last=1)
        batch = RunningBatch(seqs, kv, dev)
        for b, s in enumerate(seqs):  # pairs of the prompt: (x_{j+1}, h_j), j < P-1
            s.record_pairs(hidden[b, width - len(s.prompt) : width - 1])
        batch.last_pos = lengths - 1
        probs = sampling_probs(logits, batch.temperature, batch.top_p)  # [n, 1, V]
        u = counter_uniforms(batch.seeds, batch.out_positions(1), STREAM_SAMPLE, dev)
        first = sample_from_probs(probs, u)  # [n, 1]
        logprobs = token_logprobs(logits, batch.temperature, first)
        ones = torch.ones(len(seqs), dtype=torch.long, device=dev)
        batch.commit(first, ones, logprobs, hidden[:, -1:])
        self._record(StepRecord("prefill", len(seqs), len(seqs), time.perf_counter() - t0))
        return batch

    def _decode_step(self, batch: RunningBatch) -> None:
        n = len(batch)
        if self.sd is not None and self.policy.observe(n):
            choice = self.policy.choose(n)
            # No use drafting past the longest remaining budget (the last token needs no draft).
            k = min(choice.draft_depth, int(batch.remaining().max()) - 1)
            if k >= 1:
                t0 = time.perf_counter()
                out = self.sd.step(batch, k)
                dt = time.perf_counter() - t0
                emitted = int(out.emitted.sum())
                self.policy.record(choice, emitted, dt)
                lengths = [int(a) + 1 for a in out.accepted]
                step = StepRecord(
                    "sd",
                    n,
                    emitted,
                    dt,
                    k,
                    k * n,
                    int(out.accepted.sum()),
                    lengths,
                    out.cut_by_stop,
                    out.cut_by_length,
                )
                self._record(step)
                return
        elif batch.draft_kv is not None:
            SpeculativeDecoder.deactivate(batch)
        self._plain_step(batch)

    @torch.no_grad()
    def _plain_step(self, batch: RunningBatch) -> None:
        """One token per row from the target."""
        t0 = time.perf_counter()
        n, dev = len(batch), batch.device
        ones = torch.ones(n, 1, dtype=torch.bool, device=dev)
        logits, hidden = self.target.forward(
            batch.last_token[:, None], batch.last_pos[:, None], batch.kv, ones
        )  # [B, 1, V], [B, 1, H]
        probs = sampling_probs(logits, batch.temperature, batch.top_p)
        u = counter_uniforms(batch.seeds, batch.out_positions(1), STREAM_SAMPLE, dev)
        tokens = sample_from_probs(probs, u)  # [B, 1]
        logprobs = token_logprobs(logits, batch.temperature, tokens)
        batch.commit(tokens, torch.ones(n, dtype=torch.long, device=dev), logprobs, hidden)
        self._record(StepRecord("plain", n, n, time.perf_counter() - t0))

    def _retire(self, batch: RunningBatch | None) -> RunningBatch | None:
        """Drop finished rows; compact caches that carry too much waste."""
        if batch is None:
            return None
        keep = [i for i, s in enumerate(batch.seqs) if s.finish_reason is None]
        if not keep:
            return None
        if len(keep) < len(batch):
            batch.select(keep)
        batch.kv.maybe_compact(self.config.compact_min_waste)
        if batch.draft_kv is not None:
            batch.draft_kv.maybe_compact(self.config.compact_min_waste)
        return batch
