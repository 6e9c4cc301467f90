"""Admission by Kueue: an RLJob's Workload, and what Kueue's answer means for its pods.

Pure, as Kueue's job framework does it for a custom job (its "Integrate a custom Job with
Kueue" page and ``pkg/controller/jobframework``): an RLJob labelled
``kueue.x-k8s.io/queue-name`` gets one ``Workload`` (``kueue.x-k8s.io/v1beta2``) named
``rljob-<name>-<hash5>``, owned by it, labelled with its UID, with Kueue's finalizer, one podSet
per role (its pod template and count) and ``spec.active`` = not ``spec.suspend`` (the user's
suspend is mapped, never written). No pod is created until the Workload is admitted; then the
pods get the node labels and tolerations of the ResourceFlavors Kueue assigned to their podSet
and the label ``kueue.x-k8s.io/podset``. On eviction or deactivation the job stops the way a
suspend does (checkpoint, then pods) and only once no pod is left is the admission released
(quota stays held while the trainer checkpoints). ``derive.plan`` decides with :class:`View`;
``reconcile.py`` reads the Workload and the flavours and applies the patches built here.

Topology (``spec.scheduling.topology``, a ``trainer`` or ``rollout`` entry): the role's podSet
asks ``topologyRequest`` (``required`` or ``preferred`` level, the pods' replica-index label as
``podIndexLabel``), and each of its admitted pods is made with Kueue's scheduling gate and the
Workload's name (:func:`place`): Kueue's topology ungater removes the gate and adds the
domain's ``nodeSelector``. Priority (:class:`Priority`): ``spec.priorityClassRef`` names the
RLJob's ``kueue.x-k8s.io/priority-class`` label (a WorkloadPriorityClass), else the job's
``priorityClassName`` (a PriorityClass), and ``spec.priority`` is that class's value, which
``reconcile.py`` reads (v1beta2 requires it with the reference).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from longtail_api.topology import TopologySpec
from longtail_operator.naming import LABEL_INDEX

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
WORKLOADS, FLAVORS = "workloads", "resourceflavors"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
PODSET_LABEL = "kueue.x-k8s.io/podset"
FINALIZER = "kueue.x-k8s.io/resource-in-use"
TOPOLOGY_GATE = "kueue.x-k8s.io/topology"
"""The scheduling gate of a pod Kueue places by topology (its ungater removes it)."""
WORKLOAD_ANNOTATION = "kueue.x-k8s.io/workload"
"""Which Workload a topology-placed pod belongs to (the ungater finds the pods by it)."""
SHAPE_ANNOTATION = "longtail.dev/podsets"
"""The podSets' shape (name, count, each container's resources) the Workload was made for: a
job whose shape changes gets a new Workload (the templates' other fields, such as the policy
version a recreated pod starts from, change every step and do not count)."""


def workload_name(job: str, uid: str) -> str:
    """``rljob-<job>-<hash5>`` within 253 characters (Kueue's naming for owned Workloads)."""
    digest = hashlib.sha256(uid.encode()).hexdigest()[:5]
    return f"rljob-{job[: 253 - 12]}-{digest}"


def podset(
    role: str,
    count: int,
    pod: dict[str, Any],
    topology: TopologySpec | None = None,
    min_count: int | None = None,
) -> dict[str, Any]:
    """One role's podSet from one of its pods (``builders.worker_pod``), asking for the
    role's ``topology`` entry, if any. ``min_count`` below ``count`` asks for partial
    admission down to it (Kueue's ``minCount``: one podSet per Workload, the elastic rollout
    role's)."""
    meta = pod["metadata"]
    template = {
        "metadata": {"labels": meta.get("labels", {}), "annotations": meta.get("annotations", {})},
        "spec": pod["spec"],
    }
    out: dict[str, Any] = {"name": role, "count": count, "template": template}
    if topology is not None:
        out["topologyRequest"] = {topology.mode: topology.level, "podIndexLabel": LABEL_INDEX}
    if min_count is not None and min_count < count:
        out["minCount"] = min_count
    return out


def shape(podsets: list[dict[str, Any]]) -> str:
    """What of the podSets decides quota and placement: names, counts, containers' resources,
    topology requests (immutable, like the rest of the podSets)."""
    return json.dumps(
        [
            [
                p["name"],
                p["count"],
                [c.get("resources", {}) for c in p["template"]["spec"]["containers"]],
                *([p["topologyRequest"]] if "topologyRequest" in p else []),
                *([{"minCount": p["minCount"]}] if "minCount" in p else []),
            ]
            for p in podsets
        ],
        sort_keys=True,
    )


@dataclass(frozen=True)
class Priority:
    """The priority class a Workload names (``spec.priorityClassRef``) and its value."""

    group: str
    kind: str
    name: str
    value: int | None
    """The class's ``value``; None: no such class (the Workload is not made, the job waits)."""

    @property
    def plural(self) -> str:
        return PRIORITY_PLURALS[self.kind]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{PRIORITY_VERSIONS[self.group]}"


PRIORITY_PLURALS = {
    "WorkloadPriorityClass": "workloadpriorityclasses",
    "PriorityClass": "priorityclasses",
}
PRIORITY_VERSIONS = {GROUP: VERSION, "scheduling.k8s.io": "v1"}


def priority_source(label: str | None, class_name: str | None) -> Priority | None:
    """Which class the Workload names, its value not yet read: the RLJob's
    ``kueue.x-k8s.io/priority-class`` label (a WorkloadPriorityClass) wins over the job's
    ``priorityClassName`` (a PriorityClass), as in Kueue's own job framework."""
    if label:
        return Priority(GROUP, "WorkloadPriorityClass", label, None)
    if class_name:
        return Priority("scheduling.k8s.io", "PriorityClass", class_name, None)
    return None


def workload(
    meta: dict[str, Any],
    uid: str,
    labels: dict[str, str],
    podsets: list[dict[str, Any]],
    active: bool,
    priority: Priority | None = None,
) -> dict[str, Any]:
    """The Workload of a job (``meta``: its name, namespace, labels, owner reference;
    ``priority``: the class it names, its value read)."""
    meta = {
        **meta,
        "labels": {**meta.get("labels", {}), JOB_UID_LABEL: uid},
        "annotations": {SHAPE_ANNOTATION: shape(podsets)},
        "finalizers": [FINALIZER],
    }
    spec: dict[str, Any] = {"queueName": labels[QUEUE_LABEL], "active": active, "podSets": podsets}
    if priority is not None and priority.value is not None:
        ref = {"group": priority.group, "kind": priority.kind, "name": priority.name}
        spec["priorityClassRef"], spec["priority"] = ref, priority.value
    return {"apiVersion": API_VERSION, "kind": "Workload", "metadata": meta, "spec": spec}


def _condition(obj: dict[str, Any], kind: str) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conds)


