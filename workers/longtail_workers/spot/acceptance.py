"""Acceptance length per policy version and per drafter version, as stats and Prometheus gauges.

The rollout worker calls :meth:`AcceptanceTracker.record` after every ``generate`` with the
policy and drafter versions it generated with; the status endpoint reads
:meth:`AcceptanceTracker.snapshot` and ``/metrics`` exports the tracker as a Prometheus collector
(register it on the worker's registry). The numbers come from each result's
``spec_steps``/``accepted_tokens``/``drafted_tokens`` (``engine/interface.py``); accepted length
is defined as in ``engine/stats.py``: accepted drafts + 1 per speculative step, so::

    mean accepted length = (accepted_tokens + spec_steps) / spec_steps

Only the ``keep_versions`` most recent versions of each kind are kept (and exported), which bounds
the number of label values a long run creates.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import replace

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from longtail_api.drafterstatus import AcceptanceSnapshot, AcceptanceStats
from longtail_api.metrics import DRAFTER_ACCEPTED_LENGTH, POLICY_ACCEPTED_LENGTH
from longtail_workers.engine.interface import GenerationResult
from longtail_workers.metricspec import gauge_family

INITIAL_DRAFTER = -1
"""Drafter version label of a worker's unpublished initial drafter."""


class AcceptanceTracker(Collector):
    """Per-version acceptance statistics; also a Prometheus collector."""

    def __init__(self, keep_versions: int = 16) -> None:
        if keep_versions < 1:
            raise ValueError(f"keep_versions={keep_versions}; must be >= 1")
        self.keep_versions = keep_versions
        self._lock = threading.Lock()
        self._policy: OrderedDict[int, AcceptanceStats] = OrderedDict()
        self._drafter: OrderedDict[int, AcceptanceStats] = OrderedDict()

    def record(
        self, results: Sequence[GenerationResult], *, policy_version: int, drafter_version: int
    ) -> None:
        """Add the SD counters of ``results`` under both versions."""
        with self._lock:
            p = self._slot(self._policy, policy_version)
            d = self._slot(self._drafter, drafter_version)
            for s in (p, d):
                for r in results:
                    s.sequences += 1
                    s.spec_steps += r.spec_steps
                    s.drafted_tokens += r.drafted_tokens
                    s.accepted_tokens += r.accepted_tokens

    def _slot(self, table: OrderedDict[int, AcceptanceStats], key: int) -> AcceptanceStats:
        if key not in table:
            table[key] = AcceptanceStats()
            while len(table) > self.keep_versions:
                table.popitem(last=False)  # the oldest version seen
        return table[key]

    def by_policy(self) -> dict[int, AcceptanceStats]:
        with self._lock:
            return {k: replace(v) for k, v in self._policy.items()}

    def by_drafter(self) -> dict[int, AcceptanceStats]:
        with self._lock:
            return {k: replace(v) for k, v in self._drafter.items()}

    def snapshot(self) -> AcceptanceSnapshot:
        """The ``acceptance`` of the worker's status."""
        return AcceptanceSnapshot(self.by_policy(), self.by_drafter())

    def collect(self) -> Iterator[Metric]:
        for spec, table in (
            (POLICY_ACCEPTED_LENGTH, self.by_policy()),
            (DRAFTER_ACCEPTED_LENGTH, self.by_drafter()),
        ):
            family = gauge_family(spec)
            for version, stats in table.items():
                value = stats.mean_accepted_length
                if value is not None:
                    family.add_metric([str(version)], value)
            yield family
