"""Pure reconcile planning: observed state in, the status to write and the actions to take out.

``reconcile.py`` gathers an :class:`Observed` (the RLJob's parsed spec or its validation
errors, its previous status, its pods and other owned objects, the trainer's status, the
harvest loop's snapshot) and calls :func:`plan`; it then executes the returned :class:`Plan`
(create, update, delete, patch, checkpoint, write status, post events); both types are
``model.py``'s. One hop from a job to its pods: :func:`plan` decides the phase (a
``children.Stage``), ``children.desired`` gives every object the job should own now, and
``diff.diff`` against the observed objects gives the typed create / update / delete rows;
suspend, queueing, a finish and its TTL are smaller desired sets. The status is
``status.job_status`` of what was observed and of that diff. Level-triggered: the plan depends
only on what is observed now, never on which event woke the reconcile, so running it twice is
harmless.

The spec planned with is the one ``specgate.py`` chose: the edit as written, or, for an invalid
edit or a frozen field changed while the job runs, the last accepted spec (``SpecAccepted``
says which and why; the pods stay managed). Phase, in order of precedence: a finished job stays
finished; a job that never had a valid spec changes nothing (ValidationFailed; reason
``ChildRejected`` when the API server refuses objects made from it, ``Observed.rejected``);
``activeDeadlineSeconds`` passed -> Failed/DeadlineExceeded; the trainer
reports complete -> Succeeded, failed -> Failed/TrainerFailed; a role's failed pods exceed
``backoffLimit`` -> Failed/BackoffLimitExceeded (both operator-made failures first ask the
running trainer for a checkpoint, as suspend does); ``suspend`` -> Suspended; else Running when
every role's replicas are ready, Initializing while any pod exists, Pending before. A failed
pod's termination message (its last log lines: the pods use ``FallbackToLogsOnError``) goes into
a WorkerFailed event, which ``reconcile.py`` posts before it deletes the pod. With the harvest
loop polling, ``WorkersUnreachable`` is True while some worker keeps failing its status polls.
``IdlenessUnavailable`` (``harvest.source: prometheus``) is True while the Prometheus query
fails: nothing is harvested then.
The trainer pods are one group (``trainergroup.py``): one failed, exited or deleted trainer pod
restarts all of them, counted once against ``backoffLimit``; ``TrainerReady`` says why
(``TrainerGroupRestarting``) until the new group is ready, and ``status.trainer`` holds the
world size and the last restart. What each condition says, and the events their changes post,
is ``conditions.py``.
"""

from __future__ import annotations

import copy
from datetime import timedelta

from longtail_api.spec import RLJobSpec
from longtail_api.status import RoleStatus
from longtail_operator import children, diff, elastic, kueue, placement, status, trainergroup
from longtail_operator.children import Stage
from longtail_operator.conditions import (
    condition_events,
    condition_type,
    merge_conditions,
    spec_conditions,
)
from longtail_operator.model import RUNNING, TERMINAL, Event, Observed, Plan, PlanPhase
from longtail_operator.observe import parse_time, rfc3339
from longtail_operator.settings import Settings
from longtail_operator.trainergroup import GroupPlan

QUEUE_LABEL = kueue.QUEUE_LABEL
CHECKPOINT_BEFORE = {"BackoffLimitExceeded": "backoff-limit", "DeadlineExceeded": "deadline"}
"""Failures the operator decides (not the trainer): the running trainer is asked for a last
checkpoint before its pods go, so the run can be continued from it (checkpoint reason)."""


def _phase(
    obs: Observed, spec: RLJobSpec, roles: dict[str, RoleStatus]
) -> tuple[PlanPhase, str, str]:
    """(phase, reason, message) before readiness (``running``: ``status.readiness`` says)."""
    prev = obs.previous
    if prev.phase == "Succeeded" or prev.phase == "Failed":
        cond = next((c for c in prev.conditions if c.type in ("Failed", "Complete")), None)
        return prev.phase, cond.reason if cond else "Finished", cond.message if cond else ""
    start = parse_time(prev.start_time)
    deadline = spec.active_deadline_seconds
    if (
        deadline is not None
        and start is not None
        and obs.now - start >= timedelta(seconds=deadline)
    ):
        return "Failed", "DeadlineExceeded", f"ran longer than activeDeadlineSeconds={deadline}"
    if obs.trainer is not None and obs.trainer.phase == "complete":
        return "Succeeded", "TrainingComplete", f"{obs.trainer.step} RL steps done"
    if obs.trainer is not None and obs.trainer.phase == "failed":
        return "Failed", "TrainerFailed", obs.trainer.message or "the trainer reported failure"
    for role, rs in roles.items():
        if rs.failed > spec.backoff_limit:
            what = "trainer group restarts" if role == "trainer" else f"{role} pods failed"
            msg = f"{rs.failed} {what}, over backoffLimit={spec.backoff_limit}"
            return "Failed", "BackoffLimitExceeded", msg
    if obs.queue is not None and (obs.kueue_served is not True or not obs.kueue_enabled):
        return ("Queued", *placement.queue_wait(obs))
    if spec.suspend:
        return "Suspended", "JobSuspended", "spec.suspend is true"
    return RUNNING, "", ""


