"""Rollout statistics: per-step records, cumulative counters, and their Prometheus metrics.

The native torch engine records one :class:`StepRecord` per step (prefill, plain or speculative)
into :class:`RolloutStats` (plain Python, what the worker's status endpoint, each generate
reply's figures, :meth:`RolloutStats.since`, and the run summary read) and, when a registry was
given, into :class:`RolloutMetrics`; the vLLM engine adds per-sequence totals per batch instead
(:meth:`RolloutStats.add_sequences`). "Accepted length" is the number of tokens one sequence
gains in one speculative step: accepted draft tokens plus the correction/bonus token (so 1 means
every draft was rejected); acceptance rate is accepted drafts / proposed drafts. Speculative
steps are also split by what drafted each row (``longtail_api.policies.DRAFT_SOURCES``:
``learned`` or ``history``; a ``hybrid`` step drafts each row from one of them).

The metrics' names, help texts, labels and buckets are the shared specs in
``longtail_api.metrics`` (the rollout engine section), which dashboards and alerts refer to.
"""

from __future__ import annotations

import copy
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client import CollectorRegistry

from longtail_api import metrics as names
from longtail_workers.metricspec import counter_from_spec, gauge_from_spec, histogram_from_spec

# Short names of the shared specs' exposition names (tests and benchmarks read samples by them).
METRIC_DECODE_STEPS = names.ROLLOUT_DECODE_STEPS_TOTAL.name
METRIC_GENERATED_TOKENS = names.ROLLOUT_GENERATED_TOKENS_TOTAL.name
METRIC_DRAFT_TOKENS = names.ROLLOUT_DRAFT_TOKENS_TOTAL.name
METRIC_ACCEPTED_DRAFT_TOKENS = names.ROLLOUT_ACCEPTED_DRAFT_TOKENS_TOTAL.name
METRIC_ACCEPTED_LENGTH = names.ROLLOUT_ACCEPTED_LENGTH.name
METRIC_ACCEPTANCE_RATE = names.ROLLOUT_ACCEPTANCE_RATE.name
ALL_METRICS = names.ROLLOUT_METRIC_NAMES

StepMode = Literal["sd", "plain", "prefill"]


def batch_bucket(running: int) -> int:
    """The power of two at or above ``running`` (1, 2, 4, ...): a running-batch-size bucket."""
    return 1 << max(0, running - 1).bit_length()


@dataclass(kw_only=True)
class StepRecord:
    """What one engine step did (built by keyword: most fields are counts of one kind or another,
    and a positional call would let two of them swap silently)."""

    mode: StepMode
    batch_size: int
    emitted_tokens: int
    latency_s: float
    draft_depth: int = 0
    drafted_tokens: int = 0
    accepted_drafts: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    """Per row of an SD step: accepted drafts + 1 (before stop/length truncation)."""
    cut_by_stop: int = 0
    """Rows of an SD step whose accepted run was cut after a stop token."""
    cut_by_length: int = 0
    """Rows of an SD step whose accepted run was cut at max_new_tokens."""
    source_tokens: dict[str, int] = field(default_factory=dict)
    """Tokens committed in an SD step by the rows each draft source drafted."""
    source_accepted_lengths: dict[str, list[int]] = field(default_factory=dict)
    """``accepted_lengths`` split by the draft source of each row."""
    history_propose_s: float = 0.0
    """Host seconds spent on history proposals in this step (part of ``latency_s``)."""
    history_rows: int = 0
    """Rows history proposals were built for in this step."""

    @classmethod
    def speculative(
        cls,
        *,
        latency_s: float,
        depth: int,
        keep: Sequence[int],
        accepted: Sequence[int],
        stopped: Sequence[bool],
        sources: Sequence[str],
        history_propose_s: float = 0.0,
        history_rows: int = 0,
    ) -> StepRecord:
        """The record of an SD step of depth ``depth`` from its per-row results: tokens
        committed, drafts accepted, whether a stop token ended the row, the row's draft source
        (and the host cost of the history proposals, for how many rows)."""
        n = len(keep)
        lengths = [int(a) + 1 for a in accepted]
        cut = [int(kp) < a for kp, a in zip(keep, lengths, strict=True)]
        by_stop = sum(1 for c, st in zip(cut, stopped, strict=True) if c and st)
        source_tokens: dict[str, int] = {}
        source_lengths: dict[str, list[int]] = {}
        for src, kp, length in zip(sources, keep, lengths, strict=True):
            source_tokens[src] = source_tokens.get(src, 0) + int(kp)
            source_lengths.setdefault(src, []).append(length)
        return cls(
            mode="sd",
            batch_size=n,
            emitted_tokens=sum(int(kp) for kp in keep),
            latency_s=latency_s,
            draft_depth=depth,
            drafted_tokens=depth * n,
            accepted_drafts=sum(lengths) - n,
            accepted_lengths=lengths,
            cut_by_stop=by_stop,
            cut_by_length=sum(cut) - by_stop,
            source_tokens=source_tokens,
            source_accepted_lengths=source_lengths,
            history_propose_s=history_propose_s,
            history_rows=history_rows,
        )


