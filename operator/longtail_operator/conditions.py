"""The RLJob's conditions: what each says for the observed state, and the events their changes post.

``derive.plan`` calls :func:`job_conditions` with the phase it decided (and
:func:`spec_conditions` alone for a job that never had a valid spec), then
:func:`merge_conditions` to keep each condition's ``lastTransitionTime`` unless its status
changed, and :func:`condition_events` for the events of the changed ones. Pure, like
``derive.py``: observed state in, conditions out.
"""

from __future__ import annotations

from longtail_api.spec import RLJobSpec
from longtail_api.status import SPEC_ACCEPTED, Condition, RoleStatus
from longtail_operator import placement, trainergroup
from longtail_operator.model import TERMINAL, Event, Observed
from longtail_operator.specgate import INVALID, REJECTED

WARNING_REASONS = frozenset(
    {
        "InvalidSpec",
        "ImmutableFieldChanged",
        "DrafterStale",
        "DeadlineExceeded",
        "TrainerFailed",
        "BackoffLimitExceeded",
        "WorkerFailed",
        "CheckpointFailed",
        "RoleSwitchUnacknowledged",
        "JobFailed",
        "WorkersUnreachable",
        "IdlenessSourceFailing",
        "KueueNotInstalled",
        "ChildRejected",
        "TrackerFailing",
    }
)
"""Event reasons posted as ``Warning``; every other reason is ``Normal``."""


def condition_type(role: str) -> str:
    return f"{role.capitalize()}Ready"


def job_conditions(
    obs: Observed,
    spec: RLJobSpec,
    phase: str,
    reason: str,
    message: str,
    roles: dict[str, RoleStatus],
    restarting: str | None,
) -> dict[str, tuple[str, str, str]]:
    want: dict[str, tuple[str, str, str]] = {}
    finished = phase in TERMINAL
    for role, rs in roles.items():
        if role == "trainer" and restarting is not None and not finished:
            want[condition_type(role)] = ("False", trainergroup.RESTARTING, restarting)
        elif finished:
            want[condition_type(role)] = ("False", "JobFinished", f"job {phase.lower()}")
        elif phase == "Suspended":
            want[condition_type(role)] = ("False", "JobSuspended", "worker pods deleted")
        elif phase == "Queued":
            want[condition_type(role)] = ("False", "JobQueued", "waiting for admission")
        elif rs.ready >= rs.total:
            want[condition_type(role)] = (
                "True",
                "AllReplicasReady",
                f"{rs.ready}/{rs.total} ready",
            )
        else:
            waits = placement.topology_wait(obs, spec, role)
            want[condition_type(role)] = (
                "False",
                "ReplicasNotReady",
                f"{rs.ready}/{rs.total} ready" + (f"; {waits}" if waits else ""),
            )
    want["DrafterTraining"] = _drafter_condition(obs, spec, phase, roles)
    reach = _reachability(obs, phase)
    if reach is not None:
        want["WorkersUnreachable"] = reach
    if phase == "Queued":
        want["Queued"] = ("True", reason, message)
    elif any(c.type == "Queued" for c in obs.previous.conditions):
        want["Queued"] = placement.not_queued(obs, phase)
    want.update(placement.kueue_conditions(obs))
    idleness = _idleness(obs, phase)
    if idleness is not None:
        want["IdlenessUnavailable"] = idleness
    tracker = _tracking(obs, spec, phase)
    if tracker is not None:
        want["TrackerUnavailable"] = tracker
    collapsed = _acceptance(obs, phase)
    if collapsed is not None:
        want["AcceptanceCollapsed"] = collapsed
    if spec.suspend or any(c.type == "Suspended" for c in obs.previous.conditions):
        if spec.suspend and not finished:
            want["Suspended"] = ("True", "JobSuspended", "spec.suspend is true")
        else:
            want["Suspended"] = ("False", "JobResumed", "spec.suspend is false")
    if phase == "Succeeded":
        want["Complete"] = ("True", reason, message)
    if phase == "Failed":
        want["Failed"] = ("True", reason, message)
    want.update(spec_conditions(obs))
    return want


