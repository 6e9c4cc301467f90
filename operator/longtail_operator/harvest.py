"""The harvest loop of one RLJob: poll idleness, decide with the shared function, switch roles.

``handlers.py`` runs one :class:`Harvester` per running RLJob in a kopf daemon and calls
:meth:`Harvester.step` every ``spec.harvest.pollPeriodSeconds``. Each step reads per-worker
idleness from a source (``sources.py``: the workers' ``GET /v1/status``, or Prometheus over
DCGM metrics), calls :func:`longtail_api.harvest.decide` (the same function local mode uses),
sends the resulting role changes with ``PUT /v1/role`` and tracks, per worker, the assigned
activity and whether the worker acknowledged it.

"Rollout active" for rollout workers: some eligible worker (not the trainer) is busy. The trainer
(a target when ``trainer`` is in ``harvest.eligibleRoles``) idles exactly while the others
work, so it never counts toward that; its own view is decided with the rollout state it reports
itself (with Prometheus, which cannot tell, the workers' state), so it is harvested only while
it waits for a rollout, and it refuses ``drafter-train`` (409) outside one.

A decision is sent once; an unacknowledged one (refused with 409, still pending, or the worker
unreachable) is re-sent with exponential backoff and its message is surfaced in the RLJob status
until the worker reports the assigned activity or a new decision replaces it. Harvested
GPU-seconds accumulate for workers that *report* drafter training (not merely assigned).
Workers whose ``GET /v1/status`` failed several polls in a row (``WorkerStatusSource``) are
logged when they stop and start answering, and listed in the snapshot (``unreachable``), from
which the reconcile derives the ``WorkersUnreachable`` condition and its gauge.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime

from longtail_api.harvest import DRAFTER_TRAIN, Activity, WorkerView, decide, default_activity
from longtail_api.policies import HarvestSpec
from longtail_api.status import WorkerStatus
from longtail_operator.clients import RoleResult, WorkerClient
from longtail_operator.metrics import OperatorMetrics
from longtail_operator.sources import (
    IdlenessSource,
    Observation,
    WorkerStatusSource,
    WorkerTarget,
)

log = logging.getLogger(__name__)


@dataclass
class Assignment:
    """The activity last assigned to one worker and its acknowledgement state."""

    activity: Activity
    decided_at: float
    """Monotonic time of the decision (role-switch latency starts here)."""
    decided_wall: str
    acked: bool = True
    observed: Activity | None = None
    attempts: int = 0
    next_try: float = 0.0
    message: str | None = None


@dataclass(frozen=True)
class HarvestSnapshot:
    """What the status derivation needs from the harvest loop."""

    workers: tuple[WorkerStatus, ...] = ()
    idle_gpus: int = 0
    harvested_gpus: int = 0
    harvested_gpu_seconds: float = 0.0
    training_workers: int = 0
    unacknowledged: tuple[str, ...] = ()
    accepted_length: float | None = None
    """Mean accepted length reported by the workers (their current drafter version)."""
    unreachable: tuple[str, ...] = ()
    """``NAME: last error`` of each worker whose status polls keep failing, sorted."""


@dataclass
class Harvester:
    """Per-job harvest state and one poll-decide-send step (see the module text)."""

    job: str
    client: WorkerClient
    metrics: OperatorMetrics | None = None
    namespace: str = ""
    retry_initial_s: float = 0.25
    retry_max_s: float = 10.0
    gpu_seconds: float = 0.0
    clock: Callable[[], float] = time.monotonic
    token: str | None = field(default=None, repr=False)
    """The job's token, sent with every ``PUT /v1/role`` (set by the operator's runtime)."""
    assignments: dict[str, Assignment] = field(default_factory=dict)
    _last_step: float | None = None
    _last_obs: dict[str, Observation] = field(default_factory=dict)
    _targets: dict[str, WorkerTarget] = field(default_factory=dict)
    _unreachable: dict[str, str] = field(default_factory=dict)

    def step(
        self, spec: HarvestSpec, targets: Sequence[WorkerTarget], source: IdlenessSource
    ) -> bool:
        """Poll, decide, send; returns True when an assignment or acknowledgement changed."""
        now = self.clock()
        previous, self._targets = self._targets, {t.name: t for t in targets}
        for name in list(self.assignments):
            old, cur = previous.get(name), self._targets.get(name)
            if cur is None or (old is not None and old.uid != cur.uid):
                del self.assignments[name]  # pod gone, or recreated: starts in its own role
        obs = source.observe(targets)
        self._last_obs = obs
        if isinstance(source, WorkerStatusSource):  # Prometheus cannot tell who is unreachable
            self._track_unreachable(source.unreachable())
        changed = self._account(now, obs)
        eligible = [t for t in targets if t.role in spec.eligible_roles and t.role != "trainer"]
        rollout_active = any(obs[t.name].busy for t in eligible if t.name in obs)
        views = [
            WorkerView(
                name=t.name,
                role=t.role,
                assigned=self._assignment(t, now).activity,
                idle_seconds=obs[t.name].idle_seconds if t.name in obs else None,
                pending_work=obs[t.name].pending if t.name in obs else False,
            )
            for t in targets
        ]
        for name, activity in self._decide(spec, rollout_active, views, obs).items():
            wall = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            prev = self.assignments[name]
            self.assignments[name] = Assignment(
                activity, now, wall, acked=False, observed=prev.observed, next_try=now
            )
            changed = True
        return self._send_due(now) or changed

    @staticmethod
    def _decide(
        spec: HarvestSpec, active: bool, views: list[WorkerView], obs: dict[str, Observation]
    ) -> dict[str, Activity]:
        """:func:`decide` for the workers, and per trainer with the rollout state it reports."""
        changes = decide(spec, active, [v for v in views if v.role != "trainer"])
        for v in views:
            if v.role == "trainer":
                o = obs.get(v.name)
                reported = o.rollout_active if o is not None else None
                changes.update(decide(spec, active if reported is None else reported, [v]))
        return changes

    def _track_unreachable(self, now: dict[str, str]) -> None:
        """Log workers that stop or start answering, and keep the current set."""
        now = {n: e for n, e in now.items() if n in self._targets}
        where = f"{self.namespace}/{self.job}"
        for name in sorted(now.keys() - self._unreachable.keys()):
            log.warning(
                "%s: worker %s does not answer its status polls: %s", where, name, now[name]
            )
        for name in sorted(self._unreachable.keys() - now.keys()):
            log.info("%s: worker %s answers its status polls again (or is gone)", where, name)
        self._unreachable = now

    def _assignment(self, t: WorkerTarget, now: float) -> Assignment:
        if t.name not in self.assignments:
            own = default_activity(t.role)
            self.assignments[t.name] = Assignment(own, now, "", acked=True, observed=None)
        return self.assignments[t.name]

    def _account(self, now: float, obs: dict[str, Observation]) -> bool:
        """Record observed activities and acknowledgements; add harvested GPU-seconds."""
        dt = 0.0 if self._last_step is None else max(0.0, now - self._last_step)
        self._last_step = now
        changed = False
        seconds = 0.0
        for name, o in obs.items():
            a = self.assignments.get(name)
            target = self._targets[name]
            if o.observed == DRAFTER_TRAIN and target.role != "drafter":
                seconds += dt * target.gpus
            if a is None or o.observed is None:
                continue
            if a.observed != o.observed:
                a.observed, changed = o.observed, True
            if not a.acked and o.observed == a.activity:
                self._acknowledge(a, now)
                changed = True
        if seconds:
            self.gpu_seconds += seconds
            if self.metrics is not None:
                self.metrics.harvested(self.namespace, self.job, seconds)
        return changed

    def _acknowledge(self, a: Assignment, now: float) -> None:
        a.acked, a.message, a.observed = True, None, a.activity
        if self.metrics is not None:
            self.metrics.role_switch(a.activity, "acknowledged", now - a.decided_at)

    def _send_due(self, now: float) -> bool:
        due = [
            (name, a) for name, a in self.assignments.items() if not a.acked and a.next_try <= now
        ]
        if not due:
            return False
        with ThreadPoolExecutor(max_workers=min(len(due), 16)) as pool:
            results = list(
                pool.map(lambda item: self._send(self._targets[item[0]], item[1].activity), due)
            )
        for (_, a), result in zip(due, results, strict=True):
            self._record(a, result, self.clock())
        return True

    def _send(self, target: WorkerTarget, activity: Activity) -> RoleResult:
        return self.client.put_role(target.ip, target.port, activity, self.token)

    def _record(self, a: Assignment, result: RoleResult, now: float) -> None:
        a.attempts += 1
        if result.ack is not None and result.ack.observed == a.activity and not result.ack.pending:
            self._acknowledge(a, now)
            return
        if result.ack is not None:
            a.observed = result.ack.observed
        outcome = "pending" if result.code == 202 else ("refused" if result.code else "error")
        a.message = result.message or f"switch to {a.activity} pending"
        delay = min(self.retry_max_s, self.retry_initial_s * 2 ** (a.attempts - 1))
        a.next_try = now + delay
        if self.metrics is not None:
            self.metrics.role_switch(a.activity, outcome, None)

    def snapshot(self) -> HarvestSnapshot:
        workers, idle, harvested, training, unacked = [], 0, 0, 0, []
        lengths = []
        for name in sorted(self._targets):
            t, a = self._targets[name], self.assignments.get(name)
            o = self._last_obs.get(name)
            observed = o.observed if o is not None and o.observed else (a.observed if a else None)
            if observed == DRAFTER_TRAIN:
                training += 1
                harvested += t.gpus if t.role != "drafter" else 0
            elif o is not None and not o.busy and o.idle_seconds is not None:
                idle += t.gpus
            if o is not None and o.accepted_length is not None:
                lengths.append(o.accepted_length)
            if a is not None and not a.acked:
                unacked.append(name)
            workers.append(
                WorkerStatus(
                    name=name,
                    role=t.role,
                    assigned_role=a.activity if a else None,
                    observed_role=observed,
                    since=(a.decided_wall or None) if a else None,
                    message=(a.message[:1024] if a.message else None) if a else None,
                )
            )
        return HarvestSnapshot(
            workers=tuple(workers),
            idle_gpus=idle,
            harvested_gpus=harvested,
            harvested_gpu_seconds=self.gpu_seconds,
            training_workers=training,
            unacknowledged=tuple(unacked),
            accepted_length=sum(lengths) / len(lengths) if lengths else None,
            unreachable=tuple(f"{n}: {e}" for n, e in sorted(self._unreachable.items())),
        )
