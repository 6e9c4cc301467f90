"""The plan's placement parts: Kueue admission, gang refusals (``derive.plan`` calls them).

Pure, like the rest of the plan: given what ``reconcile.py`` observed (:class:`~.model.Observed`)
they say why a job waits for Kueue, which Workload it should have (``children.py`` puts it in
the desired set) and what to patch or delete to keep it in step (``kueue.py`` builds the
objects and patches), and which gang backends this install may not manage. Split from
``derive.py`` to keep each file to one concern; docs/scheduling.md says what a user sees.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from longtail_api.rules import placement_errors
from longtail_api.spec import RLJobSpec
from longtail_api.topology import TopologySpec
from longtail_api.validation import FieldError
from longtail_operator import builders, kueue
from longtail_operator.model import TERMINAL, Change, ObjectKey, Observed, Patch, Plan
from longtail_operator.observe import rfc3339
from longtail_operator.settings import Settings

QUEUE_LABEL = kueue.QUEUE_LABEL
KUEUE_API = kueue.API_VERSION


def queue_wait(obs: Observed) -> tuple[str, str]:
    """Why a job labelled for Kueue waits: it never starts around the queue's quota."""
    ask = f"label {QUEUE_LABEL}={obs.queue} asks for admission by Kueue"
    remove = "or remove the label to start the job without admission"
    if not obs.kueue_enabled:
        return "KueueDisabled", (
            f"{ask}, but this operator's install does not do Kueue admission (chart value "
            f"scheduling.kueue: false); no pod is created: enable it, {remove}"
        )
    if obs.kueue_served is False:
        return "KueueNotInstalled", (
            f"{ask}, but this cluster serves no Kueue Workload API ({KUEUE_API}); no pod is "
            f"created: install Kueue, {remove}"
        )
    return "KueueUnknown", f"{ask}; whether Kueue is installed could not be read: retrying"


def admission_wait(obs: Observed, want: dict[str, Any] | None) -> tuple[str, str] | None:
    """Why a job Kueue manages may not run now (None: admitted, it runs)."""
    w = obs.workload
    missing = priority_wait(obs)
    if missing is not None:
        return missing
    if want is None:
        return None
    if w is None:
        return "WaitingForAdmission", f"Workload {want['metadata']['name']} created; queued"
    if w.shape != want["metadata"]["annotations"][kueue.SHAPE_ANNOTATION]:
        return "WorkloadReplaced", (
            f"the job's pods changed (replicas or resources): Workload {w.name} is replaced "
            "once its pods are gone, and the new one queued"
        )
    if w.evicted:
        return "Evicted", f"Workload {w.name} was evicted by Kueue; queued again"
    if not w.active:
        return "Deactivated", f"Workload {w.name} is not active (spec.active: false)"
    if not w.admitted:
        return "WaitingForAdmission", f"Workload {w.name} waits for admission by Kueue" + (
            _topology_note(want)
        )
    return None


def _topology_note(want: dict[str, Any]) -> str:
    """The podSets' required topology levels, which Kueue admits only where one domain of the
    level can hold the podSet (a level no node carries: never)."""
    levels = [
        f"{ps['name']} in one domain of {ps['topologyRequest']['required']}"
        for ps in want["spec"]["podSets"]
        if "required" in (ps.get("topologyRequest") or {})
    ]
    if not levels:
        return ""
    return (
        f"; required topology: {', '.join(levels)} (Kueue admits it once a domain of that node "
        "label, a level of the flavour's Topology, can hold the podSet; never if no node "
        "carries the label: see the KueueQuotaReserved condition)"
    )


def not_queued(obs: Observed, phase: str) -> tuple[str, str, str]:
    """``Queued`` False once a job that waited no longer does, with the true reason: admitted
    (naming the Workload and its ClusterQueue), suspended, finished, or no queue label."""
    w = obs.workload
    if obs.queue is None:
        return "False", "NotQueued", f"no {QUEUE_LABEL} label: no admission asked"
    if phase in TERMINAL:
        return "False", "JobFinished", f"job {phase.lower()}: no admission needed"
    if phase == "Suspended":
        where = f"Workload {w.name} deactivated" if w is not None else "no Workload"
        return "False", "JobSuspended", f"spec.suspend is true: {where}; queued again on resume"
    if w is not None and w.admitted:
        admission = (w.raw.get("status") or {}).get("admission") or {}
        queue = admission.get("clusterQueue")
        to = f" to ClusterQueue {queue}" if queue else ""
        return "False", "Admitted", f"Workload {w.name} admitted by Kueue{to}"
    return "False", "NotQueued", "the job does not wait for admission"


MIRRORED = ("QuotaReserved", "Admitted", "Evicted")
"""The Workload conditions an RLJob shows as ``Kueue<type>`` (Kueue's status, reason, message)."""


def kueue_conditions(obs: Observed) -> dict[str, tuple[str, str, str]]:
    """The job's Workload's admission conditions, mirrored: what Kueue says, where the user
    looks (``kubectl describe rljob``); none while Kueue has not written them."""
    if obs.workload is None:
        return {}
    found = (obs.workload.raw.get("status") or {}).get("conditions") or []
    by_type = {c.get("type"): c for c in found}
    return {
        f"Kueue{t}": (
            str(c.get("status", "Unknown")),
            str(c.get("reason") or t),
            str(c.get("message") or f"Workload {obs.workload.name}: {t}={c.get('status')}"),
        )
        for t in MIRRORED
        if (c := by_type.get(t)) is not None
    }


