"""The operator's process-wide state and the two loops every RLJob gets.

``handlers.py`` (kopf) creates one :class:`Operator` at start-up and, per RLJob, runs
:meth:`Operator.run_job` and :meth:`Operator.run_harvest` as kopf daemons in threads:

- the job loop reconciles when woken (the RLJob or one of its pods changed: kopf event
  handlers call :meth:`Operator.wake`; the trainer's checkpoint call, which runs in the
  background, ended: ``checkpoints.py``), and at least every ``reconcile_period_s``; on an API
  error (``kopf.TemporaryError``) it waits with exponential backoff, up to 30 s, but only up to
  2 s while the API server does not answer at all (``KubeError`` status 0: an outage or a
  restart, which costs the server nothing to retry), so a job converges within about 2 s of the
  API server's return;
- the harvest loop, while the job runs with harvest enabled, calls :meth:`Harvester.step` every
  ``spec.harvest.pollPeriodSeconds`` and wakes the job loop when an assignment or an
  acknowledgement changed, so the status shows it within one reconcile.

Both loops check ``stopped`` (kopf's flag, set when the RLJob is deleted or the operator stops)
at least every 0.25 s, and no reconcile waits on a checkpoint (at most ``checkpoints.GRACE_S``):
a stopping operator exits without waiting for one. Neither dies on an API error: every failure
of a call is a ``KubeError`` (``kube.py``), which the job loop retries and the harvest loop logs
and retries next poll. The operator's readiness asks the API server itself
(:meth:`Kube.probe`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Protocol

import kopf

from longtail_api.spec import RLJobSpec
from longtail_operator.clients import WorkerClient
from longtail_operator.harvester import Harvester
from longtail_operator.kube import Kube, KubeError
from longtail_operator.metrics import Health, OperatorMetrics
from longtail_operator.observe import parse_status
from longtail_operator.reconcile import JobRuntime, Reconciler
from longtail_operator.settings import Settings
from longtail_operator.sources import IdlenessSource, PrometheusSource, WorkerStatusSource

log = logging.getLogger(__name__)
TICK_S = 0.25
MAX_BACKOFF_S = 30.0
"""Longest wait between failed reconciles of one job when the API server answered (403, 422,
a 5xx: retrying fast helps neither it nor us)."""
NO_ANSWER_BACKOFF_S = 2.0
"""Longest wait while the API server does not answer: how long after its return a job waits."""
LOG_EVERY_S = 60.0
"""A job loop failing again and again logs the first failure, then one line a minute."""


def next_backoff(previous: float, exc: kopf.TemporaryError) -> float:
    """The wait after a failed reconcile: doubling from ``exc.delay``, capped by the kind of
    failure (``exc.__cause__``, the ``KubeError`` the reconciler raised it from)."""
    cause = exc.__cause__
    no_answer = isinstance(cause, KubeError) and cause.status == 0
    cap = NO_ANSWER_BACKOFF_S if no_answer else MAX_BACKOFF_S
    return min(cap, max(exc.delay or 1.0, previous * 2))


class Stopped(Protocol):
    def __bool__(self) -> bool: ...


class Operator:
    """Registry of job runtimes plus the shared clients, settings and metrics."""

    def __init__(
        self, kube: Kube, settings: Settings, metrics: OperatorMetrics, health: Health
    ) -> None:
        self.kube, self.settings, self.metrics, self.health = kube, settings, metrics, health
        health.api_probe = kube.probe  # ready while the API server answers this identity
        self.reconciler = Reconciler(kube, settings, metrics, wake=self.wake)
        self.workers = WorkerClient(timeout=settings.http_timeout_s)
        self._jobs: dict[tuple[str, str], JobRuntime] = {}
        self._wake: dict[tuple[str, str], threading.Event] = {}
        self._lock = threading.Lock()

    def runtime(self, namespace: str, name: str) -> JobRuntime:
        with self._lock:
            key = (namespace, name)
            if key not in self._jobs:
                self._jobs[key] = JobRuntime(namespace, name)
                self._wake[key] = threading.Event()
            return self._jobs[key]

    def wake(self, namespace: str, name: str) -> None:
        event = self._wake.get((namespace, name))
        if event is not None:
            event.set()

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._jobs.pop((namespace, name), None)
            self._wake.pop((namespace, name), None)
        self.metrics.forget_job(namespace, name)
        self._publish_phases()

    def _publish_phases(self) -> None:
        with self._lock:
            counts = Counter(rt.phase for rt in self._jobs.values())
        self.metrics.jobs(counts)

    def _sleep(self, stopped: Stopped, key: tuple[str, str], seconds: float) -> None:
        """Wait ``seconds``, or less if woken or stopped."""
        event = self._wake[key]
        deadline = time.monotonic() + seconds
        while not stopped and time.monotonic() < deadline:
            if event.wait(min(TICK_S, max(0.0, deadline - time.monotonic()))):
                break
        event.clear()

    def run_job(self, stopped: Stopped, namespace: str, name: str) -> None:
        """The job loop (see the module text)."""
        rt = self.runtime(namespace, name)
        key, backoff, failures, warned = (namespace, name), 0.0, 0, -LOG_EVERY_S
        while not stopped:
            try:
                phase = self.reconciler.reconcile(rt)
            except kopf.TemporaryError as exc:
                backoff, failures = next_backoff(backoff, exc), failures + 1
                # The first failure, then one line a minute: an outage is not a flood of lines.
                level, now = logging.DEBUG, time.monotonic()
                if failures == 1 or now - warned >= LOG_EVERY_S:
                    level, warned = logging.WARNING, now
                log.log(
                    level,
                    "reconcile of %s/%s failed %d time(s) (retry in %.1f s): %s",
                    *key,
                    failures,
                    backoff,
                    exc,
                )
                self._sleep(stopped, key, backoff)
                continue
            if failures:
                log.warning("reconcile of %s/%s works again after %d failure(s)", *key, failures)
            backoff, failures = 0.0, 0
            if phase is None:  # deleted: the daemon is about to be stopped
                break
            self._publish_phases()
            self._sleep(stopped, key, self.settings.reconcile_period_s)
        self.forget(namespace, name)

    def _harvester(self, rt: JobRuntime) -> Harvester:
        if rt.harvester is None:
            raw = self.kube.get_job(rt.namespace, rt.name) or {}
            previous = parse_status(raw.get("status"))
            rt.harvester = Harvester(
                job=rt.name,
                namespace=rt.namespace,
                client=self.workers,
                metrics=self.metrics,
                retry_initial_s=self.settings.role_retry_initial_s,
                retry_max_s=self.settings.role_retry_max_s,
                gpu_seconds=previous.gpus.harvested_gpu_seconds,
            )
        return rt.harvester

    def _source(self, rt: JobRuntime, spec: RLJobSpec, cache: dict[str, object]) -> IdlenessSource:
        key = repr(spec.harvest)
        if cache.get("key") != key:
            source: IdlenessSource
            if spec.harvest.source == "prometheus":  # the trainer's report read over HTTP
                reports = WorkerStatusSource(self.workers, self.metrics, 1)
                source = PrometheusSource(spec.harvest, rt.namespace, reports)
            else:
                source = WorkerStatusSource(
                    self.workers, self.metrics, self.settings.harvest_workers
                )
            cache.update(key=key, source=source)
        return cache["source"]  # type: ignore[return-value]

    def run_harvest(self, stopped: Stopped, namespace: str, name: str) -> None:
        """The harvest loop (see the module text)."""
        rt = self.runtime(namespace, name)
        key, cache = (namespace, name), {}  # type: ignore[var-annotated]
        while not stopped:
            spec, period = rt.spec, 1.0
            active = rt.phase in ("Running", "Initializing") and rt.targets
            if spec is not None and spec.harvest.enabled and active:
                period = spec.harvest.poll_period_seconds
                try:
                    harvester = self._harvester(rt)
                    harvester.token = rt.token  # read from the job's Secret by the reconcile
                    source = self._source(rt, spec, cache)
                    if harvester.step(spec.harvest, rt.targets, source, rt.trainer_target):
                        self.wake(*key)
                except (OSError, RuntimeError) as exc:  # KubeError: API read of the initial status
                    log.warning("harvest step of %s/%s failed: %s", namespace, name, exc)
            deadline = time.monotonic() + period
            while not stopped and time.monotonic() < deadline:
                time.sleep(min(TICK_S, max(0.0, deadline - time.monotonic())))
