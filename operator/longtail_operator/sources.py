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
  since when itself, and cannot see the workers' activity (acknowledgement then comes from the
  ``PUT /v1/role`` answers only), nor tell an unreachable worker from a missing sample.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from longtail_api.harvest import Observation, is_idle_utilization
from longtail_api.harvestloop import observe_trainer, observe_worker
from longtail_api.policies import HarvestSpec
from longtail_operator.clients import TrainerClient, WorkerClient
from longtail_operator.metrics import OperatorMetrics

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
    def observe(self, targets: Sequence[WorkerTarget]) -> dict[str, Observation]: ...


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


@dataclass
class PrometheusSource:
    """Idleness from a Prometheus instant query returning busy percent per ``pod``."""

    spec: HarvestSpec
    namespace: str
    timeout: float = 5.0
    clock: Callable[[], float] = time.monotonic
    idle_since: dict[str, float] = field(default_factory=dict)
    last_error: str | None = None

    def query(self) -> dict[str, float]:
        """``{pod: busy percent}`` from ``/api/v1/query``; raises OSError/ValueError."""
        url = self.spec.prometheus.url
        if not url:
            raise ValueError("spec.harvest.prometheus.url is empty; set it to use Prometheus")
        window = max(self.spec.idle_seconds, self.spec.poll_period_seconds, 1.0)
        q = render_query(self.spec, self.namespace, window)
        full = url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
        with urllib.request.urlopen(full, timeout=self.timeout) as resp:
            body = json.loads(resp.read())
        if body.get("status") != "success":
            raise ValueError(f"Prometheus answered {body.get('status')}: {body.get('error')}")
        out: dict[str, float] = {}
        for sample in body.get("data", {}).get("result", []):
            pod = sample.get("metric", {}).get("pod")
            if pod:
                out[pod] = float(sample["value"][1])
        return out

    def observe(self, targets: Sequence[WorkerTarget]) -> dict[str, Observation]:
        try:
            busy = self.query()
        except (OSError, ValueError, KeyError, urllib.error.URLError) as exc:
            self.last_error = f"Prometheus query failed: {exc}"
            return {}
        self.last_error = None
        now, out = self.clock(), {}
        for t in targets:
            if t.name not in busy:
                continue
            if is_idle_utilization(self.spec, busy[t.name]):
                since = self.idle_since.setdefault(t.name, now)
                out[t.name] = Observation(busy=False, idle_seconds=now - since)
            else:
                self.idle_since.pop(t.name, None)
                out[t.name] = Observation(busy=True, idle_seconds=None)
        return out