_SUMS = (
    "steps", "sd_steps", "plain_steps", "prefill_steps", "tokens", "sd_tokens", "drafted",
    "accepted", "time_s", "sd_time_s", "sd_cut_by_stop", "sd_cut_by_length",
    "history_propose_s", "history_proposals",
)  # fmt: skip
"""The plain-number fields of :class:`RolloutStats` that add up (what :meth:`~RolloutStats.since`
subtracts; the histograms and buckets are subtracted key by key)."""


@dataclass
class RolloutStats:
    """Cumulative counters over an engine's life (or since :meth:`reset`)."""

    steps: int = 0
    sd_steps: int = 0
    plain_steps: int = 0
    prefill_steps: int = 0
    tokens: int = 0
    sd_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    time_s: float = 0.0
    sd_time_s: float = 0.0
    max_batch_size: int = 0
    sd_cut_by_stop: int = 0
    sd_cut_by_length: int = 0
    accepted_length_hist: Counter[int] = field(default_factory=Counter)
    bucket_seconds: defaultdict[tuple[StepMode, int], float] = field(
        default_factory=lambda: defaultdict(float)
    )
    """Step seconds by (mode, :func:`batch_bucket` of the running batch); prefill under 0.
    Where the time goes as the batch drains: what ``bench/specdec.py`` breaks down."""
    bucket_tokens: Counter[tuple[StepMode, int]] = field(default_factory=Counter)
    """Committed tokens, keyed like :attr:`bucket_seconds`."""
    source_sd_tokens: Counter[str] = field(default_factory=Counter)
    """SD tokens by the draft source of the rows that committed them (``learned``,
    ``history``): the token share of each drafter."""
    source_accepted_hist: defaultdict[str, Counter[int]] = field(
        default_factory=lambda: defaultdict(Counter)
    )
    """Accepted-length histogram per draft source."""
    history_propose_s: float = 0.0
    """Host seconds spent building history proposals (the history drafter's cost)."""
    history_proposals: int = 0
    """Rows history proposals were built for (one per row of each history or hybrid step)."""
    last: StepRecord | None = None

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    def copy(self) -> RolloutStats:
        """An independent copy: the ``before`` that :meth:`since` is later given."""
        return copy.deepcopy(self)

    def since(self, before: RolloutStats) -> RolloutStats:
        """What was counted after ``before`` (an earlier :meth:`copy` of these stats): every
        counter, histogram and bucket is the difference, so the result reads like the stats of
        the later steps alone; ``max_batch_size`` and ``last`` are not sums and are taken as
        they are now. Counters only grow, so no difference is negative (unless :meth:`reset`
        ran in between, which no caller of this does)."""
        out = RolloutStats(max_batch_size=self.max_batch_size, last=self.last)
        for name in _SUMS:
            setattr(out, name, getattr(self, name) - getattr(before, name))
        out.accepted_length_hist = self.accepted_length_hist - before.accepted_length_hist
        out.bucket_tokens = self.bucket_tokens - before.bucket_tokens
        out.source_sd_tokens = self.source_sd_tokens - before.source_sd_tokens
        for key, seconds in self.bucket_seconds.items():
            was = before.bucket_seconds.get(key, 0.0)
            if seconds != was:
                out.bucket_seconds[key] = seconds - was
        for source, hist in self.source_accepted_hist.items():
            delta = hist - before.source_accepted_hist.get(source, Counter())
            if delta:
                out.source_accepted_hist[source] = delta
        return out

    def record(self, step: StepRecord) -> None:
        self.steps += 1
        self.tokens += step.emitted_tokens
        self.time_s += step.latency_s
        key = (step.mode, 0 if step.mode == "prefill" else batch_bucket(step.batch_size))
        self.bucket_seconds[key] += step.latency_s
        self.bucket_tokens[key] += step.emitted_tokens
        if step.mode != "prefill":
            self.max_batch_size = max(self.max_batch_size, step.batch_size)
        if step.mode == "sd":
            self.sd_steps += 1
            self.sd_tokens += step.emitted_tokens
            self.sd_time_s += step.latency_s
            self.drafted += step.drafted_tokens
            self.accepted += step.accepted_drafts
            self.accepted_length_hist.update(step.accepted_lengths)
            self.sd_cut_by_stop += step.cut_by_stop
            self.sd_cut_by_length += step.cut_by_length
            self.source_sd_tokens.update(step.source_tokens)
            for src, lengths in step.source_accepted_lengths.items():
                self.source_accepted_hist[src].update(lengths)
            self.history_propose_s += step.history_propose_s
            self.history_proposals += step.history_rows
        elif step.mode == "plain":
            self.plain_steps += 1
        else:
            self.prefill_steps += 1
        self.last = step

    def add_sequences(
        self,
        *,
        tokens: int,
        sd_tokens: int,
        drafted: int,
        accepted_lengths: list[int],
        seconds: float,
        batch_size: int,
        steps: int,
        sd_steps: int,
    ) -> None:
        """Add one batch of an engine that reports per-sequence totals, not per-step records
        (vLLM through ``LLM.generate``): ``accepted_lengths`` holds every verify step of every
        sequence; ``steps`` and ``sd_steps`` are the most decode iterations and verify steps
        any one sequence went through (lower bounds on the engine's own step counts)."""
        self.steps += steps
        self.sd_steps += sd_steps
        self.plain_steps += steps - sd_steps
        self.tokens += tokens
        self.sd_tokens += sd_tokens
        self.time_s += seconds
        self.drafted += drafted
        self.accepted += sum(n - 1 for n in accepted_lengths)
        self.accepted_length_hist.update(accepted_lengths)
        self.source_sd_tokens["learned"] += sd_tokens  # vLLM drafts with the learned drafter
        self.source_accepted_hist["learned"].update(accepted_lengths)
        self.max_batch_size = max(self.max_batch_size, batch_size)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        n = sum(self.accepted_length_hist.values())
        return sum(k * c for k, c in self.accepted_length_hist.items()) / n if n else 0.0

    def source_mean_accepted_length(self, source: str) -> float:
        """Mean accepted length of the rows ``source`` drafted (0 when none)."""
        hist = self.source_accepted_hist.get(source, Counter())
        n = sum(hist.values())
        return sum(k * c for k, c in hist.items()) / n if n else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.time_s if self.time_s > 0 else 0.0

    def snapshot(self) -> dict[str, object]:
        """Plain-data view for status endpoints and summaries."""
        return {
            "steps": self.steps,
            "sd_steps": self.sd_steps,
            "plain_steps": self.plain_steps,
            "prefill_steps": self.prefill_steps,
            "tokens": self.tokens,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "tokens_per_second": self.tokens_per_second,
            "max_batch_size": self.max_batch_size,
            "accepted_length_hist": dict(sorted(self.accepted_length_hist.items())),
            "sd_active": self.last is not None and self.last.mode == "sd",
            "running": self.last.batch_size if self.last else 0,
        }


