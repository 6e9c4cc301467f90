"""Idleness sources of the harvest loop: the workers' own reports, or Prometheus over DCGM.

Both implement :class:`IdlenessSource`: given the job's worker targets they return a shared
:class:`~longtail_api.harvest.Observation` per worker that answered (busy or idle, for how long,
which activity it reports; status reports are converted by :mod:`longtail_api.harvestloop`,
the loop ``harvester.py`` drives). ``spec.harvest.source`` picks one (``runtime.py`` builds it):

- :class:`WorkerStatusSource` polls every worker's ``GET /v1/status`` concurrently (the trainer
  pod, a target when ``trainer`` is in ``harvest.eligibleRoles``, answers with its
  ``TrainerStatus``: idle while it waits for a rollout, and whether a rollout is in progress;
  when it is not a target, :meth:`~WorkerStatusSource.trainer_report` reads that report for
  the rollout state alone) and counts each worker's failed polls in a row: one that failed
  ``UNREACHABLE_AFTER`` polls is reported by :meth:`~WorkerStatusSource.unreachable` (the
  RLJob's ``WorkersUnreachable`` condition and the ``longtail_operator_unreachable_workers``
  gauge);
- :class:`PrometheusSource` runs ``spec.harvest.prometheus.query`` (per-pod GPU busy
  percentage, ``$namespace`` and ``$window`` substituted) against the Prometheus HTTP API and
  counts a pod idle while its value stays at or below ``idleUtilizationThreshold``; it tracks
  since when itself, never from a series that may belong to an earlier pod of the same name,
  and reads the rollout state from the trainer's own report (a harvested GPU is busy with its
  drafter training, so utilisation cannot tell when the rollout ends). It cannot see the
  workers' activity (acknowledgement then comes from the ``PUT /v1/role`` answers only), nor
  tell an unreachable worker from a missing sample; a query that fails, or names none of the
  job's pods, gives no observation and says why in ``last_error`` (the RLJob's
  ``IdlenessUnavailable`` condition), never a fall-back to another source. The test of the
  whole path: ``tests/integration/test_operator_dcgm.py``.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from longtail_api.harvest import Observation, is_idle_utilization
from longtail_api.harvestloop import observe_trainer, observe_worker
from longtail_api.policies import HarvestSpec
from longtail_operator.clients import TrainerClient, WorkerClient, no_answer_cause
from longtail_operator.metrics import OperatorMetrics

PROMETHEUS = httpx.Client(verify=ssl.create_default_context())
"""Prometheus' client: the system's CAs and the environment's proxy settings, as urllib had."""
UNREACHABLE_AFTER = 3
"""Failed status polls in a row after which a worker counts as unreachable (one failure is a
blip; a pod still loading its model is not a target until it runs)."""


@dataclass(frozen=True)
class WorkerTarget:
    """One worker pod the harvest loop may reassign."""

    name: str
    role: str
    ip: str | None
    port: int
    gpus: int
    uid: str = ""
    """Pod UID: a recreated pod (same name, new UID) starts over in its role's own activity."""


class IdlenessSource(Protocol):
    last_error: str | None
    """Why the last read gave nothing at all (Prometheus unreachable or misconfigured); None
    when it worked (worker status polls fail one by one: ``WorkerStatusSource.unreachable``)."""

    def observe(self, targets: Sequence[WorkerTarget]) -> dict[str, Observation]: ...

    def trainer_report(self, t: WorkerTarget) -> Observation | None:
        """The trainer pod's own report (its rollout state), None when it cannot be read."""
        ...


