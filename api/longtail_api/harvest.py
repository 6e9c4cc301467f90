"""The harvest decision: which idle workers train the drafter right now.

One pure function, :func:`decide`, shared by the operator's harvest loop (cluster) and the local
coordinator (``longtail run``), so both make exactly the same choices. Callers gather a
:class:`WorkerView` per worker from their idleness source (the workers' own status reports, or
Prometheus over DCGM metrics), call :func:`decide`, send the returned role changes, and record
them as assigned; re-sending and acknowledgement tracking are the caller's job, so a decision
that was already assigned is never returned again.

Rules, in order (TLT: train the drafter on GPUs that would otherwise wait for the long tail):

1. Outside a step's rollout, or with harvest disabled, every worker does its role's own work.
2. Only roles in ``eligibleRoles`` are harvested.
3. A harvested worker keeps training until the rollout ends, unless work is handed to it again
   (prompts re-dispatched after another worker failed): then it goes back to its own work.
4. A worker with no pending work that has been idle for at least ``idleSeconds`` (idle: the
   worker reports no work in progress, or its GPU is at or below the utilisation threshold) is
   switched to ``drafter-train``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

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