def refusals(
    spec: RLJobSpec | None, settings: Settings, labels: Mapping[str, str]
) -> list[FieldError]:
    """What this install cannot place, refused like a bad field, so a running job keeps its
    last accepted spec and its pods (``specgate``): a gang backend its RBAC lacks, and a
    topology the job's placer cannot express (``rules.placement_errors``: the placer depends
    on the RLJob's ``labels`` and on the install's default gang). ``spec``: the edit, None
    when it has field errors (reported as they are)."""
    if spec is None:
        return []
    gang = spec.scheduling.gang
    if gang is not None and gang.backend != "none" and gang.backend not in settings.gang_backends:
        allowed = ", ".join(settings.gang_backends) or "none"
        why = f"this operator's install manages the gang backends {allowed} only"
        fix = "use one of them, or ask for it in the chart value scheduling.gangBackends"
        return [FieldError("spec.scheduling.gang.backend", why, gang.backend, fix=fix)]
    return placement_errors(spec, labels, builders.job_gang(spec, settings))


def topology_wait(obs: Observed, spec: RLJobSpec, role: str) -> str | None:
    """Why ``role``'s unscheduled pods may wait: a required topology, which its gang scheduler
    holds until one domain of the level can take the whole group; a level no node carries
    holds them for ever. This install may not list nodes, so it says so instead of checking
    (None: nothing of the role waits, or no required topology covers it; under Kueue the
    Workload waits for admission instead, and Kueue's own conditions say why)."""
    if obs.queue is not None:
        return None
    entry = next(
        (t for t in spec.scheduling.topology if t.mode == "required" and t.group in (role, "job")),
        None,
    )
    waiting = [q for q in obs.pods if q.role == role and q.active and not q.scheduled]
    if entry is None or not waiting:
        return None
    return (
        f"{len(waiting)} pod(s) not scheduled: spec.scheduling.topology asks for the "
        f"{entry.group} pods within one domain of the node label {entry.level} (required), so "
        f"they wait until one domain can hold them all; if no node carries {entry.level} they "
        "wait for good (this operator may not list nodes to check): label the nodes, or use "
        "mode: preferred"
    )


def workload(obs: Observed, spec: RLJobSpec, settings: Settings) -> dict[str, Any] | None:
    """The Workload the job should have (None: Kueue does not manage it, or the priority
    class it is to name is missing, :func:`priority_wait`)."""
    if obs.queue is None or obs.kueue_served is not True or not obs.kueue_enabled:
        return None
    if priority_wait(obs) is not None:
        return None
    topology: dict[str, TopologySpec] = {t.group: t for t in spec.scheduling.topology}
    podsets = [
        kueue.podset(
            role,
            rs.replicas,
            builders.worker_pod(obs.job, spec, settings, role, 0),
            topology.get(role),
            spec.rollout.min_replicas if role == "rollout" else None,
        )
        for role, rs in builders.role_specs(spec).items()
    ]
    name = kueue.workload_name(obs.job.name, obs.job.uid)
    meta = builders.job_metadata(obs.job, name)
    labels = {kueue.QUEUE_LABEL: obs.queue}
    return kueue.workload(
        meta, obs.job.uid, labels, podsets, not spec.suspend, obs.workload_priority
    )


def priority_wait(obs: Observed) -> tuple[str, str] | None:
    """A Workload to make whose priority class does not exist: Kueue needs its value, so the
    Workload waits for it (None: no class named, or found)."""
    want = obs.workload_priority
    if obs.workload is not None or want is None or want.value is not None:
        return None
    where = (
        f"label {kueue.PRIORITY_LABEL}={want.name}"
        if want.kind == "WorkloadPriorityClass"
        else f"spec.scheduling.priorityClassName {want.name!r}"
    )
    return "PriorityClassNotFound", (
        f"{where} names the {want.kind} {want.name}, which does not exist: the Workload "
        f"(and so every pod) waits for it; create the {want.kind}, or change the name"
    )


def workload_actions(
    obs: Observed,
    spec: RLJobSpec,
    p: Plan,
    phase: str,
    message: str,
    want: dict[str, Any] | None,
    release: str | None = None,
) -> None:
    """Keep the Workload in step with the job (the module text of ``kueue.py``): its patches,
    and its delete once a changed job's pods are gone (the desired set makes the new one).
    ``release``: why the job gives its quota back of itself once its pods are gone (an elastic
    job below ``rollout.minReplicas`` past its grace, ``elastic.py``)."""
    w, now = obs.workload, rfc3339(obs.now)
    if want is None or w is None:
        return
    key = ObjectKey(kueue.API_VERSION, "Workload", w.name)

    def patch(body: dict[str, Any], status: bool = False) -> None:
        p.patches.append(Patch(key, kueue.WORKLOADS, body, status))

    if phase in TERMINAL:
        if not w.finished:
            patch(kueue.finished_patch(w.raw, phase == "Succeeded", message, now), True)
        if w.finalizer:
            patch({"metadata": {"finalizers": None}})
        return
    if w.active == spec.suspend:  # the user's suspend, mapped; never written back
        patch({"spec": {"active": not spec.suspend}})
    # Any pod, one still terminating too, keeps the quota: it may still hold its GPUs.
    if obs.pods or p.bodies("create", "Pod"):
        return
    if w.shape != want["metadata"]["annotations"][kueue.SHAPE_ANNOTATION]:
        patch({"metadata": {"finalizers": None}})
        p.changes.append(Change("delete", key, None, "the job's podSets changed"))
    elif w.holds_admission and (w.evicted or not w.active or release is not None):
        why = "the job stopped after its eviction" if w.evicted else "the job was deactivated"
        patch(kueue.release_patch(w.raw, release if release is not None else why, now), True)
