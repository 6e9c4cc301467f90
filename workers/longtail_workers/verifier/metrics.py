"""The verifier's Prometheus collectors, built from the shared specs in ``longtail_api.metrics``.

Created once per :class:`~longtail_workers.verifier.server.VerifierServer`, each on its own
``CollectorRegistry`` (not the process-global default), so several servers can run in one
process (tests, local mode) without "duplicated timeseries" errors. The server calls
:meth:`VerifierMetrics.observe_request` for every request and the verify endpoint
:meth:`VerifierMetrics.observe_batch` for every scored batch; ``GET /metrics`` serves the
registry (``httpserver.probe_routes``).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.process_collector import ProcessCollector

from longtail_api import metrics as names
from longtail_workers.metricspec import counter_from_spec, gauge_from_spec, histogram_from_spec
from longtail_workers.rewards import RewardResult

# Re-exported for the callers that imported them from here before metricspec.py existed.
__all__ = ["VerifierMetrics", "counter_from_spec", "gauge_from_spec", "histogram_from_spec"]


class VerifierMetrics:
    """All verifier metrics on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None, *, process: bool = True) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        if process:
            # CPU, memory and open-fd metrics of this process, on our registry only.
            ProcessCollector(registry=self.registry)
        reg = self.registry
        self.requests = counter_from_spec(names.VERIFIER_REQUESTS_TOTAL, reg)
        self.duration = histogram_from_spec(names.VERIFIER_REQUEST_DURATION_SECONDS, reg)
        self.batch_size = histogram_from_spec(names.VERIFIER_BATCH_SIZE, reg)
        self.scored = counter_from_spec(names.VERIFIER_ITEMS_SCORED_TOTAL, reg)
        self.correct = counter_from_spec(names.VERIFIER_ITEMS_CORRECT_TOTAL, reg)
        self.unformatted = counter_from_spec(names.VERIFIER_ITEMS_UNFORMATTED_TOTAL, reg)
        self.reward = histogram_from_spec(names.VERIFIER_REWARD, reg)

    def observe_request(self, endpoint: str, code: int, seconds: float) -> None:
        """Count one HTTP request and record its latency."""
        self.requests.labels(endpoint=endpoint, code=str(code)).inc()
        self.duration.labels(endpoint=endpoint).observe(seconds)

    def observe_batch(self, reward_name: str, results: Sequence[RewardResult]) -> None:
        """Record one scored batch: its size and every item's reward and outcome."""
        self.batch_size.observe(len(results))
        histogram = self.reward.labels(reward=reward_name)
        correct = formatted = 0
        for result in results:
            histogram.observe(result.reward)
            correct += result.correct
            formatted += result.formatted
        self.scored.labels(reward=reward_name).inc(len(results))
        self.correct.labels(reward=reward_name).inc(correct)
        unformatted = len(results) - formatted
        self.unformatted.labels(reward=reward_name).inc(unformatted)
