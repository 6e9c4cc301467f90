"""Pure reconcile planning: observed state in, the status to write and the actions to take out.

``reconcile.py`` gathers an :class:`Observed` (the RLJob's parsed spec or its validation
errors, its previous status, its pods/Services/ConfigMap, the trainer's status, the harvest
loop's snapshot) and calls :func:`plan`; it then executes the returned :class:`Plan` (create,
delete, checkpoint, write status, post events); both types are ``model.py``'s.
Level-triggered: the plan depends only on what is observed now, never on which event woke the
reconcile, so running it twice is harmless.

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
from longtail_api.status import Phase, RLJobStatus, RoleStatus
from longtail_operator import access, builders, kueue, placement, trainergroup
from longtail_operator.conditions import (
    condition_events,
    condition_type,
    job_conditions,
    merge_conditions,
    spec_conditions,
)
from longtail_operator.model import RUNNING, TERMINAL, Event, Observed, Plan, PlanPhase
from longtail_operator.observe import PodView, parse_time, rfc3339
from longtail_operator.settings import Settings
from longtail_operator.trainergroup import GroupPlan

QUEUE_LABEL = kueue.QUEUE_LABEL
CHECKPOINT_BEFORE = {"BackoffLimitExceeded": "backoff-limit", "DeadlineExceeded": "deadline"}
"""Failures the operator decides (not the trainer): the running trainer is asked for a last
checkpoint before its pods go, so the run can be continued from it (checkpoint reason)."""


def _phase(
    obs: Observed, spec: RLJobSpec, roles: dict[str, RoleStatus]
) -> tuple[PlanPhase, str, str]:
    """(phase, reason, message) before readiness (``running``: resolved by :func:`_readiness`)."""
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


def _roles(
    obs: Observed, spec: RLJobSpec, new_failed: list[PodView], group: GroupPlan | None
) -> dict[str, RoleStatus]:
    """Readiness and failures per role; the trainer's failures are its group's counted
    restarts and its ready pods those of the current group."""
    out: dict[str, RoleStatus] = {}
    for role, rs in builders.role_specs(spec).items():
        prev = obs.previous.roles.get(role)
        failed = (prev.failed if prev else 0) + sum(1 for p in new_failed if p.role == role)
        ready = sum(1 for p in obs.pods if p.role == role and p.ready and p.active)
        if role == "trainer" and group is not None:
            failed, ready = (prev.failed if prev else 0) + group.counted, group.ready
        out[role] = RoleStatus(ready=min(ready, rs.replicas), total=rs.replicas, failed=failed)
    return out


def _workers(
    obs: Observed,
    spec: RLJobSpec,
    settings: Settings,
    p: Plan,
    group: GroupPlan | None,
) -> None:
    """Fill the plan's pod creations/deletions for a job that runs (``group``: the trainer
    group's plan) or stops running (None: every pod goes)."""
    desired = builders.desired_pods(spec) if group is not None else {}
    present = {f"{pod.role}-{pod.index}": pod for pod in obs.pods}
    for pod in obs.pods:
        key = f"{pod.role}-{pod.index}"
        if pod.deleting or (pod.role == "trainer" and group is not None):
            continue  # the trainer group's pods are planned as a whole
        if key not in desired or pod.phase in ("Failed", "Succeeded"):
            p.delete_pods.append(pod.name)
    if group is None:
        return
    p.delete_pods.extend(group.delete)
    # Absent pods only: one still being deleted is recreated once it is gone.
    wanted = [(r, i) for key, (r, i) in desired.items() if r != "trainer" and key not in present]
    wanted = [("trainer", i) for i in group.create] + wanted
    versions = obs.previous
    for role, index in wanted:
        p.create.append(
            builders.worker_pod(
                obs.job,
                spec,
                settings,
                role,
                index,
                min_policy_version=versions.policy_version,
                min_drafter_version=versions.drafter.version if versions.drafter.version else -1,
                trainer_group=group.status.restarts,
            )
        )


def _support_objects(obs: Observed, spec: RLJobSpec, settings: Settings, p: Plan) -> None:
    roles = builders.role_specs(spec)
    for role in roles:
        if builders.service_name(obs.job.name, role) not in obs.services:
            p.create.append(builders.role_service(obs.job, role, settings))
    for role in builders.ROLES:
        name = builders.service_name(obs.job.name, role)
        if role not in roles and name in obs.services:
            p.delete_objects.append(("Service", name))
    if settings.network_policy and obs.network_policy is False:
        p.create.append(access.network_policy(obs.job, settings))
    if settings.network_policy and obs.trainer_policy is False:
        p.create.append(access.trainer_network_policy(obs.job))
    _weight_sync_policy(obs, spec, settings, p)
    cm = builders.job_configmap(obs.job, obs.raw_spec)
    if obs.configmap is None:
        p.create.append(cm)
    elif obs.configmap != cm["data"]:
        p.update.append(cm)
        p.events.append(Event("Normal", "ConfigUpdated", "rendered job config changed"))


