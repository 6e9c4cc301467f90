"""The type of one Prometheus metric's declaration: :class:`MetricSpec` (name, kind, help, labels,
buckets) and the name prefix every Longtail metric carries.

Pure module: standard library only. The declarations themselves are in ``metrics.py`` (which
re-exports these) and, for the rollout engine's collectors, ``enginemetrics.py``.
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
