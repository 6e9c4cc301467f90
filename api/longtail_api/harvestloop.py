"""The harvest loop of one job, shared by the operator and local mode; they are only transports.

The operator's :class:`~longtail_operator.harvester.Harvester` (HTTP or Prometheus idleness
sources, one per RLJob) and the local :class:`~longtail_workers.local.coordinator.Coordinator`
(``longtail run``) each implement :class:`Transport` (read the workers' reports, re-read the
rollout state, send ``PUT /v1/role``) and call :meth:`HarvestLoop.step` every
``harvest.pollPeriodSeconds``; they keep their own books and metrics from the
:class:`StepResult`. One step: read the reports, acknowledge assignments the workers now report,
build the views and decide (:mod:`longtail_api.harvest`), re-check the rollout just in time,
record the decisions, send what is due and record the answers.

Where the two loops used to differ, one behaviour was kept for both (the more robust one):

- Pending work is the union of the worker's own report (waiting sequences) and the trainer's
  list of workers that still hold requests; either source alone can miss re-dispatched work.
- Rollout active: the trainer's own report (local mode always reads it; the operator reads
  pod 0's status whether or not the trainer is a target, and only for the rollout state when
  it is not). When the report cannot be read (the operator: pod 0 not running or not
  answering, or the Prometheus source) it falls back to: some eligible non-trainer worker is
  busy. The trainer is a target only when in ``eligibleRoles`` and never counts toward "busy".
- Just-in-time re-check: before harvest (``drafter-train``) decisions are recorded the
  transport re-reads the rollout state; when the rollout ended, moved to another step, or
  cannot be read, those decisions are dropped (training through the policy update would use a
  stale policy) and the next step decides afresh. Decisions back to a role's own work are kept.
- A refused switch (409, or any failed send) keeps the assignment unacknowledged, its message
  kept for the status, and re-sends it with exponential backoff (``retry_initial_s`` doubling
  to ``retry_max_s``) until the worker reports the assigned activity or a new decision
  replaces it. A 202 (switch still completing) is re-sent the same way until acknowledged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from longtail_api.harvest import (
    DRAFTER_TRAIN,
    Activity,
    Observation,
    RolloutState,
    Target,
    decide,
    default_activity,
    rollout_state,
    still_running,
    trainer_report,
    views,
)
from longtail_api.policies import HarvestSpec
from longtail_api.workerapi import RoleAck, RolloutWorkerStatus, TrainerStatus


def observe_worker(s: RolloutWorkerStatus) -> Observation:
    """A rollout worker's ``GET /v1/status`` as an observation."""
    return Observation(
        busy=s.generating or s.running > 0,
        idle_seconds=None if s.generating else s.idle_seconds,
        pending=s.waiting > 0,
        observed=s.role.observed,
        accepted_length=s.mean_accepted_length,
    )


def observe_trainer(s: TrainerStatus) -> Observation:
    """The trainer's status: idle while it waits for the rollout, busy otherwise (updating the
    policy, evaluating, checkpointing), plus its rollout state and pending workers."""
    return Observation(
        busy=s.idle_seconds is None,
        idle_seconds=s.idle_seconds,
        observed=None if s.role is None else s.role.observed,
        rollout_active=s.rollout_active,
        step=s.step,
        pending_workers=s.pending_workers,
    )


@dataclass(frozen=True)
class Reports:
    """What one read of the transport returned."""

    targets: Sequence[Target]
    """The workers the loop may reassign now (a target that disappears loses its assignment)."""
    workers: Mapping[str, Observation]
    """An observation per target that answered."""
    trainer: Observation | None = None
    """The trainer's own report whether or not it is a target (it is never decided on unless
    it is one); None: take it from the targets (the trainer's observation when it is one), or
    derive the rollout state from the workers."""


@dataclass(frozen=True)
class RoleReply:
    """What one ``PUT /v1/role`` returned."""

    code: int | None
    """HTTP status (202: still switching, 409: refused), or None when no answer came."""
    ack: RoleAck | None
    """The worker's parsed answer on success."""
    message: str | None
    """Why it failed (shown in the status), None on success."""


@dataclass(frozen=True)
class SwitchEvent:
    """One role-switch outcome, for the transport's metrics."""

    activity: Activity
    """The activity that was assigned."""
    outcome: str
    """acknowledged, pending (202), refused (an HTTP error) or error (no answer)."""
    seconds: float | None
    """Decision to acknowledgement, for ``acknowledged``."""


class Transport(Protocol):
    """How a loop reads reports and sends role changes (HTTP, Prometheus, fakes in tests)."""

    def read(self) -> Reports: ...

    def recheck(self) -> RolloutState | None:
        """The rollout state read again now; None when it cannot be read."""
        ...

    def send(self, orders: Sequence[tuple[str, Activity]]) -> list[RoleReply]:
        """``PUT /v1/role`` for each ``(worker, activity)``; one reply each, in order."""
        ...


@dataclass
class Assignment:
    """The activity last assigned to one worker and its acknowledgement state."""

    activity: Activity
    """What the worker was last told to do."""
    decided_at: float
    """Monotonic time of the decision (role-switch latency starts here)."""
    decided_wall: str
    """UTC time of the decision (``since`` in the status); empty for a role's default."""
    acked: bool = True
    """The worker reported (or answered) doing ``activity``."""
    observed: Activity | None = None
    """What the worker last reported doing."""
    attempts: int = 0
    """Sends so far."""
    next_try: float = 0.0
    """Monotonic time of the next send while unacknowledged."""
    message: str | None = None
    """Why the last send did not switch it (409 reason, connection error)."""