def spec_conditions(obs: Observed) -> dict[str, tuple[str, str, str]]:
    """``ValidationFailed`` (the edit's errors, or the API server's refusals of objects made
    from it; shown once it was True) and ``SpecAccepted`` (whether the job runs the spec as
    written, ``specgate.py``)."""
    want: dict[str, tuple[str, str, str]] = {}
    if obs.errors or obs.rejected or obs.spec is None:
        errors = "; ".join((*obs.errors, *obs.rejected)) or "the spec could not be parsed"
        reason = REJECTED if obs.rejected and not obs.errors else INVALID
        want["ValidationFailed"] = ("True", reason, errors[:32000])
    elif any(c.type == "ValidationFailed" for c in obs.previous.conditions):
        want["ValidationFailed"] = ("False", "SpecValid", "the spec passed validation")
    gate = obs.gate
    if gate is None or gate.accepted:
        want[SPEC_ACCEPTED] = ("True", "Accepted", "the job runs the spec as written")
    else:
        want[SPEC_ACCEPTED] = ("False", gate.reason, gate.message)
    return want


def condition_events(previous: list[Condition], changed: list[Condition]) -> list[Event]:
    """Events of changed conditions, without repeats: an invalid edit is told once (by
    ``ValidationFailed``, with its errors), and a job's first ``SpecAccepted`` True is no news."""
    had = {c.type for c in previous}
    return [
        _event_for(c)
        for c in changed
        if c.type != SPEC_ACCEPTED
        or (c.reason not in (INVALID, REJECTED) and (c.status == "False" or SPEC_ACCEPTED in had))
    ]


def _drafter_condition(
    obs: Observed, spec: RLJobSpec, phase: str, roles: dict[str, RoleStatus]
) -> tuple[str, str, str]:
    h = obs.harvest
    if phase != "Running" and phase != "Initializing":
        return ("False", "JobNotRunning", f"job is {phase}")
    if h is not None and h.unacknowledged:
        names = ", ".join(h.unacknowledged[:5])
        return ("False", "RoleSwitchUnacknowledged", f"waiting for {names} to acknowledge")
    dedicated = roles["drafter"].ready if "drafter" in roles else 0
    if h is not None and h.training_workers:
        also = f", and {dedicated} dedicated drafter pods" if dedicated else ""
        text = f"{h.training_workers} workers train the drafter{also}"
        return ("True", "IdleGpusHarvested", text)
    if dedicated:
        return ("True", "DedicatedDrafters", f"{dedicated} drafter pods ready")
    if not spec.harvest.enabled or not spec.drafter_training.enabled:
        return ("False", "HarvestDisabled", "harvest or drafterTraining is disabled")
    return ("False", "NoIdleWorkers", "no worker is idle long enough to be harvested")


def _acceptance(obs: Observed, phase: str) -> tuple[str, str, str] | None:
    """``AcceptanceCollapsed``: once the trainer reports a collapse (or it was shown before)."""
    t = obs.trainer
    old = next((c for c in obs.previous.conditions if c.type == "AcceptanceCollapsed"), None)
    if old is None and (t is None or not t.acceptance_collapsed):
        return None
    if t is not None and t.acceptance_collapsed and phase in ("Running", "Initializing"):
        text = (
            f"speculative decoding accepts almost nothing (mean accepted length "
            f"{t.accepted_length or 0:.2f}) after it once worked: the drafter no longer matches "
            "the policy; check the trainer log for refused drafter candidates"
        )
        return ("True", "DrafterStale", text)
    if t is None and old is not None:  # the trainer did not answer: keep what was shown
        return (old.status, old.reason, old.message)
    return ("False", "DrafterAccepted", "speculation accepts drafts")


