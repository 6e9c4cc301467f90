"""The RLJob's status as a pure function of what was observed and of the diff about to be done.

``derive.plan`` decides the phase (a ``children.Stage``) and the changes (``diff.py``), then
calls :func:`job_status` for the status to write and the events that go with it: readiness
per role (the trainer's from its group's plan), the status phase of a running job
(:func:`readiness`: Running, Initializing or Pending, counting the pods the diff creates), the
deadline's and completion's clocks, the trainer's progress and the drafter's figures
(:func:`copy_progress`), the GPU accounting (:func:`accounting`: pods alive and not deleted by
the diff, plus those it creates), the conditions (``conditions.py``) and the events of a phase
change and of the pods created and deleted.
"""

from __future__ import annotations

import copy

from longtail_api.spec import RLJobSpec
from longtail_api.status import Phase, RLJobStatus, RoleStatus
from longtail_operator import elastic, naming, trainergroup
from longtail_operator.children import Stage
from longtail_operator.conditions import condition_events, job_conditions, merge_conditions
from longtail_operator.model import RUNNING, TERMINAL, Event, Observed, Plan
from longtail_operator.observe import PodView, rfc3339
from longtail_operator.trainergroup import GroupPlan


def roles(
    obs: Observed, spec: RLJobSpec, new_failed: list[PodView], group: GroupPlan | None
) -> dict[str, RoleStatus]:
    """Readiness and failures per role; the trainer's failures are its group's counted
    restarts and its ready pods those of the current group."""
    out: dict[str, RoleStatus] = {}
    for role, rs in naming.role_specs(spec).items():
        prev = obs.previous.roles.get(role)
        failed = (prev.failed if prev else 0) + sum(1 for p in new_failed if p.role == role)
        ready = sum(1 for p in obs.pods if p.role == role and p.ready and p.active)
        if role == "trainer" and group is not None:
            failed, ready = (prev.failed if prev else 0) + group.counted, group.ready
        out[role] = RoleStatus(ready=min(ready, rs.replicas), total=rs.replicas, failed=failed)
    return out


def job_status(
    obs: Observed,
    spec: RLJobSpec,
    stage: Stage,
    p: Plan,
    role_status: dict[str, RoleStatus],
    reason: str,
    message: str,
) -> tuple[RLJobStatus, list[Event]]:
    """The status to write after ``p`` and the events of its changes (see the module text)."""
    prev = obs.previous
    st = copy.deepcopy(prev)
    st.observed_generation = obs.job.generation
    st.roles = role_status
    ready = sum(r.ready for r in st.roles.values())
    st.ready = f"{ready}/{sum(r.total for r in st.roles.values())}"
    group = stage.group
    st.trainer = (
        group.status if group is not None else trainergroup.group_status(spec, prev.trainer)
    )
    if stage.phase != RUNNING:
        st.trainer.formed = False  # every pod goes: the next group is made from scratch
    if stage.phase in ("Suspended", "Queued"):
        st.start_time = None  # the deadline restarts on resume, as for Kubernetes Jobs
    phase: Phase
    if stage.phase == RUNNING:
        phase, reason = readiness(obs, st, p, elastic.fewest(spec))
    else:
        phase = stage.phase
    if phase in TERMINAL:
        st.completion_time = stage.completion_time
    copy_progress(obs, spec, st)
    accounting(obs, spec, st, p)  # before the phase is set: it counts on the previous one
    st.phase = phase
    events: list[Event] = []
    if phase != prev.phase:
        kind = "Warning" if phase == "Failed" else "Normal"
        events.append(Event(kind, f"Job{phase}", message or f"phase {prev.phase} -> {phase}"))
    w = obs.workload
    holds = stage.phase == RUNNING or (
        reason == elastic.BELOW and w is not None and w.holds_admission
    )
    st.rollout, shrunk = elastic.capacity(obs, spec, stage.phase, holds)
    events.extend(shrunk)
    restarting = group.restarting if group is not None else None
    want = job_conditions(obs, spec, phase, reason, message, st.roles, restarting)
    want.update(elastic.condition(spec, st.rollout, phase, stage.workload is not None))
    st.conditions, changed = merge_conditions(
        prev.conditions, want, rfc3339(obs.now), obs.job.generation
    )
    events.extend(condition_events(prev.conditions, changed))
    events.extend(action_events(p))
    return st, events


def readiness(
    obs: Observed, st: RLJobStatus, p: Plan, fewest: dict[str, int] | None = None
) -> tuple[Phase, str]:
    """The status phase of a running job, and its reason: Running when every role's replicas
    are ready (a role in ``fewest``, the elastic rollout: at least that many, whatever of its
    pods are being made), Initializing while any pod exists or is created, Pending before;
    the deadline's clock starts with the first pod."""
    fewest = fewest or {}
    made = p.bodies("create", "Pod")
    creating = sum(1 for m in made if m["metadata"]["labels"][naming.LABEL_ROLE] not in fewest)
    all_ready = all(r.ready >= fewest.get(role, r.total) for role, r in st.roles.items())
    alive = any(q.active for q in obs.pods) or made
    if alive and st.start_time is None:
        st.start_time = rfc3339(obs.now)
    if all_ready and not creating:
        return "Running", "AllRolesReady"
    return ("Initializing", "PodsStarting") if alive else ("Pending", "NoPods")


def copy_progress(obs: Observed, spec: RLJobSpec, st: RLJobStatus) -> None:
    """The trainer's report (steps, versions, rewards, the drafter's figures) into ``st``."""
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


def accounting(obs: Observed, spec: RLJobSpec, st: RLJobStatus, p: Plan) -> None:
    """GPUs in use (pods alive and kept, plus those created), idle, harvested, drafting."""
    deleting = set(p.delete_pods)
    roles_run = naming.role_specs(spec)
    gpus = sum(
        naming.gpus_of(spec, q.role)
        for q in obs.pods
        if q.active and q.name not in deleting and q.role in roles_run
    )
    gpus += sum(
        naming.gpus_of(spec, m["metadata"]["labels"][naming.LABEL_ROLE])
        for m in p.bodies("create", "Pod")
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
    st.gpus.drafter = ready * naming.gpus_of(spec, "drafter") if ready else 0
    if h is not None:
        st.gpus.harvested_gpu_seconds = max(st.gpus.harvested_gpu_seconds, h.harvested_gpu_seconds)
    st.workers = list(h.workers) if h is not None and running else []


def action_events(p: Plan) -> list[Event]:
    """CreatedPods and DeletedPods, naming the first eight of each."""
    out = []
    pods = [m["metadata"]["name"] for m in p.bodies("create", "Pod")]
    if pods:
        shown = ", ".join(pods[:8]) + (f" and {len(pods) - 8} more" if len(pods) > 8 else "")
        out.append(Event("Normal", "CreatedPods", f"created {len(pods)} pods: {shown}"))
    gone = p.delete_pods
    if gone:
        more = f" and {len(gone) - 8} more" if len(gone) > 8 else ""
        shown = ", ".join(gone[:8])
        out.append(Event("Normal", "DeletedPods", f"deleted {len(gone)} pods: {shown}{more}"))
    return out