class RolloutMetrics:
    """Prometheus view of the same numbers, registered in the registry passed in (one collector
    per spec of ``longtail_api.metrics.ROLLOUT_ENGINE_METRICS``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.steps = counter_from_spec(names.ROLLOUT_DECODE_STEPS_TOTAL, registry)
        self.tokens = counter_from_spec(names.ROLLOUT_GENERATED_TOKENS_TOTAL, registry)
        self.drafted = counter_from_spec(names.ROLLOUT_DRAFT_TOKENS_TOTAL, registry)
        self.accepted = counter_from_spec(names.ROLLOUT_ACCEPTED_DRAFT_TOKENS_TOTAL, registry)
        self.accepted_length = histogram_from_spec(names.ROLLOUT_ACCEPTED_LENGTH, registry)
        self.step_seconds = histogram_from_spec(names.ROLLOUT_STEP_SECONDS, registry)
        self.running = gauge_from_spec(names.ROLLOUT_RUNNING_SEQUENCES, registry)
        self.waiting = gauge_from_spec(names.ROLLOUT_WAITING_SEQUENCES, registry)
        self.sd_active = gauge_from_spec(names.ROLLOUT_SD_ACTIVE, registry)
        self.draft_depth = gauge_from_spec(names.ROLLOUT_DRAFT_DEPTH, registry)
        self.tokens_per_second = gauge_from_spec(names.ROLLOUT_TOKENS_PER_SECOND, registry)
        self.acceptance_rate = gauge_from_spec(names.ROLLOUT_ACCEPTANCE_RATE, registry)

    def observe_sequences(
        self,
        stats: RolloutStats,
        *,
        tokens: int,
        drafted: int,
        accepted_lengths: list[int],
        seconds: float,
    ) -> None:
        """The Prometheus side of :meth:`RolloutStats.add_sequences` (vLLM engine)."""
        self.tokens.inc(tokens)
        self.drafted.inc(drafted)
        self.accepted.inc(sum(n - 1 for n in accepted_lengths))
        for n in accepted_lengths:
            self.accepted_length.observe(n)
        self.running.set(0)
        if seconds > 0:
            self.tokens_per_second.set(tokens / seconds)
        self.acceptance_rate.set(stats.acceptance_rate)

    def observe(self, step: StepRecord, stats: RolloutStats, waiting: int) -> None:
        self.steps.labels(mode=step.mode).inc()
        self.tokens.inc(step.emitted_tokens)
        self.step_seconds.labels(mode=step.mode).observe(step.latency_s)
        self.running.set(step.batch_size)
        self.waiting.set(waiting)
        if step.mode != "prefill":
            self.sd_active.set(1 if step.mode == "sd" else 0)
        if step.latency_s > 0:
            self.tokens_per_second.set(step.emitted_tokens / step.latency_s)
        if step.mode == "sd":
            self.drafted.inc(step.drafted_tokens)
            self.accepted.inc(step.accepted_drafts)
            self.draft_depth.set(step.draft_depth)
            for n in step.accepted_lengths:
                self.accepted_length.observe(n)
            self.acceptance_rate.set(stats.acceptance_rate)