def _weight_sync_policy(obs: Observed, spec: RLJobSpec, settings: Settings, p: Plan) -> None:
    """The weight-sync policy exists exactly while the accepted spec's transport resolves to
    ``broadcast`` (a frozen field: it changes only while the job is suspended, when no pod
    depends on the policy)."""
    if not settings.network_policy:
        return
    broadcast = spec.weight_sync_transport() == "broadcast"
    if broadcast and obs.weight_sync_policy is False:
        p.create.append(access.weight_sync_network_policy(obs.job, settings))
    elif not broadcast and obs.weight_sync_policy:
        p.delete_objects.append(("NetworkPolicy", access.weight_sync_policy_name(obs.job.name)))


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


def _last_checkpoint(obs: Observed, p: Plan) -> bool:
    """Whether trainer pod 0 runs and this plan deletes it: ask it for a checkpoint first."""
    trainer = [q for q in obs.pods if q.role == "trainer" and q.index == 0 and q.ip]
    trainer = [q for q in trainer if q.phase == "Running"]
    return bool(trainer) and trainer[0].name in p.delete_pods


def plan(obs: Observed, settings: Settings) -> Plan:
    """Everything to do for one RLJob now (see the module text)."""
    if obs.spec is None:
        return _invalid(obs)
    spec, prev = obs.spec, obs.previous
    st = copy.deepcopy(prev)
    st.observed_generation = obs.job.generation
    p = Plan(status=st)
    new_failed = [q for q in obs.pods if q.phase == "Failed" and q.uid not in obs.counted]
    p.counted = [q.uid for q in new_failed]
    for q in new_failed:
        p.events.append(Event("Warning", "WorkerFailed", f"pod {q.name} failed: {q.message}"))
    group = _trainer_group(obs, spec)
    st.roles = _roles(obs, spec, new_failed, group)
    ready = sum(r.ready for r in st.roles.values())
    st.ready = f"{ready}/{sum(r.total for r in st.roles.values())}"
    decided, reason, message = _phase(obs, spec, st.roles)
    want_workload = placement.workload(obs, spec, settings)
    wait = placement.admission_wait(obs, want_workload) if decided == RUNNING else None
    if wait is not None:
        decided, (reason, message) = "Queued", wait
    running = decided == RUNNING
    _workers(obs, spec, settings, p, group if running else None)
    placement.gang_group(obs, spec, settings, p, running)
    if running and obs.workload is not None:  # admitted: where Kueue placed each podSet
        for m in p.create:
            role = m["metadata"]["labels"].get(builders.LABEL_ROLE)
            if m["kind"] == "Pod" and role in obs.workload.placements:
                kueue.place(m, role, obs.workload.placements[role])
    st.trainer = trainergroup.group_status(spec, prev.trainer)
    if group is not None:  # a restart is recorded even when it exceeds backoffLimit
        st.trainer = group.status
        if group.event is not None and running:
            p.events.append(Event(*group.event))
        if running and group.checkpoint:  # a healthy group's world changed
            p.checkpoint, p.checkpoint_reason = True, "resize"
    if not running:
        st.trainer.formed = False  # every pod goes: the next group is made from scratch
    if running or decided in ("Suspended", "Queued"):
        _support_objects(obs, spec, settings, p)
    if decided in ("Suspended", "Queued"):  # a queue label on a running job stops it, safely
        p.checkpoint, p.checkpoint_reason = _last_checkpoint(obs, p), "suspend"
        st.start_time = None  # the deadline restarts on resume, as for Kubernetes Jobs
    if decided == "Failed" and reason in CHECKPOINT_BEFORE:  # also while its pods go
        p.checkpoint, p.checkpoint_reason = _last_checkpoint(obs, p), CHECKPOINT_BEFORE[reason]
    phase: Phase
    if decided == RUNNING:
        phase, reason = _readiness(obs, st, p)
    else:
        phase = decided
    if phase in TERMINAL:
        st.completion_time = st.completion_time or rfc3339(obs.now)
        _ttl(obs, spec, p)
    placement.workload_actions(obs, spec, p, phase, message, want_workload)
    _copy_progress(obs, spec, st)
    _accounting(obs, spec, st, p)
    if phase != prev.phase:
        kind = "Warning" if phase == "Failed" else "Normal"
        p.events.append(Event(kind, f"Job{phase}", message or f"phase {prev.phase} -> {phase}"))
    st.phase = phase
    restarting = group.restarting if group is not None else None
    want = job_conditions(obs, spec, phase, reason, message, st.roles, restarting)
    st.conditions, changed = merge_conditions(
        prev.conditions, want, rfc3339(obs.now), obs.job.generation
    )
    p.events.extend(condition_events(prev.conditions, changed))
    _action_events(obs, p)
    return p


