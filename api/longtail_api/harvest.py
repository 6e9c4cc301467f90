"""The harvest decision: which idle workers train the drafter right now.

Pure functions shared by the operator's harvest loop (cluster) and the local coordinator
(``longtail run``) through :mod:`longtail_api.harvestloop`, which owns the rest of the loop
(acknowledgements, the just-in-time re-check, the 409 policy). This module turns one poll's
:class:`Observation` s into the step's rollout state (:func:`rollout_state`) and one
:class:`WorkerView` per target (:func:`views`), and :func:`decide` returns the role changes; a
decision that was already assigned is never returned again.

Rules, in order (TLT: train the drafter on GPUs that would otherwise wait for the long tail):

1. Outside a step's rollout, or with harvest disabled, every worker does its role's own work.
   "In a rollout": the trainer's own report when the caller has one, target or not (it
   dispatches the step, so it knows); otherwise (its report cannot be read) some eligible
   worker other than the trainer is busy (the trainer idles exactly while the others work, so
   it never counts toward that).
2. Only roles in ``eligibleRoles`` are harvested (the trainer only when ``trainer`` is listed;
   its idleness comes from its own status: idle while it waits for the rollout).
3. A harvested worker keeps training until the rollout ends, unless work is handed to it again
   (prompts re-dispatched after another worker failed: the worker reports waiting sequences, or
   the trainer lists it among the workers that still hold requests): then it goes back.
4. A worker with no pending work that has been idle for at least ``idleSeconds`` (idle: the
   worker reports no work in progress, or its GPU is at or below the utilisation threshold) is
   switched to ``drafter-train``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

from longtail_api.policies import HarvestSpec

Activity = Literal["rollout", "train", "verify", "drafter-train"]
"""What a worker does with its GPU; a pod's role fixes its default activity."""

DRAFTER_TRAIN: Activity = "drafter-train"

_DEFAULT_ACTIVITY: dict[str, Activity] = {
    "rollout": "rollout",
    "trainer": "train",
    "verifier": "verify",
    "drafter": "drafter-train",
}


def default_activity(role: str) -> Activity:
    """The activity of a role's pod when it is not harvested."""
    try:
        return _DEFAULT_ACTIVITY[role]
    except KeyError:
        known = ", ".join(_DEFAULT_ACTIVITY)
        raise ValueError(f"unknown worker role {role!r}; known roles: {known}") from None


@dataclass(frozen=True)
class WorkerView:
    """What the caller observed about one worker, source-independent."""

    name: str
    """Worker (pod or process) name."""
    role: str
    """The worker's role in the job: rollout, trainer, verifier or drafter."""
    assigned: Activity
    """Activity last assigned to it (acknowledged or not)."""
    idle_seconds: float | None
    """How long it has been idle; None when it is busy or its idleness is unknown."""
    pending_work: bool = False
    """It still holds unfinished work of the current step (e.g. prompts to generate)."""


def is_idle_utilization(spec: HarvestSpec, utilization_percent: float | None) -> bool:
    """Whether a GPU busy percentage counts as idle under the job's threshold."""
    return (
        utilization_percent is not None and utilization_percent <= spec.idle_utilization_threshold
    )


def desired_activity(spec: HarvestSpec, rollout_active: bool, w: WorkerView) -> Activity:
    """The activity one worker should have now (see the module's rules)."""
    own = default_activity(w.role)
    if not spec.enabled or not rollout_active or w.role not in spec.eligible_roles:
        return own
    if w.pending_work:
        return own
    if w.assigned == DRAFTER_TRAIN:
        return DRAFTER_TRAIN
    if w.idle_seconds is not None and w.idle_seconds >= spec.idle_seconds:
        return DRAFTER_TRAIN
    return own