@dataclass
class WorkerStatusSource:
    """Idleness from the workers' own ``GET /v1/status``."""

    client: WorkerClient
    metrics: OperatorMetrics | None = None
    max_threads: int = 16
    trainer_client: TrainerClient | None = None
    """Client for the trainer pod's status; None: a :class:`TrainerClient` with the workers'
    timeout (tests pass a fake)."""
    errors: dict[str, str] = field(default_factory=dict)
    """Last poll error per worker (cleared when it answers again)."""
    failures: dict[str, int] = field(default_factory=dict)
    """Failed polls in a row per worker (cleared when it answers again)."""
    last_error: str | None = None
    """Always None: status polls fail per worker (:meth:`unreachable`), never as a whole."""

    def _poll(self, t: WorkerTarget) -> Observation | str:
        if not t.ip:
            return "the pod has no IP yet"
        if t.role == "trainer":
            client = self.trainer_client or TrainerClient(timeout=self.client.timeout)
            trainer = client.status(t.ip, t.port)
            return trainer if isinstance(trainer, str) else observe_trainer(trainer)
        worker = self.client.status(t.ip, t.port)
        return worker if isinstance(worker, str) else observe_worker(worker)

    def trainer_report(self, t: WorkerTarget) -> Observation | None:
        """The trainer pod's report when it is not a target (read for the rollout state only):
        None when it cannot be read. Counted as a trainer status poll, never in ``errors`` or
        ``failures`` (it is no worker of the harvest, so never ``unreachable``)."""
        answer = self._poll(t)
        if self.metrics is not None:
            self.metrics.status_poll("trainer", not isinstance(answer, str))
        return None if isinstance(answer, str) else answer

    def observe(self, targets: Sequence[WorkerTarget]) -> dict[str, Observation]:
        if not targets:
            return {}
        with ThreadPoolExecutor(max_workers=min(len(targets), self.max_threads)) as pool:
            answers = list(pool.map(self._poll, targets))
        out: dict[str, Observation] = {}
        names = {t.name for t in targets}
        for gone in [n for n in self.failures if n not in names]:  # pod deleted or replaced
            self.failures.pop(gone, None)
            self.errors.pop(gone, None)
        for t, answer in zip(targets, answers, strict=True):
            ok = not isinstance(answer, str)
            if self.metrics is not None:
                self.metrics.status_poll("trainer" if t.role == "trainer" else "worker", ok)
            if isinstance(answer, str):
                self.errors[t.name] = answer
                self.failures[t.name] = self.failures.get(t.name, 0) + 1
                continue
            self.errors.pop(t.name, None)
            self.failures.pop(t.name, None)
            out[t.name] = answer
        return out

    def unreachable(self) -> dict[str, str]:
        """Workers whose last ``UNREACHABLE_AFTER`` (or more) polls failed: name -> error."""
        return {n: self.errors[n] for n, k in self.failures.items() if k >= UNREACHABLE_AFTER}


def render_query(spec: HarvestSpec, namespace: str, window_s: float) -> str:
    window = f"{max(1, round(window_s))}s"
    return spec.prometheus.query.replace("$namespace", namespace).replace("$window", window)


UID_LABELS = ("pod_uid", "UID", "uid")
"""Labels dcgm-exporter may carry the pod's UID in (``pod_uid`` since its pod-UID support,
``UID`` in later releases); DRA-allocated GPUs carry none (dcgm-exporter #718)."""


@dataclass(frozen=True)
class PodSample:
    """One pod's busy percentage from the query, and the pod UID its series named (if any)."""

    busy_percent: float
    uid: str | None = None


def parse_samples(body: object) -> dict[str, PodSample]:
    """``{pod: sample}`` from an ``/api/v1/query`` answer; raises ValueError naming what is
    wrong, including the label convention when the series name pods only as ``exported_pod``
    (dcgm-exporter scraped without ``honorLabels``)."""
    if not isinstance(body, dict) or body.get("status") != "success":
        status = body.get("status") if isinstance(body, dict) else type(body).__name__
        error = body.get("error") if isinstance(body, dict) else None
        raise ValueError(f"Prometheus answered {status}: {error}")
    out: dict[str, PodSample] = {}
    exported = 0
    for sample in body.get("data", {}).get("result", []):
        labels = sample.get("metric", {})
        pod = labels.get("pod")
        if not pod:
            exported += "exported_pod" in labels
            continue
        uid = next((labels[k] for k in UID_LABELS if labels.get(k)), None)
        out[pod] = PodSample(float(sample["value"][1]), uid)
    if exported and not out:
        raise ValueError(
            "the query's series name their pods as exported_pod, not pod (dcgm-exporter is "
            "scraped without honorLabels): set spec.harvest.prometheus.query to the "
            "exported_pod query of docs/observability.md, or scrape it with honorLabels "
            "(the chart's dcgmMonitor.labels: honor or relabel)"
        )
    return out


