"""The operator's harvest transport for one RLJob: read idleness, run the shared loop, switch roles.

``runtime.py`` runs one :class:`Harvester` per running RLJob in a kopf daemon (``handlers.py``)
and calls :meth:`Harvester.step` every ``spec.harvest.pollPeriodSeconds``. The whole decision
(views of the step, the trainer rule, the just-in-time re-check, the 409 policy with backoff)
is :class:`longtail_api.harvestloop.HarvestLoop`, the same loop local mode runs; this module is
its transport: it reads per-worker idleness from a source (``sources.py``: the workers'
``GET /v1/status``, or Prometheus over DCGM metrics), re-reads it for the re-check, sends role
changes with ``PUT /v1/role`` (concurrently, with the job's token), and keeps the operator's
books: harvested GPU-seconds (for workers that *report* drafter training, not merely
assigned), role-switch metrics, and the snapshot the status derivation reads (assignments,
unacknowledged ones with their message). The trainer's own report (pod 0's ``GET /v1/status``)
gives the rollout state whether or not the trainer is a target, as in local mode (with
``source: workers``; Prometheus keeps the workers' rule); when it is not a target it is read
for that alone: never decided on, switched, or counted in the books, the snapshot or the
unreachable list. Workers whose ``GET /v1/status`` failed several polls in a row
(``WorkerStatusSource``) are logged when they stop and start answering, and listed in the
snapshot (``unreachable``), from which the reconcile derives the ``WorkersUnreachable``
condition and its gauge.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from longtail_api.harvest import (
    DRAFTER_TRAIN,
    Activity,
    Observation,
    RolloutState,
    rollout_state,
    trainer_report,
)
from longtail_api.harvestloop import Assignment, HarvestLoop, Reports, RoleReply
from longtail_api.policies import HarvestSpec
from longtail_api.status import WorkerStatus
from longtail_operator.clients import WorkerClient
from longtail_operator.metrics import OperatorMetrics
from longtail_operator.model import HarvestSnapshot
from longtail_operator.sources import IdlenessSource, WorkerStatusSource, WorkerTarget

log = logging.getLogger(__name__)


@dataclass
class _Cluster:
    """The :class:`~longtail_api.harvestloop.Transport` of one step over the pods."""

    spec: HarvestSpec
    targets: Sequence[WorkerTarget]
    source: IdlenessSource
    client: WorkerClient
    token: str | None
    trainer: WorkerTarget | None = None
    """Trainer pod 0 read apart for its rollout report: when it is not a target, or always
    with a source whose observations carry no report (Prometheus)."""

    def _observe(self) -> tuple[dict[str, Observation], Observation | None]:
        """The targets' observations and the trainer's report: its observation when it is a
        target, else pod 0 read apart, else None (the loop then derives the rollout state from
        the workers)."""
        obs = self.source.observe(self.targets)
        report = trainer_report(self.targets, obs)
        if report is None and self.trainer is not None:
            report = self.source.trainer_report(self.trainer)
        return obs, report

    def read(self) -> Reports:
        obs, report = self._observe()
        return Reports(self.targets, obs, report)

    def recheck(self) -> RolloutState | None:
        """Poll again: the trainer's report when it can be read, else the workers' state."""
        obs, report = self._observe()
        return rollout_state(self.spec, self.targets, obs, report)

    def send(self, orders: Sequence[tuple[str, Activity]]) -> list[RoleReply]:
        by_name = {t.name: t for t in self.targets}

        def put(order: tuple[str, Activity]) -> RoleReply:
            t = by_name[order[0]]
            r = self.client.put_role(t.ip, t.port, order[1], self.token)
            return RoleReply(r.code, r.ack, r.message)

        with ThreadPoolExecutor(max_workers=min(len(orders), 16)) as pool:
            return list(pool.map(put, orders))


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
    loop: HarvestLoop = field(init=False)
    """The shared loop: assignments, decisions, re-check, re-sends."""
    _last_step: float | None = None
    _last_obs: dict[str, Observation] = field(default_factory=dict)
    _targets: dict[str, WorkerTarget] = field(default_factory=dict)
    _unreachable: dict[str, str] = field(default_factory=dict)
    _source: tuple[str, str | None] = ("workers", None)

    def __post_init__(self) -> None:
        self.loop = HarvestLoop(self.retry_initial_s, self.retry_max_s, self.clock)

    @property
    def assignments(self) -> dict[str, Assignment]:
        """Per worker: the activity last assigned and its acknowledgement state."""
        return self.loop.assignments

    def step(
        self,
        spec: HarvestSpec,
        targets: Sequence[WorkerTarget],
        source: IdlenessSource,
        trainer: WorkerTarget | None = None,
    ) -> bool:
        """Poll, decide, send; returns True when an assignment or acknowledgement changed.
        ``trainer``: pod 0 (the reconcile's ``JobRuntime.trainer_target``), read for the
        rollout state when it is not among ``targets``; never decided on, switched or counted
        then."""
        now = self.clock()
        previous, self._targets = self._targets, {t.name: t for t in targets}
        for name, cur in self._targets.items():
            old = previous.get(name)
            if old is not None and old.uid != cur.uid:
                self.loop.forget(name)  # pod recreated: starts in its own role
        # The trainer's report comes with the workers' status polls when it is a target; a
        # Prometheus source has no report in its observations, so pod 0 is read apart always.
        apart = trainer if trainer is not None and trainer.name not in self._targets else None
        if not isinstance(source, WorkerStatusSource):
            apart = trainer
        cluster = _Cluster(spec, targets, source, self.client, self.token, apart)
        result = self.loop.step(spec, cluster)
        was, self._source = self._source[1], (spec.source, source.last_error)
        if source.last_error is not None and was is None:  # logged when it starts and ends
            log.warning("%s/%s: %s; nothing is harvested until it answers", self.namespace,
                        self.job, source.last_error)  # fmt: skip
        elif source.last_error is None and was is not None:
            log.info("%s/%s: the %s source answers again", self.namespace, self.job, spec.source)
        self._last_obs = dict(result.reports.workers)
        if isinstance(source, WorkerStatusSource):  # Prometheus cannot tell who is unreachable
            self._track_unreachable(source.unreachable())
        self._account(now, self._last_obs)
        if self.metrics is not None:
            for e in result.events:
                self.metrics.role_switch(e.activity, e.outcome, e.seconds)
        return result.changed

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

    def _account(self, now: float, obs: dict[str, Observation]) -> None:
        """Add harvested GPU-seconds for the workers that report drafter training."""
        dt = 0.0 if self._last_step is None else max(0.0, now - self._last_step)
        self._last_step = now
        seconds = 0.0
        for name, o in obs.items():
            target = self._targets[name]
            if o.observed == DRAFTER_TRAIN and target.role != "drafter":
                seconds += dt * target.gpus
        if seconds:
            self.gpu_seconds += seconds
            if self.metrics is not None:
                self.metrics.harvested(self.namespace, self.job, seconds)

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
            source=self._source[0],
            source_error=self._source[1],
        )