def _invalid(obs: Observed) -> Plan:
    """A job that never had a valid spec: conditions only, nothing else touched."""
    st = copy.deepcopy(obs.previous)
    st.observed_generation = obs.job.generation
    want: dict[str, tuple[str, str, str]] = {
        c.type: (c.status, c.reason, c.message) for c in st.conditions
    }
    want.update(spec_conditions(obs))
    now = rfc3339(obs.now)
    st.conditions, changed = merge_conditions(st.conditions, want, now, obs.job.generation)
    return Plan(status=st, events=condition_events(obs.previous.conditions, changed))


def _trainer_runs(obs: Observed) -> bool:
    """Whether trainer pod 0 runs with an address (it can be asked for a checkpoint)."""
    return any(
        q.role == "trainer" and q.index == 0 and q.ip and q.phase == "Running" for q in obs.pods
    )


def _last_checkpoint(obs: Observed, p: Plan) -> bool:
    """Whether trainer pod 0 runs and this plan deletes it: ask it for a checkpoint first."""
    trainer = [q for q in obs.pods if q.role == "trainer" and q.index == 0 and q.ip]
    trainer = [q for q in trainer if q.phase == "Running"]
    return bool(trainer) and trainer[0].name in p.delete_pods


def _stage(
    obs: Observed,
    spec: RLJobSpec,
    settings: Settings,
    group: GroupPlan | None,
    roles: dict[str, RoleStatus],
) -> tuple[Stage, str, str]:
    """The phase decided before readiness, with its reason and message (``running``: the job's
    pods are wanted; a job Kueue has not admitted is ``Queued``)."""
    decided, reason, message = _phase(obs, spec, roles)
    want_workload = placement.workload(obs, spec, settings)
    wait = placement.admission_wait(obs, want_workload) if decided == RUNNING else None
    if wait is not None:
        decided, (reason, message) = "Queued", wait
    elif decided == RUNNING and want_workload is not None and elastic.past_grace(obs, spec):
        decided, reason = "Queued", elastic.BELOW  # admitted: gives its quota back
        grace = spec.rollout.below_min_grace_seconds
        message = (
            f"fewer than rollout.minReplicas={spec.rollout.fewest()} rollout workers ready for "
            f"over belowMinGraceSeconds={grace:g}: the job checkpoints, gives its Kueue quota "
            "back and waits to be admitted again"
        )
    done = obs.previous.completion_time
    if decided in TERMINAL:
        done = done or rfc3339(obs.now)
    return Stage(decided, group, want_workload, done), reason, message


def plan(obs: Observed, settings: Settings) -> Plan:
    """Everything to do for one RLJob now (see the module text)."""
    if obs.spec is None:
        return _invalid(obs)
    spec = obs.spec
    failed_now = [q for q in obs.pods if q.phase == "Failed" and q.uid not in obs.counted]
    new_failed = [q for q in failed_now if elastic.charged(q, spec)]
    group = _trainer_group(obs, spec)
    roles = status.roles(obs, spec, new_failed, group)
    stage, reason, message = _stage(obs, spec, settings, group, roles)
    running = stage.phase == RUNNING
    wanted = children.desired(obs, spec, settings, stage)
    p = Plan(status=obs.previous, changes=diff.diff(wanted, diff.observed(obs)))
    p.counted = [q.uid for q in failed_now]
    for q in new_failed:
        p.events.append(Event("Warning", "WorkerFailed", f"pod {q.name} failed: {q.message}"))
    if group is not None and running:
        if group.event is not None:
            p.events.append(Event(*group.event))
        if group.checkpoint:  # a healthy group's world changed
            p.checkpoint, p.checkpoint_reason = True, "resize"
    p.events.extend(
        Event("Normal", "ConfigUpdated", c.reason) for c in p.changes if c.op == "update"
    )
    if stage.phase in ("Suspended", "Queued"):  # a queue label on a running job stops it, safely
        below = reason == elastic.BELOW
        p.checkpoint = _last_checkpoint(obs, p)
        p.checkpoint_reason = elastic.CHECKPOINT_REASON if below else "suspend"
    elif running and not p.checkpoint and stage.workload is None and elastic.past_grace(obs, spec):
        p.checkpoint, p.checkpoint_reason = _trainer_runs(obs), elastic.CHECKPOINT_REASON
    if stage.phase == "Failed" and reason in CHECKPOINT_BEFORE:  # also while its pods go
        p.checkpoint, p.checkpoint_reason = _last_checkpoint(obs, p), CHECKPOINT_BEFORE[reason]
    finished = stage.phase in TERMINAL and children.ttl_passed(obs, spec, stage)
    if finished and any(c.op == "delete" for c in p.changes):
        ttl = spec.ttl_seconds_after_finished
        msg = f"ttlSecondsAfterFinished={ttl} passed: deleted pods, Services and ConfigMap"
        p.events.append(Event("Normal", "CleanedUp", msg))
    release = message if reason == elastic.BELOW else None
    placement.workload_actions(obs, spec, p, stage.phase, message, stage.workload, release)
    p.status, events = status.job_status(obs, spec, stage, p, roles, reason, message)
    p.events.extend(events)
    return p


def _trainer_group(obs: Observed, spec: RLJobSpec) -> GroupPlan | None:
    """The trainer group's plan, unless the job is finished or suspended (all pods go)."""
    if obs.previous.phase in TERMINAL or spec.suspend:
        return None
    cond = next((c for c in obs.previous.conditions if c.type == condition_type("trainer")), None)
    return trainergroup.plan_group(
        obs.pods,
        spec,
        obs.job.name,
        obs.previous.trainer,
        cond is not None and cond.reason == trainergroup.RESTARTING,
        rfc3339(obs.now),
    )
