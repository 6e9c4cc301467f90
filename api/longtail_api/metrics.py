"""The one list of Prometheus metric names shared by workers, the operator and dashboards.

Workers create their collectors from the :class:`MetricSpec` entries here (so a name, its type,
help text and labels are written once), the operator reads the same names when it scrapes
worker ``/metrics``, and the Grafana dashboards and alert rules query them. Every name starts
with ``longtail_``; counters end in ``_total`` and durations in ``_seconds`` as Prometheus
naming conventions ask. Renaming a metric here is a breaking change for dashboards.

Pure module: standard library only. Add new roles' metrics as new sections below and list
them in :data:`ALL_METRICS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PREFIX = "longtail_"
"""Prefix of every Longtail metric name."""

MetricKind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class MetricSpec:
    """Name, type, help text and label names of one metric."""

    name: str
    """Full exposition name, e.g. ``longtail_verifier_requests_total``."""
    kind: MetricKind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    """Histogram bucket upper bounds; ``None`` for counters, gauges and default buckets."""


# Label names used across metrics.
LABEL_ENDPOINT = "endpoint"
"""HTTP path of a known endpoint (``/v1/verify``), or ``other`` for unknown paths."""
LABEL_CODE = "code"
"""HTTP status code as a string, e.g. ``200``, ``413``."""
LABEL_REWARD = "reward"
"""Reward function name, e.g. ``math``."""

# --- verifier -----------------------------------------------------------------------------

VERIFIER_REQUESTS_TOTAL = MetricSpec(
    name="longtail_verifier_requests_total",
    kind="counter",
    help="HTTP requests handled by the verifier, by endpoint and status code.",
    labels=(LABEL_ENDPOINT, LABEL_CODE),
)
VERIFIER_REQUEST_DURATION_SECONDS = MetricSpec(
    name="longtail_verifier_request_duration_seconds",
    kind="histogram",
    help="Time from reading a request to sending its response, by endpoint.",
    labels=(LABEL_ENDPOINT,),
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
VERIFIER_BATCH_SIZE = MetricSpec(
    name="longtail_verifier_batch_size",
    kind="histogram",
    help="Items per accepted /v1/verify request.",
    buckets=(1, 4, 16, 64, 256, 1024, 4096, 16384),
)
VERIFIER_ITEMS_SCORED_TOTAL = MetricSpec(
    name="longtail_verifier_items_scored_total",
    kind="counter",
    help="Answers scored, by reward function.",
    labels=(LABEL_REWARD,),
)
VERIFIER_ITEMS_CORRECT_TOTAL = MetricSpec(
    name="longtail_verifier_items_correct_total",
    kind="counter",
    help="Answers scored as correct, by reward function.",
    labels=(LABEL_REWARD,),
)
VERIFIER_ITEMS_UNFORMATTED_TOTAL = MetricSpec(
    name="longtail_verifier_items_unformatted_total",
    kind="counter",
    help="Answers with no well-formed final answer (no box, no 'Answer:' line), by reward.",
    labels=(LABEL_REWARD,),
)
VERIFIER_REWARD = MetricSpec(
    name="longtail_verifier_reward",
    kind="histogram",
    help="Distribution of per-item rewards, by reward function (sum/count give the mean).",
    labels=(LABEL_REWARD,),
    buckets=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
)

VERIFIER_METRICS: tuple[MetricSpec, ...] = (
    VERIFIER_REQUESTS_TOTAL,
    VERIFIER_REQUEST_DURATION_SECONDS,
    VERIFIER_BATCH_SIZE,
    VERIFIER_ITEMS_SCORED_TOTAL,
    VERIFIER_ITEMS_CORRECT_TOTAL,
    VERIFIER_ITEMS_UNFORMATTED_TOTAL,
    VERIFIER_REWARD,
)
"""Everything the verifier exports."""

ALL_METRICS: tuple[MetricSpec, ...] = VERIFIER_METRICS
"""Every Longtail metric; dashboards and tests check names against this."""