def _reachability(obs: Observed, phase: str) -> tuple[str, str, str] | None:
    """``WorkersUnreachable``: only once the harvest loop polls (or it was shown before)."""
    h = obs.harvest
    if h is None and not any(c.type == "WorkersUnreachable" for c in obs.previous.conditions):
        return None
    if phase not in ("Running", "Initializing"):
        return ("False", "JobNotRunning", f"job is {phase}")
    if h is not None and h.unreachable:
        shown = "; ".join(u[:200] for u in h.unreachable[:5])
        more = f" and {len(h.unreachable) - 5} more" if len(h.unreachable) > 5 else ""
        text = f"{len(h.unreachable)} worker(s) fail their status polls: {shown}{more}"
        return ("True", "WorkersUnreachable", text)
    return ("False", "WorkersAnswer", "every polled worker answers GET /v1/status")


def _idleness(obs: Observed, phase: str) -> tuple[str, str, str] | None:
    """``IdlenessUnavailable``: once a Prometheus source is polled (or it was shown before).
    True while its query fails: nothing is harvested then (no fall-back to another source)."""
    h = obs.harvest
    shown = any(c.type == "IdlenessUnavailable" for c in obs.previous.conditions)
    if not shown and (h is None or h.source != "prometheus"):
        return None
    if phase not in ("Running", "Initializing"):
        return ("False", "JobNotRunning", f"job is {phase}")
    if h is not None and h.source_error is not None:
        text = f"{h.source_error[:900]}; no GPU is harvested until it answers"
        return ("True", "IdlenessSourceFailing", text)
    if h is None:  # not polled since (e.g. the operator restarted): keep what was shown
        old = next(c for c in obs.previous.conditions if c.type == "IdlenessUnavailable")
        return (old.status, old.reason, old.message)
    return ("False", "IdlenessRead", f"the {h.source} source answers")


def _tracking(obs: Observed, spec: RLJobSpec, phase: str) -> tuple[str, str, str] | None:
    """``TrackerUnavailable``: for a job with ``spec.tracking`` (or once shown). True while the
    trainer reports a tracker whose last attempt failed: training goes on, its records wait in
    a bounded buffer and are sent when the tracker answers again."""
    shown = any(c.type == "TrackerUnavailable" for c in obs.previous.conditions)
    if not shown and not spec.tracking.backends():
        return None
    if phase not in ("Running", "Initializing"):
        return ("False", "JobNotRunning", f"job is {phase}")
    if obs.trainer is None:  # not read this time: keep what was shown
        old = next((c for c in obs.previous.conditions if c.type == "TrackerUnavailable"), None)
        return None if old is None else (old.status, old.reason, old.message)
    failing = obs.trainer.tracking_failing
    if failing:
        text = "; ".join(f"{name}: {error[:300]}" for name, error in sorted(failing.items()))
        return ("True", "TrackerFailing", f"{text}; training goes on, the records wait")
    return ("False", "TrackersAnswer", "every experiment tracker takes the trainer's records")


def merge_conditions(
    previous: list[Condition], want: dict[str, tuple[str, str, str]], now: str, generation: int
) -> tuple[list[Condition], list[Condition]]:
    """New condition list (lastTransitionTime kept unless status changed) and the conditions
    whose status or reason changed (each becomes an Event)."""
    prev = {c.type: c for c in previous}
    out, changed = [], []
    for ctype, (status, reason, message) in want.items():
        old = prev.get(ctype)
        moved = old is None or old.status != status
        cond = Condition(
            type=ctype,
            status=status,  # type: ignore[arg-type]
            reason=reason,
            last_transition_time=now if moved or old is None else old.last_transition_time,
            message=message,
            observed_generation=generation,
        )
        out.append(cond)
        if moved or (old is not None and old.reason != reason):
            changed.append(cond)
    return out, changed


def _event_for(cond: Condition) -> Event:
    warn = cond.reason in WARNING_REASONS or (
        cond.status == "True" and cond.type in ("Failed", "ValidationFailed")
    )
    text = f"{cond.type} is {cond.status}: {cond.message}".rstrip(": ")
    return Event("Warning" if warn else "Normal", cond.reason, text)
