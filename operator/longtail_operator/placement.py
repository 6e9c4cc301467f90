"""The plan's placement parts: admission by Kueue and the gang group (``derive.plan`` calls them).

Pure, like the rest of the plan: given what ``reconcile.py`` observed (:class:`~.model.Observed`)
they say why a job waits for Kueue, which Workload it should have and what to create, patch or
delete to keep it in step (``kueue.py`` builds the objects), and when the job's gang group
object is made and deleted (``gang.py``). Split from ``derive.py`` to keep each file to one
concern; docs/scheduling.md says what a user sees.
"""

from __future__ import annotations

from typing import Any

from longtail_api.spec import RLJobSpec
from longtail_api.validation import FieldError
from longtail_operator import builders, kueue
from longtail_operator.model import TERMINAL, Observed, Plan
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
        return "WaitingForAdmission", f"Workload {w.name} waits for admission by Kueue"
    return None


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


def refusals(spec: RLJobSpec | None, settings: Settings) -> list[FieldError]:
    """A gang backend this install may not manage (its RBAC lacks the API): refused like a
    bad field, so a running job keeps its last accepted spec (``specgate``)."""
    gang = spec.scheduling.gang if spec is not None else None
    if gang is None or gang.backend == "none" or gang.backend in settings.gang_backends:
        return []
    allowed = ", ".join(settings.gang_backends) or "none"
    why = f"this operator's install manages the gang backends {allowed} only"
    fix = "use one of them, or ask for it in the chart value scheduling.gangBackends"
    return [FieldError("spec.scheduling.gang.backend", why, gang.backend, fix=fix)]


def workload(obs: Observed, spec: RLJobSpec, settings: Settings) -> dict[str, Any] | None:
    """The Workload the job should have (None: Kueue does not manage it)."""
    if obs.queue is None or obs.kueue_served is not True or not obs.kueue_enabled:
        return None
    podsets = [
        kueue.podset(role, rs.replicas, builders.worker_pod(obs.job, spec, settings, role, 0))
        for role, rs in builders.role_specs(spec).items()
    ]
    name = kueue.workload_name(obs.job.name, obs.job.uid)
    meta = builders.job_metadata(obs.job, name)
    labels = {kueue.QUEUE_LABEL: obs.queue}
    if obs.priority:
        labels[kueue.PRIORITY_LABEL] = obs.priority
    return kueue.workload(meta, obs.job.uid, labels, podsets, active=not spec.suspend)


def workload_actions(
    obs: Observed, spec: RLJobSpec, p: Plan, phase: str, message: str, want: dict[str, Any] | None
) -> None:
    """Keep the Workload in step with the job (the module text of ``kueue.py``)."""
    w, now = obs.workload, rfc3339(obs.now)
    if want is None:
        return
    if w is None:
        if phase not in TERMINAL:
            p.create.append(want)
        return
    patch = (kueue.API_VERSION, kueue.WORKLOADS, w.name)
    if phase in TERMINAL:
        if not w.finished:
            done = kueue.finished_patch(w.raw, phase == "Succeeded", message, now)
            p.patches.append((*patch, done, True))
        if w.finalizer:
            p.patches.append((*patch, {"metadata": {"finalizers": None}}, False))
        return
    if w.active == spec.suspend:  # the user's suspend, mapped; never written back
        p.patches.append((*patch, {"spec": {"active": not spec.suspend}}, False))
    # Any pod, one still terminating too, keeps the quota: it may still hold its GPUs.
    pods_left = bool(obs.pods) or any(m["kind"] == "Pod" for m in p.create)
    if pods_left:
        return
    if w.shape != want["metadata"]["annotations"][kueue.SHAPE_ANNOTATION]:
        p.patches.append((*patch, {"metadata": {"finalizers": None}}, False))
        p.delete_objects.append((f"{kueue.API_VERSION}/Workload", w.name))
    elif w.holds_admission and (w.evicted or not w.active):
        why = "the job stopped after its eviction" if w.evicted else "the job was deactivated"
        p.patches.append((*patch, kueue.release_patch(w.raw, why, now), True))


def gang_group(obs: Observed, spec: RLJobSpec, settings: Settings, p: Plan, running: bool) -> None:
    """The gang group exists exactly while the job's pods are wanted: made in the pass that
    makes them (``Reconciler._execute`` creates it before any pod), deleted with them on
    suspend or finish, made again on resume; a trainer-group restart keeps it (gang.py)."""
    if builders.job_gang(spec, settings) is None or obs.gang_group is None:
        return
    if running and not obs.gang_group:
        p.create.append(builders.gang_group(obs.job, spec, settings))
    elif not running and obs.gang_group:
        group = builders.gang_group(obs.job, spec, settings)
        p.delete_objects.append((f"{group['apiVersion']}/{group['kind']}", obs.job.name))