@dataclass(frozen=True)
class StepResult:
    """What one :meth:`HarvestLoop.step` saw and did."""

    reports: Reports
    """The reports read this step."""
    rollout: RolloutState
    """The rollout state the decisions were made with."""
    decided: dict[str, Activity]
    """New decisions recorded (and sent) this step."""
    dropped: dict[str, Activity]
    """Harvest decisions dropped because the re-check found the rollout over."""
    sent: tuple[tuple[str, Activity], ...]
    """Every ``PUT /v1/role`` sent this step (new decisions and re-sends)."""
    events: tuple[SwitchEvent, ...]
    """Role-switch outcomes, for metrics."""
    changed: bool
    """An assignment, an observed activity or an acknowledgement changed, or something was
    sent."""


@dataclass
class HarvestLoop:
    """Assignments of one job and the poll-decide-re-check-send step (see the module text)."""

    retry_initial_s: float = 0.25
    """First re-send delay of an unacknowledged assignment."""
    retry_max_s: float = 10.0
    """Longest re-send delay."""
    clock: Callable[[], float] = time.monotonic
    """Monotonic clock (decisions, backoff, latency)."""
    assignments: dict[str, Assignment] = field(default_factory=dict)
    """Per worker name; a target starts acknowledged in its role's own activity."""

    def forget(self, name: str) -> None:
        """Drop a worker's assignment (its pod was recreated): it starts over in its role."""
        self.assignments.pop(name, None)

    def step(self, spec: HarvestSpec, transport: Transport) -> StepResult:
        """One read, decide, re-check, send; see the module text."""
        now = self.clock()
        reports = transport.read()
        names = {t.name for t in reports.targets}
        for gone in [n for n in self.assignments if n not in names]:
            del self.assignments[gone]
        events: list[SwitchEvent] = []
        changed = self._observe(reports.workers, now, events)
        trainer = reports.trainer or trainer_report(reports.targets, reports.workers)
        rollout = rollout_state(spec, reports.targets, reports.workers, trainer)
        for t in reports.targets:
            if t.name not in self.assignments:
                self.assignments[t.name] = Assignment(default_activity(t.role), now, "")
        assigned = {n: a.activity for n, a in self.assignments.items()}
        changes = decide(
            spec, rollout.active, views(reports.targets, assigned, reports.workers, trainer)
        )
        dropped: dict[str, Activity] = {}
        if DRAFTER_TRAIN in changes.values() and not still_running(rollout, transport.recheck()):
            dropped = {n: a for n, a in changes.items() if a == DRAFTER_TRAIN}
            changes = {n: a for n, a in changes.items() if a != DRAFTER_TRAIN}
        wall = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for name, activity in changes.items():
            prev = self.assignments[name]
            self.assignments[name] = Assignment(
                activity, now, wall, acked=False, observed=prev.observed, next_try=now
            )
            changed = True
        sent = self._send_due(transport, now, events)
        return StepResult(
            reports, rollout, changes, dropped, sent, tuple(events), changed or bool(sent)
        )

    def _observe(
        self, obs: Mapping[str, Observation], now: float, events: list[SwitchEvent]
    ) -> bool:
        """Record reported activities; acknowledge assignments the workers now report."""
        changed = False
        for name, o in obs.items():
            a = self.assignments.get(name)
            if a is None or o.observed is None:
                continue
            if a.observed != o.observed:
                a.observed, changed = o.observed, True
            if not a.acked and o.observed == a.activity:
                self._acknowledge(a, now, events)
                changed = True
        return changed

    def _acknowledge(self, a: Assignment, now: float, events: list[SwitchEvent]) -> None:
        a.acked, a.message, a.observed = True, None, a.activity
        events.append(SwitchEvent(a.activity, "acknowledged", now - a.decided_at))

    def _send_due(
        self, transport: Transport, now: float, events: list[SwitchEvent]
    ) -> tuple[tuple[str, Activity], ...]:
        due = [(n, a) for n, a in self.assignments.items() if not a.acked and a.next_try <= now]
        if not due:
            return ()
        orders = [(name, a.activity) for name, a in due]
        replies = transport.send(orders)
        if len(replies) != len(orders):
            raise ValueError(f"transport answered {len(replies)} replies for {len(orders)} sends")
        after = self.clock()
        for (_, a), reply in zip(due, replies, strict=True):
            self._record(a, reply, after, events)
        return tuple(orders)

    def _record(
        self, a: Assignment, reply: RoleReply, now: float, events: list[SwitchEvent]
    ) -> None:
        """The 409 policy: anything but a completed switch keeps it unacknowledged, with its
        message, and re-sends it after an exponential backoff."""
        a.attempts += 1
        ack = reply.ack
        if ack is not None and ack.observed == a.activity and not ack.pending:
            self._acknowledge(a, now, events)
            return
        if ack is not None:
            a.observed = ack.observed
        outcome = "pending" if reply.code == 202 else ("refused" if reply.code else "error")
        a.message = reply.message or f"switch to {a.activity} pending"
        a.next_try = now + min(self.retry_max_s, self.retry_initial_s * 2 ** (a.attempts - 1))
        events.append(SwitchEvent(a.activity, outcome, None))
