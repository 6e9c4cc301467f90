"""The shared metric-name list is complete, unique and matches what the workers export."""

from __future__ import annotations

from longtail_api import metrics
from longtail_workers.engine import stats


def test_names_are_unique_and_prefixed() -> None:
    names = [m.name for m in metrics.ALL_METRICS] + list(metrics.ROLLOUT_METRIC_NAMES)
    assert len(names) == len(set(names))
    assert all(n.startswith(metrics.PREFIX) for n in names)
    counters = [m.name for m in metrics.ALL_METRICS if m.kind == "counter"]
    assert all(n.endswith("_total") for n in counters)


def test_engine_exports_exactly_the_shared_rollout_names() -> None:
    assert tuple(stats.ALL_METRICS) == metrics.ROLLOUT_METRIC_NAMES
