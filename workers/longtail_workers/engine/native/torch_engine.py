"""The native torch rollout engine: batched generation over static buffers with adaptive SD.

Used by the rollout worker on CPU (tests, local mode) and for the long tail on GPUs; it
implements :class:`~longtail_workers.engine.interface.RolloutEngine`. The loop, per iteration:

1. admit waiting prompts into free rows (``rows.py``: the running batch lives in static device
   buffers) and prefill them in length groups, sampling each row's first token;
2. ask the SD policy whether this step speculates (running count vs threshold, warm-up latch)
   and with which strategy (per batch-size bucket): what drafts (the learned drafter, the
   history index, or per row either: ``hybrid``) and how deep;
3. run one decode step (one token per row, ``steps.decode``) or one speculative step
   (``specdec.py``; ``history_drafts.py`` for history drafts, staged on the host from the
   committed tokens), padded to a batch bucket and, on CUDA, replayed from a captured graph
   (``graphs.py``); the step's results come back in one device->host copy;
4. retire finished rows (stop token or ``max_new_tokens``): the last live rows move into their
   slots, so the live rows stay packed at the top.

The history index (``history.py``) lives as long as the engine: every answer's committed tokens
go into it after each step, so later answers to the same prompt (in this call and later ones)
can draft from them. An engine without a learned drafter speculates with its ``history``
strategies alone (``engine/sd_policy.py`` skips the others until :meth:`TorchEngine.set_drafter`).

Sampling uses counter-based per-request random streams (``engine/sampling.py``): a request's tokens
do not depend on which requests share the batch, as long as SD's on/off schedule is the same (SD
consumes randomness differently; its output distribution is the target's either way). Floating
point results of batched matmuls can differ in the last bits with batch composition; with
float32 models that can flip a near-tie, which is why the exactness tests run in float64.
"""

from __future__ import annotations

import copy
import secrets
import time
from collections.abc import Sequence

import torch
from torch import nn

