"""The trainer's use of tracking: its Prometheus series and its open/close steps.

Called by ``trainer/service.py`` (rank 0 only): :func:`start` opens the job's
:class:`~longtail_workers.tracking.sink.Tracker` and logs the spec, :func:`finish` adds the
drafter the service hands it (``trainer/drafter_artifact.py``: the newest published version,
exported as ``longtail drafter export`` writes it where it exports exactly) and ends the tracker
runs with the outcome. :class:`TrackingMetrics` counts failures, drops and buffered records
(``longtail_api.metrics``: ``longtail_trainer_tracking_*``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from prometheus_client import CollectorRegistry

from longtail_api import metrics as names
from longtail_api.spec import RLJobSpec
from longtail_workers.metricspec import counter_from_spec, gauge_from_spec
from longtail_workers.tracking.sink import Tracker, TrackingObserver, open_tracker

log = logging.getLogger(__name__)

FLUSH_TIMEOUT_S = 60.0
"""How long the trainer's exit waits for trackers that are behind (then it gives up on them)."""


class TrackingMetrics(TrackingObserver):
    """The ``longtail_trainer_tracking_*`` series in the trainer's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._failures = counter_from_spec(names.TRAINER_TRACKING_FAILURES_TOTAL, registry)
        self._dropped = counter_from_spec(names.TRAINER_TRACKING_DROPPED_TOTAL, registry)
        self._buffered = gauge_from_spec(names.TRAINER_TRACKING_BUFFERED, registry)

    def failed(self, backend: str) -> None:
        self._failures.labels(backend=backend).inc()

    def dropped(self, backend: str) -> None:
        self._dropped.labels(backend=backend).inc()

    def buffered(self, backend: str, records: int) -> None:
        self._buffered.labels(backend=backend).set(records)


def start(spec: RLJobSpec, run_dir: Path, ckpt_dir: Path, resumed_step: int | None,
          observer: TrackingObserver) -> Tracker:  # fmt: skip
    """The trainer's tracker, the spec logged; ``resumed_step``: the checkpoint's step when
    resuming (TensorBoard hides its later events: those steps run again)."""
    purge = None if resumed_step is None else resumed_step + 1
    tracker = open_tracker(spec, run_dir, ckpt_dir, purge_step=purge, observer=observer)
    tracker.params(spec)
    return tracker


def finish(tracker: Tracker, outcome: str, drafter: Path | None) -> None:
    """Log ``drafter`` (``trainer/drafter_artifact.py``'s choice: the exported drafter, or the
    newest version's own directory; None: there is none) and end the tracker runs (bounded
    wait)."""
    if not tracker.sinks:
        return  # the job tracks nothing
    if drafter is not None:
        tracker.artifact(drafter, "drafter")
    if not tracker.close(outcome, FLUSH_TIMEOUT_S):
        log.warning("tracking: some records were not sent (trainer status tracking_failing)")