@dataclass(frozen=True)
class Placement:
    """Where one podSet's pods may run: the assigned flavours' node labels and tolerations."""

    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class View:
    """What the plan needs of the job's Workload."""

    name: str
    active: bool
    admitted: bool
    evicted: bool
    holds_admission: bool
    """``status.admission`` is set: quota is held (until the job releases it)."""
    finished: bool
    shape: str
    finalizer: bool
    placements: dict[str, Placement] = field(default_factory=dict)
    """Per podSet (role), once admitted."""
    counts: dict[str, int] = field(default_factory=dict)
    """Pods admitted per podSet (``podSetAssignments[].count``; fewer than asked under
    partial admission); a podSet whose assignment has no count is not in it (all admitted)."""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The object as read (its conditions, for the status patches)."""


def flavors_of(obj: dict[str, Any]) -> set[str]:
    """The ResourceFlavor names the Workload's admission assigned (to read them)."""
    admission = (obj.get("status") or {}).get("admission") or {}
    return {
        f
        for a in admission.get("podSetAssignments") or []
        for f in (a.get("flavors") or {}).values()
    }


def view(obj: dict[str, Any], flavors: dict[str, dict[str, Any]]) -> View:
    """The Workload as read, with the ResourceFlavors (by name) its admission names."""
    status = obj.get("status") or {}
    admission = status.get("admission") or {}
    placements = {}
    counts: dict[str, int] = {}
    for a in admission.get("podSetAssignments") or []:
        labels: dict[str, str] = {}
        tolerations: list[dict[str, Any]] = []
        for name in sorted(set((a.get("flavors") or {}).values())):
            fspec = (flavors.get(name) or {}).get("spec") or {}
            labels.update(fspec.get("nodeLabels") or {})
            tolerations.extend(t for t in fspec.get("tolerations") or [] if t not in tolerations)
        placements[a["name"]] = Placement(labels, tuple(tolerations))
        if isinstance(a.get("count"), int):
            counts[a["name"]] = a["count"]
    evicted = _condition(obj, "Evicted")
    return View(
        name=obj["metadata"]["name"],
        active=bool((obj.get("spec") or {}).get("active", True)),
        admitted=_condition(obj, "Admitted") and bool(admission) and not evicted,
        evicted=evicted,
        holds_admission=bool(admission),
        finished=_condition(obj, "Finished"),
        shape=(obj["metadata"].get("annotations") or {}).get(SHAPE_ANNOTATION, ""),
        finalizer=FINALIZER in (obj["metadata"].get("finalizers") or []),
        placements=placements,
        counts=counts,
        raw=obj,
    )


def place(pod: dict[str, Any], role: str, where: Placement, topology: str | None = None) -> None:
    """Put an admitted role's pod where Kueue admitted it (in place). ``topology``: the
    Workload's name when the role's podSet asks for a topology: the pod is made gated, for
    Kueue's ungater to place it in the admitted domain."""
    spec = pod["spec"]
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **where.node_selector}
    known = spec.setdefault("tolerations", [])
    known.extend(t for t in where.tolerations if t not in known)
    pod["metadata"]["labels"][PODSET_LABEL] = role
    if topology is not None:
        gates = spec.setdefault("schedulingGates", [])
        if {"name": TOPOLOGY_GATE} not in gates:
            gates.append({"name": TOPOLOGY_GATE})
        pod["metadata"].setdefault("annotations", {})[WORKLOAD_ANNOTATION] = topology


def conditions_patch(
    obj: dict[str, Any], new: list[dict[str, str]], now: str
) -> list[dict[str, Any]]:
    """The Workload's conditions with ``new`` ones (type, status, reason, message) replacing
    those of their types and the others kept (a merge patch replaces the whole list)."""
    types = {c["type"] for c in new}
    old = [c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] not in types]
    return old + [{**c, "lastTransitionTime": now} for c in new]


def release_patch(obj: dict[str, Any], message: str, now: str) -> dict[str, Any]:
    """Status patch giving the quota back once no pod is left; Kueue re-queues the Workload."""
    pending = {"status": "False", "reason": "Pending", "message": message}
    new = [{"type": "QuotaReserved", **pending}, {"type": "Admitted", **pending}]
    return {"status": {"admission": None, "conditions": conditions_patch(obj, new, now)}}


def finished_patch(obj: dict[str, Any], succeeded: bool, message: str, now: str) -> dict[str, Any]:
    reason = "Succeeded" if succeeded else "Failed"
    new = [{"type": "Finished", "status": "True", "reason": reason, "message": message}]
    return {"status": {"conditions": conditions_patch(obj, new, now)}}