from longtail_api.policies import SpeculativeSpec
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.interface import GenerationRequest, GenerationResult, RolloutEngine
from longtail_workers.engine.native.batch import SequenceState
from longtail_workers.engine.native.config import LENGTH_ROUNDING
from longtail_workers.engine.native.config import EngineConfig as EngineConfig  # re-exported
from longtail_workers.engine.native.graphs import DEFAULT_BUCKETS, StepGraphs, bucket_for
from longtail_workers.engine.native.history import HistoryIndex
from longtail_workers.engine.native.history_drafts import HistoryDrafts
from longtail_workers.engine.native.rows import RowShape, RowState
from longtail_workers.engine.native.scheduler import Scheduler, length_groups
from longtail_workers.engine.native.sd_step import speculative_step
from longtail_workers.engine.native.sizing import Limits, Needs, row_shape
from longtail_workers.engine.native.specdec import DraftObserver, SpeculativeDecoder, same_layout
from longtail_workers.engine.native.steps import HostStep, StepShape, pack, unpack
from longtail_workers.engine.native.steps import decode as decode_step
from longtail_workers.engine.native.steps import prefill as prefill_step
from longtail_workers.engine.rejection import AcceptanceRule, rejection_sample
from longtail_workers.engine.sd_policy import SpecDecodePolicy, StrategyChoice
from longtail_workers.engine.stats import RolloutMetrics, RolloutStats, StepRecord
from longtail_workers.engine.target import TargetModel
from longtail_workers.kvcache.slot_attention import choose_backend
from longtail_workers.kvcache.slots import SlotKVCache


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
        self.config.validate()
        self.target = TargetModel(model)
        self.spec = speculative or SpeculativeSpec(enabled=False)
        self.policy = SpecDecodePolicy(self.spec, seed=self.config.policy_seed)
        if self.spec.enabled and drafter is None and not self.policy.eligible(learned=False):
            raise ValueError(
                "speculative.enabled is true but no drafter was given and no strategy the "
                "selector may pick drafts from history; pass drafter=EagleDrafter(model, "
                "target_id=...) (or load_drafter(...)), add a strategy with drafter: history, "
                "or set speculative.enabled=false"
            )
        kinds = {s.drafter for s in self.spec.strategies}
        self.history = (
            HistoryIndex(self.spec.history)
            if self.spec.enabled and kinds & {"history", "hybrid"}
            else None
        )
        """The history drafter's index (None without history or hybrid strategies)."""
        self._drafts: HistoryDrafts | None = None
        self._rule = acceptance_rule
        self._observer = draft_observer
        self.backend = choose_backend(
            self.config.attention_backend, self.target.device, self.target.dtype
        )
        self.sd: SpeculativeDecoder | None = None
        if drafter is not None:
            self.set_drafter(drafter)
        self.stats = RolloutStats()
        self.metrics = metrics
        self._scheduler: Scheduler | None = None
        self._rows: RowState | None = None
        self._graphs: StepGraphs | None = None
        self.row_shape: RowShape | None = None
        """Shape of the most recently allocated static buffers (``rows.py``)."""
        self.buffer_bytes = 0
        """Bytes of those buffers (KV caches, hidden-state and token stores)."""
        self.running = 0
        """Sequences in the running batch right now (for a worker's status endpoint)."""

    def set_drafter(self, drafter: EagleDrafter) -> None:
        """Use ``drafter`` from the next :meth:`generate` on (a new drafter version).

        The engine drafts with its own copy: a new version of the same layout is loaded into
        that copy's parameters in place, so the buffers and the captured graphs (which point at
        those parameters) stay valid; a different layout makes a new copy and drops them."""
        if drafter.info.hidden_size != self.target.hidden_size:
            raise ValueError(
                f"drafter hidden_size {drafter.info.hidden_size} != target hidden_size "
                f"{self.target.hidden_size}"
            )
        current = self.sd.drafter if self.sd is not None else None
        if current is not None and same_layout(current, drafter):
            with torch.no_grad():
                for name, value in drafter.state_dict().items():
                    current.state_dict()[name].copy_(value)
            return
        self.sd = SpeculativeDecoder(
            self.target,
            copy.deepcopy(drafter),  # shares the target's embedding and head (model.py)
            rule=self._rule,
            context_window=self.config.drafter_context_window,
            observer=self._observer,
        )
        self._rows, self._graphs = None, None  # the graphs point at the old copy's weights

    @property
    def drafter(self) -> EagleDrafter | None:
        """The engine's own copy of the drafter it drafts with, or ``None`` (no learned drafter)."""
        return self.sd.drafter if self.sd is not None else None

    @property
    def waiting(self) -> int:
        return self._scheduler.waiting if self._scheduler is not None else 0

    def policy_loaded(self) -> None:
        """New policy weights: the history index forgets earlier calls if so configured."""
        if self.history is not None:
            self.history.new_policy()

    @property
    def speculating(self) -> bool:
        """SD may run: it is enabled and some strategy can draft (a learned drafter is there,
        or a history strategy may be picked)."""
        return self.spec.enabled and (
            self.sd is not None or bool(self.policy.eligible(learned=False))
        )

    @property
    def _learned(self) -> bool:
        """A learned drafter runs in SD steps (its cache and the hidden states are kept)."""
        return self.sd is not None and self.speculating

    @property
    def max_depth(self) -> int:
        """Deepest draft the spec allows (0 without SD)."""
        if not self.speculating:
            return 0
        return max(s.draft_depth for s in self.spec.strategies)

    def _new_sequence(self, index: int, request: GenerationRequest) -> SequenceState:
        prompt = [int(t) for t in request.prompt_token_ids]
        return SequenceState(
            index=index,
            request=request,
            seed=request.seed if request.seed is not None else secrets.randbits(63),
            keep_hidden=self._learned or request.return_hidden_states,
            prompt=prompt,
            history=self.history.admit(prompt) if self.history is not None else None,
        )

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Complete every request (see :class:`RolloutEngine`); results in request order."""
        for r in requests:
            r.validate(self.target.vocab_size, self.target.max_positions)
        if self.history is not None:
            self.history.begin_call()
        seqs = [self._new_sequence(i, r) for i, r in enumerate(requests)]
        rows = self._rows_for(seqs)
        self._scheduler = Scheduler(rows.shape.capacity, self.config.max_prefill_tokens)
        self._scheduler.add(seqs)
        self.policy.reset()
        while self._scheduler.waiting or len(rows):
            admitted = self._scheduler.admit(len(rows))
            if admitted:
                self._prefill(rows, admitted)
            self._retire(rows)
            if len(rows):
                self._decode_step(rows)
                self._retire(rows)
            self.running = len(rows)
        return [s.result() for s in seqs]

    def _record(self, step: StepRecord) -> None:
        self.stats.record(step)
        if self.metrics is not None:
            self.metrics.observe(step, self.stats, self.waiting)

    # -- buffers ---------------------------------------------------------------------------------

    def _buckets(self) -> tuple[int, ...] | None:
        if self.config.batch_buckets is not None:
            return tuple(sorted(self.config.batch_buckets))
        graphs = self.config.cuda_graphs and self.target.device.type == "cuda"
        return DEFAULT_BUCKETS if graphs else None

    def _bytes_per_slot(self, hidden: bool) -> int:
        """Bytes one slot of one row takes: target KV, token store, hidden store (if kept) and
        the drafter's KV (if any)."""
        t = self.target
        per = SlotKVCache.bytes_per_token(t.config, t.dtype) + 8
        if hidden:
            per += t.hidden_size * t.dtype.itemsize
        if self.sd is not None and self._learned:
            per += SlotKVCache.bytes_per_token(self.sd.drafter.config, t.dtype, num_layers=1)
        return per

    def _rows_for(self, seqs: list[SequenceState]) -> RowState:
        """The static buffers for this call: the current ones when they cover it, else new."""
        needs = Needs(
            requests=len(seqs),
            longest=max((len(s.prompt) + s.request.max_new_tokens for s in seqs), default=1),
            stops=max((len(s.request.stop_token_ids) for s in seqs), default=1),
            hidden=any(s.keep_hidden for s in seqs),
            drafter=self._learned,
            depth=self.max_depth,
        )
        limits = Limits(
            max_running=self.config.max_running,
            max_model_len=self.config.max_model_len,
            kv_cache_gb=self.config.kv_cache_gb,
            buckets=self._buckets(),
            rounding=LENGTH_ROUNDING,
            bytes_per_slot=self._bytes_per_slot(needs.hidden),
        )
        shape = row_shape(needs, limits)
        if self._rows is not None and self._rows.shape.covers(shape):
            return self._rows
        self._rows = self._graphs = None  # free the old buffers before making new ones
        t = self.target
        sd = self.sd
        draft_kv = sd.new_cache(shape.capacity, shape.length) if sd and shape.drafter else None
        rows = RowState(
            shape,
            t.new_cache(shape.capacity, shape.length),
            draft_kv,
            t.hidden_size,
            t.dtype,
            t.device,
        )
        self._rows = rows
        self.row_shape, self.buffer_bytes = shape, rows.nbytes
        if self.history is not None:
            self._drafts = HistoryDrafts(shape.capacity, max(self.max_depth, 1), t.device)
        self._graphs = StepGraphs(
            t.device, self.config.cuda_graphs, [rows.n_tok, rows.out_len, rows.drafter_done]
        )
        return rows

    def _shape(self, rows: RowState, ahead: int) -> StepShape:
        """Host facts of the next step; ``ahead``: slots past a row's length the step reaches."""
        n = len(rows)
        reqs = [s.request for s in rows.seqs]
        assert self._graphs is not None
        span = rows.length if self._graphs.capturing else int(rows.n_tok_h[:n].max()) + ahead
        return StepShape(
            span=min(span, rows.length),
            backend=self.backend,
            any_top_p=any(r.top_p < 1.0 for r in reqs),
            any_greedy=any(r.temperature <= 0 for r in reqs),
        )

    def _bucket(self, rows: RowState) -> int:
        buckets = self._buckets()
        n = len(rows)
        return n if buckets is None else bucket_for(n, buckets, rows.shape.capacity)

    # -- steps -----------------------------------------------------------------------------------

    def _apply(self, rows: RowState, r0: int, host: HostStep) -> None:
        """Copy a step's committed tokens of rows ``[r0, r0 + len(host.keep))`` to the host."""
        # Whole arrays to lists once: per-row NumPy slicing costs more than the copy itself.
        tokens, logprobs = host.tokens.tolist(), host.logprobs.tolist()
        stopped, finished = host.stopped.tolist(), host.finished.tolist()
        history = self.history
        for b, keep in enumerate(host.keep.tolist()):
            seq = rows.seqs[r0 + b]
            new = tokens[b][:keep]
            seq.output += new
            if history is not None and seq.history is not None:
                history.extend(seq.history, new)
            seq.logprobs += logprobs[b][:keep]
            if stopped[b]:
                seq.finish_reason = "stop"
            elif finished[b]:
                seq.finish_reason = "length"
        rows.observe(r0, host.keep)

    def _prefill(self, rows: RowState, seqs: list[SequenceState]) -> None:
        """Prefill admitted prompts in length groups (each group its own forward)."""
        lengths = [len(s.prompt) for s in seqs]
        for group in length_groups(lengths, self.config.prefill_split_cost):
            t0 = time.perf_counter()
            members = [seqs[i] for i in group]
            r0 = rows.admit(members)
            shape = self._shape(rows, 1)
            out = prefill_step(self.target, rows, r0, [len(s.prompt) for s in members], shape)
            self._apply(rows, r0, unpack(pack(out), len(members)))
            n = len(members)
            seconds = time.perf_counter() - t0
            self._record(
                StepRecord(mode="prefill", batch_size=n, emitted_tokens=n, latency_s=seconds)
            )

    def _decode_step(self, rows: RowState) -> None:
        n = len(rows)
        if self.speculating and self.policy.observe(n):
            choice = self.policy.choose(n, learned=self.sd is not None)
            # No use drafting past the longest remaining budget (the last token needs no draft).
            k = min(choice.draft_depth, int(rows.remaining().max()) - 1) if choice else 0
            if choice is not None and k >= 1:
                self._sd_step(rows, choice, k)
                return
        self._plain_step(rows)

    def _sd_step(self, rows: RowState, choice: StrategyChoice, k: int) -> None:
        """One speculative step with ``choice``'s drafter at depth ``k``, fed back and recorded."""
        t0 = time.perf_counter()
        kind, n = choice.drafter, len(rows)
        use: list[bool] = []
        if kind != "learned":  # proposals first: the step reads them from the static buffer
            assert self.history is not None and self._drafts is not None
            h = self.spec.history
            need = h.min_match if kind == "history" else h.hybrid_min_match
            use = self._drafts.stage(self.history, rows.seqs, k, need)
        t_propose = time.perf_counter() - t0
        width = self.max_depth + 1
        assert self._graphs is not None
        host = speculative_step(
            self.target, rows, self._graphs, self._shape(rows, width + 1), self._bucket(rows),
            kind, k, width, sd=self.sd, drafts=self._drafts, rule=self._rule,
            observer=self._observer,
        )  # fmt: skip
        self._apply(rows, 0, host)
        dt = time.perf_counter() - t0
        if not self._graphs.just_captured:  # a capture's seconds say nothing of k
            self.policy.record(choice, int(host.keep.sum()), dt)
        hybrid = ["history" if u else "learned" for u in use]
        self._record(
            StepRecord.speculative(
                latency_s=dt, depth=k, keep=host.keep.tolist(), accepted=host.accepted.tolist(),
                stopped=host.stopped.tolist(), sources=hybrid if kind == "hybrid" else [kind] * n,
                history_propose_s=t_propose if use else 0.0, history_rows=len(use),
            )
        )  # fmt: skip

    @torch.no_grad()
    def _plain_step(self, rows: RowState) -> None:
        """One token per row from the target."""
        t0 = time.perf_counter()
        n, bucket = len(rows), self._bucket(rows)
        shape = self._shape(rows, 1)
        assert self._graphs is not None
        key = ("decode", bucket, shape.any_top_p, shape.any_greedy)

        def step() -> torch.Tensor:
            return pack(decode_step(self.target, rows, bucket, shape))

        self._apply(rows, 0, unpack(self._graphs.run(key, step), n))
        seconds = time.perf_counter() - t0
        self._record(StepRecord(mode="plain", batch_size=n, emitted_tokens=n, latency_s=seconds))

    def _retire(self, rows: RowState) -> None:
        """Copy out finished rows' hidden states and drop them from the batch."""
        finished = [i for i, s in enumerate(rows.seqs) if s.finish_reason is not None]
        for i in finished:
            seq = rows.seqs[i]
            if self.history is not None and seq.history is not None:
                self.history.finish(seq.history)
            if seq.request.return_hidden_states and seq.output and rows.hidden is not None:
                first = len(seq.prompt) - 1  # h_{P-1} produced the first output token
                seq.hidden = rows.hidden[i, first : first + len(seq.output)].clone()
        rows.retire(finished)
