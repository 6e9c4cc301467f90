"""Prometheus collectors built from the shared metric specs (``longtail_api.metrics``).

The one way a worker turns a :class:`~longtail_api.metrics.MetricSpec` into a registered
``prometheus_client`` collector, so a metric's name, type, help text, labels and buckets are
written once, in the shared package. Called by every worker role's metrics: the engine
(``engine/stats.py``), the rollout worker's control surface (``rollout/metrics.py``), the
verifier, the trainer and the dedicated drafter worker. Each caller passes its own
``CollectorRegistry`` (several servers can live in one process, as in tests and local mode).
Scrape-time collectors (values read from live state at each scrape) build their families with
:func:`gauge_family`, :func:`counter_family` and :func:`histogram_family`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.utils import floatToGoString

from longtail_api.metrics import MetricSpec

_go_float: Callable[[float], str] = floatToGoString  # how prometheus_client writes ``le``


def counter_from_spec(spec: MetricSpec, registry: CollectorRegistry) -> Counter:
    """Create and register the counter that ``spec`` describes."""
    _check_kind(spec, "counter")
    return Counter(spec.name, spec.help, spec.labels, registry=registry)


def gauge_from_spec(spec: MetricSpec, registry: CollectorRegistry) -> Gauge:
    """Create and register the gauge that ``spec`` describes."""
    _check_kind(spec, "gauge")
    return Gauge(spec.name, spec.help, spec.labels, registry=registry)


def histogram_from_spec(spec: MetricSpec, registry: CollectorRegistry) -> Histogram:
    """Create and register the histogram that ``spec`` describes (its buckets, if it has any)."""
    _check_kind(spec, "histogram")
    if spec.buckets is None:
        return Histogram(spec.name, spec.help, spec.labels, registry=registry)
    return Histogram(spec.name, spec.help, spec.labels, registry=registry, buckets=spec.buckets)


def _check_kind(spec: MetricSpec, kind: str) -> None:
    if spec.kind != kind:
        raise ValueError(f"metric {spec.name}: is a {spec.kind}, not a {kind}")


def gauge_family(spec: MetricSpec, value: float | None = None) -> GaugeMetricFamily:
    """A scrape-time gauge family of ``spec``: its one sample ``value`` when it has no labels,
    else empty for the caller's ``add_metric`` calls."""
    _check_kind(spec, "gauge")
    if value is not None:
        return GaugeMetricFamily(spec.name, spec.help, value)
    return GaugeMetricFamily(spec.name, spec.help, labels=list(spec.labels) or None)


def counter_family(spec: MetricSpec) -> CounterMetricFamily:
    """A scrape-time counter family of ``spec``, empty for the caller's ``add_metric`` calls."""
    _check_kind(spec, "counter")
    # CounterMetricFamily appends "_total" itself; the spec holds the full exposition name.
    name = spec.name.removesuffix("_total")
    return CounterMetricFamily(name, spec.help, labels=list(spec.labels) or None)


def histogram_family(spec: MetricSpec) -> HistogramMetricFamily:
    """A scrape-time histogram family of ``spec``, empty for :func:`add_histogram` calls."""
    _check_kind(spec, "histogram")
    if spec.buckets is None:
        raise ValueError(f"metric {spec.name}: a scrape-time histogram needs its buckets")
    return HistogramMetricFamily(spec.name, spec.help, labels=list(spec.labels) or None)


def add_histogram(
    family: HistogramMetricFamily,
    spec: MetricSpec,
    labels: list[str],
    counts: Mapping[int, int],
) -> None:
    """Add one labelled histogram to ``family`` from ``counts`` (observed value -> how many
    times), bucketed by ``spec.buckets`` as a live ``Histogram`` would have."""
    assert spec.buckets is not None
    cumulative = [
        (_go_float(bound), float(sum(c for v, c in counts.items() if v <= bound)))
        for bound in spec.buckets
    ]
    total = float(sum(counts.values()))
    total_sum = float(sum(v * c for v, c in counts.items()))
    family.add_metric(labels, [*cumulative, ("+Inf", total)], total_sum)
