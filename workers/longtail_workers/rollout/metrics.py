"""Prometheus view of a rollout worker: role, idleness, versions, buffer, spot trainer, and
speculation by draft source.

Registered by :class:`~longtail_workers.rollout.control.RolloutWorker` on its own
``CollectorRegistry`` (several workers can live in one process, as in tests and local mode).
:class:`WorkerCollector` reads the worker's state at scrape time, so the numbers exported are
exactly the ones ``GET /v1/status`` reports and nothing is counted twice. The role-info gauge
(``longtail_worker_role{role=...}``) lets dashboards join per-pod GPU metrics to activities.
Metric names and help texts come from ``longtail_api.metrics``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, get_args

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from longtail_api import metrics as names
from longtail_api.drafterstatus import SpotTrainerState
from longtail_workers.metricspec import (
    add_histogram,
    counter_family,
    counter_from_spec,
    gauge_family,
    histogram_family,
    histogram_from_spec,
)

if TYPE_CHECKING:
    from longtail_workers.rollout.control import RolloutWorker

TRAINER_STATES = get_args(SpotTrainerState)
ROLES = ("rollout", "drafter-train")


def role_switch_histogram(registry: CollectorRegistry) -> Histogram:
    return histogram_from_spec(names.WORKER_ROLE_SWITCH_SECONDS, registry)


def control_requests_counter(registry: CollectorRegistry) -> Counter:
    return counter_from_spec(names.WORKER_CONTROL_REQUESTS_TOTAL, registry)


class WorkerCollector(Collector):
    """Scrape-time gauges and counters from one :class:`RolloutWorker`."""

    def __init__(self, worker: RolloutWorker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        w = self.worker
        status = w.status()
        role = gauge_family(names.WORKER_ROLE)
        for r in ROLES:
            role.add_metric([r], 1.0 if r == status.role.observed else 0.0)
        yield role
        yield gauge_family(names.WORKER_GENERATING, 1.0 if status.generating else 0.0)
        yield gauge_family(names.WORKER_IDLE_SECONDS, status.idle_seconds or 0.0)
        for spec, value in (
            (names.POLICY_VERSION, status.versions.policy),
            (names.DRAFTER_VERSION, status.versions.drafter),
            (names.SPOT_BUFFER_TOKENS, w.buffer.num_tokens),
            (names.SPOT_BUFFER_BYTES, w.buffer.num_bytes),
        ):
            yield gauge_family(spec, float(value))
        yield from self._buffer_counters()
        yield from self._draft_sources()
        yield from self._trainer()
        weights = getattr(w, "weights", None)  # a generating worker's weight source
        if weights is not None:
            refused = counter_family(names.WORKER_WEIGHTS_REFUSED_TOTAL)
            refused.add_metric([], float(weights.refusals()))
            yield refused

    def _buffer_counters(self) -> Iterator[Metric]:
        buf = self.worker.buffer
        captured = counter_family(names.SPOT_BUFFER_CAPTURED_TOKENS_TOTAL)
        captured.add_metric([], float(buf.added_tokens))
        yield captured
        for spec, table in (
            (names.SPOT_BUFFER_DROPPED_TOTAL, buf.dropped),
            (names.SPOT_BUFFER_EVICTED_TOTAL, buf.evicted),
        ):
            family = counter_family(spec)
            for reason, count in sorted(dict(table).items()):
                family.add_metric([reason], float(count))
            yield family

    def _draft_sources(self) -> Iterator[Metric]:
        """SD tokens and accepted lengths by draft source, from the engine's own counters."""
        stats = self.worker.engine.stats
        tokens = counter_family(names.WORKER_SD_TOKENS_TOTAL)
        lengths = histogram_family(names.WORKER_ACCEPTED_LENGTH)
        for source in sorted(set(stats.source_sd_tokens) | set(stats.source_accepted_hist)):
            tokens.add_metric([source], float(stats.source_sd_tokens[source]))
            # Copied at once: the engine's thread adds to it while a scrape reads.
            table = stats.source_accepted_hist
            hist: dict[int, int] = dict(table[source]) if source in table else {}
            add_histogram(lengths, names.WORKER_ACCEPTED_LENGTH, [source], hist)
        yield tokens
        yield lengths

    def _trainer(self) -> Iterator[Metric]:
        trainer = self.worker.trainer
        if trainer is None:
            return
        status = trainer.status()
        steps = counter_family(names.SPOT_TRAIN_STEPS_TOTAL)
        steps.add_metric([], float(status.total_steps))
        yield steps
        state = gauge_family(names.SPOT_TRAINER_STATE)
        for s in TRAINER_STATES:
            state.add_metric([s], 1.0 if s == status.state else 0.0)
        yield state
        if status.last_loss is not None:
            spec = names.SPOT_TRAIN_LOSS
            yield gauge_family(spec, status.last_loss)
        if trainer.stop_latencies:
            spec = names.SPOT_STOP_LATENCY_SECONDS
            yield gauge_family(spec, trainer.stop_latencies[-1])