def _readiness(obs: Observed, st: RLJobStatus, p: Plan) -> tuple[Phase, str]:
    """The status phase of a running job, and its reason: Running when every role's replicas
    are ready, Initializing while any pod exists or is created, Pending before; the deadline's
    clock starts with the first pod."""
    creating = sum(1 for m in p.create if m["kind"] == "Pod")
    all_ready = all(r.ready >= r.total for r in st.roles.values())
    alive = any(q.active for q in obs.pods) or creating
    if alive and st.start_time is None:
        st.start_time = rfc3339(obs.now)
    if all_ready and not creating:
        return "Running", "AllRolesReady"
    return ("Initializing", "PodsStarting") if alive else ("Pending", "NoPods")


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


def _ttl(obs: Observed, spec: RLJobSpec, p: Plan) -> None:
    ttl = spec.ttl_seconds_after_finished
    done = parse_time(p.status.completion_time)
    if ttl is None or done is None or obs.now - done < timedelta(seconds=ttl):
        return
    objects = [("Service", s) for s in sorted(obs.services)]
    if obs.configmap is not None:
        objects.append(("ConfigMap", builders.configmap_name(obs.job.name)))
    if obs.network_policy:
        objects.append(("NetworkPolicy", access.network_policy_name(obs.job.name)))
    if obs.trainer_policy:
        objects.append(("NetworkPolicy", access.trainer_policy_name(obs.job.name)))
    if obs.weight_sync_policy:
        objects.append(("NetworkPolicy", access.weight_sync_policy_name(obs.job.name)))
    if objects or p.delete_pods:
        p.delete_objects.extend(objects)
        msg = f"ttlSecondsAfterFinished={ttl} passed: deleted pods, Services and ConfigMap"
        p.events.append(Event("Normal", "CleanedUp", msg))


def _copy_progress(obs: Observed, spec: RLJobSpec, st: RLJobStatus) -> None:
    t = obs.trainer
    if st.total_steps is None:
        st.total_steps = spec.algorithm.total_steps
    if t is not None:
        st.step, st.total_steps, st.policy_version = t.step, t.total_steps, t.policy_version
        st.reward_mean = t.reward_mean
        version = max(0, t.drafter_version)
        if version > st.drafter.version:
            st.drafter.last_trained = rfc3339(obs.now)
        st.drafter.version = version
        if t.accepted_length is not None:
            st.drafter.acceptance_length = t.accepted_length
        if t.figures_step is not None:  # a completed step's split (empty: none speculated)
            st.drafter.acceptance_length_by_source = dict(t.accepted_length_by_source)
            st.drafter.sd_fraction_by_source = dict(t.sd_fraction_by_source)
        merges = t.drafter_merges
        st.drafter.unpublished = merges.unpublished if merges is not None else None
        if t.worker_policy_versions:  # empty from a trainer that has not called them yet
            st.weight_sync.worker_policy_versions = dict(t.worker_policy_versions)
    st.weight_sync.transport = spec.weight_sync_transport()
    h = obs.harvest
    if h is not None and h.accepted_length is not None and (t is None or t.accepted_length is None):
        st.drafter.acceptance_length = h.accepted_length


def _accounting(obs: Observed, spec: RLJobSpec, st: RLJobStatus, p: Plan) -> None:
    deleting = set(p.delete_pods)
    gpus = sum(
        builders.gpus_of(spec, q.role)
        for q in obs.pods
        if q.active and q.name not in deleting and q.role in builders.role_specs(spec)
    )
    gpus += sum(
        builders.gpus_of(spec, m["metadata"]["labels"][builders.LABEL_ROLE])
        for m in p.create
        if m["kind"] == "Pod"
    )
    st.gpus.total = gpus
    h = obs.harvest
    running = st.phase not in TERMINAL and not spec.suspend
    st.gpus.idle = h.idle_gpus if h is not None and running else 0
    st.gpus.harvested = h.harvested_gpus if h is not None and running else 0
    # Dedicated drafter pods train the drafter all the time: counted from their readiness (as
    # roles.drafter.ready), not from the harvest loop, which polls and switches only the
    # harvest targets and runs only with harvest.enabled.
    drafters = st.roles.get("drafter")
    ready = drafters.ready if drafters is not None and running else 0
    st.gpus.drafter = ready * builders.gpus_of(spec, "drafter") if ready else 0
    if h is not None:
        st.gpus.harvested_gpu_seconds = max(st.gpus.harvested_gpu_seconds, h.harvested_gpu_seconds)
    st.workers = list(h.workers) if h is not None and running else []


def _action_events(obs: Observed, p: Plan) -> None:
    pods = [m["metadata"]["name"] for m in p.create if m["kind"] == "Pod"]
    if pods:
        shown = ", ".join(pods[:8]) + (f" and {len(pods) - 8} more" if len(pods) > 8 else "")
        p.events.append(Event("Normal", "CreatedPods", f"created {len(pods)} pods: {shown}"))
    if p.delete_pods:
        shown = ", ".join(p.delete_pods[:8])
        more = f" and {len(p.delete_pods) - 8} more" if len(p.delete_pods) > 8 else ""
        p.events.append(
            Event("Normal", "DeletedPods", f"deleted {len(p.delete_pods)} pods: {shown}{more}")
        )