@dataclass
class PrometheusSource:
    """Idleness from a Prometheus instant query returning busy percent per ``pod``.

    Two guards keep a series from speaking for a pod it does not belong to. A series whose pod
    UID label names another pod (the one deleted before this one took its name) is ignored. A
    series without a UID is trusted only once the pod has been a target for the query's whole
    window: until then the window may still hold an earlier pod's samples under the same name
    (Prometheus keeps a deleted pod's series in range queries until the window passes).
    The rollout state comes from the trainer's own report (``reports``), read over HTTP: a
    harvested worker's GPU is busy with the very training the harvest started, so GPU
    utilisation cannot say when the rollout ends.
    """

    spec: HarvestSpec
    namespace: str
    reports: WorkerStatusSource | None = None
    """Reads the trainer's ``GET /v1/status`` for the rollout state (None: none is read, the
    workers' GPUs decide: a busy eligible GPU means a rollout runs)."""
    timeout: float = 5.0
    clock: Callable[[], float] = time.monotonic
    idle_since: dict[str, float] = field(default_factory=dict)
    first_seen: dict[str, tuple[str, float]] = field(default_factory=dict)
    """Per target name: the pod UID and when this source first saw it as a target."""
    last_error: str | None = None

    @property
    def window_s(self) -> float:
        return max(self.spec.idle_seconds, self.spec.poll_period_seconds, 1.0)

    def query(self) -> dict[str, PodSample]:
        """``{pod: sample}`` from ``/api/v1/query``; raises httpx.HTTPError, ValueError."""
        url = self.spec.prometheus.url
        if not url:
            raise ValueError("spec.harvest.prometheus.url is empty; set it to use Prometheus")
        q = render_query(self.spec, self.namespace, self.window_s)
        resp = PROMETHEUS.get(
            url.rstrip("/") + "/api/v1/query", params={"query": q}, timeout=self.timeout
        )
        if resp.status_code != 200:  # worded as before (urllib's), one line in the condition
            raise ValueError(f"HTTP Error {resp.status_code}: {resp.reason_phrase}")
        return parse_samples(resp.json())

    def trainer_report(self, t: WorkerTarget) -> Observation | None:
        return None if self.reports is None else self.reports.trainer_report(t)

    def _no_series(
        self, targets: Sequence[WorkerTarget], busy: dict[str, PodSample], now: float
    ) -> str | None:
        """Why the query names none of the job's pods, once every pod had a window to show up
        (None when some pod has a series): most often the label convention."""
        if not targets or any(t.name in busy for t in targets):
            return None
        if any(now - self.first_seen[t.name][1] < self.window_s for t in targets):
            return None
        return (
            f"the query returned no series for any of the job's {len(targets)} pods "
            f"({len(busy)} series of other pods): if dcgm-exporter is scraped without "
            "honorLabels, its series name the job's pods in exported_pod and "
            "exported_namespace; use the exported_pod query of docs/observability.md or the "
            "chart's dcgmMonitor.labels: relabel"
        )

    def observe(self, targets: Sequence[WorkerTarget]) -> dict[str, Observation]:
        now = self.clock()
        names = {t.name for t in targets}
        for gone in [n for n in self.first_seen if n not in names]:
            self.first_seen.pop(gone, None)
            self.idle_since.pop(gone, None)
        for t in targets:
            seen = self.first_seen.get(t.name)
            if seen is None or seen[0] != t.uid:
                self.first_seen[t.name] = (t.uid, now)  # new or recreated pod: starts over
                self.idle_since.pop(t.name, None)
        try:
            busy = self.query()
        except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            self.last_error = f"Prometheus query failed: {no_answer_cause(exc)}"
            return {}  # no observation: nothing is harvested on what cannot be read
        self.last_error = self._no_series(targets, busy, now)
        out = {}
        for t in targets:
            sample = busy.get(t.name)
            if sample is None or (sample.uid and t.uid and sample.uid != t.uid):
                self.idle_since.pop(t.name, None)  # no sample of this pod (a stale one's)
                continue
            if not is_idle_utilization(self.spec, sample.busy_percent):
                self.idle_since.pop(t.name, None)
                out[t.name] = Observation(busy=True, idle_seconds=None)
                continue
            since = self.idle_since.setdefault(t.name, now)
            if not sample.uid:  # the window may still hold an earlier pod's samples
                since = max(since, self.first_seen[t.name][1] + self.window_s)
            idle = now - since if now >= since else None
            out[t.name] = Observation(busy=False, idle_seconds=idle)
        return out