def decide(
    spec: HarvestSpec, rollout_active: bool, workers: Sequence[WorkerView]
) -> dict[str, Activity]:
    """Role changes to send now: ``{worker name: new activity}`` for workers whose desired
    activity differs from what they were last assigned."""
    changes: dict[str, Activity] = {}
    for w in workers:
        want = desired_activity(spec, rollout_active, w)
        if want != w.assigned:
            changes[w.name] = want
    return changes


class Target(Protocol):
    """A worker the loop may reassign, as any transport names it (the operator's
    ``WorkerTarget``, the local coordinator's :class:`NamedTarget`)."""

    @property
    def name(self) -> str: ...

    @property
    def role(self) -> str: ...


class NamedTarget(NamedTuple):
    """A :class:`Target` that is only a name (the worker process's; ``trainer`` for the
    trainer) and a role (rollout, trainer, verifier or drafter); local mode's targets."""

    name: str
    role: str


@dataclass(frozen=True)
class Observation:
    """What one poll learnt about one worker, whatever the source (status report, Prometheus)."""

    busy: bool
    """The worker is generating (or its GPU is above the idle threshold)."""
    idle_seconds: float | None
    """How long it has been idle; None while busy or when unknown."""
    pending: bool = False
    """It still holds unfinished work (waiting sequences)."""
    observed: Activity | None = None
    """Activity the worker reports doing; None when the source cannot tell."""
    accepted_length: float | None = None
    """Mean accepted length the worker reports (its current drafter version)."""
    rollout_active: bool | None = None
    """The trainer's own report that a step's rollout is in progress; None from workers and
    from Prometheus."""
    step: int | None = None
    """The trainer's completed steps (which rollout is running); None from workers."""
    pending_workers: tuple[str, ...] = ()
    """The trainer's list of workers that still hold requests of the running rollout."""


@dataclass(frozen=True)
class RolloutState:
    """Whether a step's rollout is in progress, and which one when the trainer said so."""

    active: bool
    """A rollout is in progress (rule 1 of the module text)."""
    step: int | None = None
    """The trainer's completed steps when it reported; None when derived from the workers."""


def trainer_report(targets: Sequence[Target], obs: Mapping[str, Observation]) -> Observation | None:
    """The trainer's own observation among ``obs`` (when it is a target that answered)."""
    for t in targets:
        o = obs.get(t.name)
        if t.role == "trainer" and o is not None and o.rollout_active is not None:
            return o
    return None


def rollout_state(
    spec: HarvestSpec,
    targets: Sequence[Target],
    obs: Mapping[str, Observation],
    trainer: Observation | None,
) -> RolloutState:
    """Rule 1: the trainer's report when there is one, else some eligible worker is busy."""
    if trainer is not None and trainer.rollout_active is not None:
        return RolloutState(trainer.rollout_active, trainer.step)
    workers = [t for t in targets if t.role in spec.eligible_roles and t.role != "trainer"]
    return RolloutState(any(obs[t.name].busy for t in workers if t.name in obs))


def still_running(before: RolloutState, now: RolloutState | None) -> bool:
    """Whether the rollout seen in ``before`` is still the one running (the re-check); an
    unknown state (``now`` None: the re-read failed) counts as ended."""
    if now is None or not now.active:
        return False
    return before.step is None or now.step is None or now.step == before.step


def views(
    targets: Sequence[Target],
    assigned: Mapping[str, Activity],
    obs: Mapping[str, Observation],
    trainer: Observation | None,
) -> list[WorkerView]:
    """One :class:`WorkerView` per target: idleness from its own report (unknown when it did
    not answer), pending work from its report or the trainer's list (rule 3)."""
    listed = set(trainer.pending_workers) if trainer is not None else set()
    out = []
    for t in targets:
        o = obs.get(t.name)
        idle = o.idle_seconds if o is not None else None
        pending = (o is not None and o.pending) or (t.role != "trainer" and t.name in listed)
        out.append(WorkerView(t.name, t.role, assigned[t.name], idle, pending))
    return out
