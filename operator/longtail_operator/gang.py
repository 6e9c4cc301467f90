"""Gang placement (``spec.scheduling.gang``): an RLJob's group object and what its pods carry.

Pure builders, called by ``builders.worker_pod`` (each pod's labels, annotations and
``schedulerName``) and by ``builders.gang_group`` for the desired set (``children.py``: the
group object is desired exactly while the pods are, so it is made in the same pass as the pods
and before them, as ``execute.py`` creates every other object first; deleted with the pods on
suspend or finish, made again on resume). One group per
RLJob, named after it and owned by it, whose minimum is every pod the job runs: the whole
trainer group and each role's replicas (no role is elastic yet, so its minimum is its count).
A trainer-group restart replaces the trainer pods under the same group: the gang scheduler
places the new ones against the members already running.

The backends, as their projects define them:

- ``volcano``: ``scheduling.volcano.sh/v1beta1`` ``PodGroup`` (``minMember``, ``minTaskMember``
  per role, ``queue``); pods annotated ``scheduling.k8s.io/group-name`` and
  ``volcano.sh/task-spec`` (the role, which ``minTaskMember`` counts);
- ``coscheduling``: ``scheduling.x-k8s.io/v1alpha1`` ``PodGroup`` (``minMember``,
  ``scheduleTimeoutSeconds``); pods labelled ``scheduling.x-k8s.io/pod-group``;
- ``kai``: ``scheduling.run.ai/v2alpha2`` ``PodGroup`` (``minMember``, ``queue``, a subgroup per
  role); pods annotated ``pod-group-name`` and ``kai.scheduler/skip-podgrouper`` (the operator
  makes the group, KAI's pod-grouper must not make another), labelled
  ``kai.scheduler/subgroup-name`` and ``kai.scheduler/queue``;
- ``kubernetes``: core ``scheduling.k8s.io/v1alpha2`` ``PodGroup`` standing alone (a
  ``schedulingPolicy.gang.minCount``; no ``Workload``: that API holds templates for controllers
  that stamp out many groups, and an RLJob has one); pods name it in ``spec.schedulingGroup``.
  Not servable by the tests' v1.20 control plane: the manifests are checked against the 1.36
  schema (``tests/unit/operator/test_scheduling.py``).

Topology (``spec.scheduling.topology``, :func:`topology_fields`) and priority
(``spec.scheduling.priorityClassName``) go on the group object as each backend takes them
(docs/scheduling.md, "Topology and priority"): Volcano ``networkTopology`` (the job) and
``subGroupPolicy`` (a role), KAI ``topologyConstraint`` on the group or the role's subgroup,
the core PodGroup's ``schedulingConstraints.topology`` (the job, required only); Volcano and
KAI take ``priorityClassName``. A job admitted through Kueue gets its topology from Kueue
(``kueue.py``), its group none. What a backend cannot express never gets here: it is refused
first (``placement.refusals``, ``longtail_api.rules.placement_errors``).

Which gang a job gets, its own or the install's default, is
:func:`longtail_api.scheduling.effective_gang` (``builders.job_gang``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from longtail_api.scheduling import GROUP_APIS, GangSpec
from longtail_api.topology import TopologySpec
from longtail_operator.naming import LABEL_JOB, LABEL_ROLE

KIND, PLURAL = "PodGroup", "podgroups"
VOLCANO_DEFAULT_QUEUE = "default"


@dataclass(frozen=True)
class PodGang:
    """What one pod carries to join its job's group."""

    scheduler_name: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    pod_spec: dict[str, Any] = field(default_factory=dict)
    """Fields set on the pod's spec besides ``schedulerName`` (core ``schedulingGroup``)."""


def group_name(job: str) -> str:
    """The group object's name: the RLJob's own (one group per job)."""
    return job


def pod_gang(job: str, gang: GangSpec, role: str) -> PodGang:
    name = group_name(job)
    scheduler = gang.resolved_scheduler()
    if gang.backend == "volcano":
        notes = {"scheduling.k8s.io/group-name": name, "volcano.sh/task-spec": role}
        return PodGang(scheduler, annotations=notes)
    if gang.backend == "coscheduling":
        return PodGang(scheduler, labels={"scheduling.x-k8s.io/pod-group": name})
    if gang.backend == "kubernetes":
        return PodGang(scheduler, pod_spec={"schedulingGroup": {"podGroupName": name}})
    labels = {"kai.scheduler/subgroup-name": role, "kai.scheduler/queue": gang.queue or ""}
    notes = {"pod-group-name": name, "kai.scheduler/skip-podgrouper": "true"}
    return PodGang(scheduler, labels=labels, annotations=notes)


def group_object(
    gang: GangSpec,
    minimums: dict[str, int],
    metadata: dict[str, Any],
    topology: list[TopologySpec] | None = None,
    priority_class: str | None = None,
    replicas: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The job's group object: ``minimums`` pods of each role placed together (``metadata``:
    name, namespace, labels, owner reference; ``builders.gang_group`` fills them), with the
    ``topology`` entries (none for a job Kueue places) and the pods' ``priority_class``;
    ``replicas``: each role's pod count (default: its minimum), the size of its topology
    subgroup."""
    group, version = GROUP_APIS[gang.backend]
    body: dict[str, Any] = {"minMember": sum(minimums.values())}
    if gang.backend == "kubernetes":
        body = {"schedulingPolicy": {"gang": {"minCount": body["minMember"]}}}
    elif gang.backend == "volcano":
        body["minTaskMember"] = dict(minimums)
        body["queue"] = gang.queue or VOLCANO_DEFAULT_QUEUE
    elif gang.backend == "coscheduling":
        body["scheduleTimeoutSeconds"] = gang.schedule_timeout_seconds
    else:
        body["queue"] = gang.queue
        body["subGroups"] = [{"name": r, "minMember": n} for r, n in minimums.items()]
    sizes = replicas or minimums
    body.update(topology_fields(gang, topology or [], minimums, sizes, str(metadata["name"])))
    if priority_class and gang.backend in ("volcano", "kai"):
        body["priorityClassName"] = priority_class
    return {"apiVersion": f"{group}/{version}", "kind": KIND, "metadata": metadata, "spec": body}


def topology_fields(
    gang: GangSpec,
    topology: list[TopologySpec],
    minimums: dict[str, int],
    sizes: dict[str, int],
    job: str,
) -> dict[str, Any]:
    """The group's spec fields for ``topology``, merged into the group's spec (KAI's role
    entries replace its subgroups, ``minimums`` kept; a Volcano subgroup holds all ``sizes[R]``
    pods of its role)."""
    job_entry = next((t for t in topology if t.group == "job"), None)
    roles = [t for t in topology if t.group != "job" and t.group in minimums]
    out: dict[str, Any] = {}
    if gang.backend == "volcano":
        if job_entry is not None:
            out["networkTopology"] = _volcano_network(job_entry)
        if roles:
            out["subGroupPolicy"] = [
                {
                    "name": t.group,
                    "subGroupSize": sizes[t.group],
                    "labelSelector": {"matchLabels": {LABEL_JOB: job, LABEL_ROLE: t.group}},
                    "networkTopology": _volcano_network(t),
                }
                for t in roles
            ]
    elif gang.backend == "kai":
        if job_entry is not None:
            out["topologyConstraint"] = _kai_constraint(gang, job_entry)
        if roles:
            by_role: dict[str, dict[str, Any]] = {t.group: _kai_constraint(gang, t) for t in roles}
            out["subGroups"] = [
                {"name": r, "minMember": n, **_only("topologyConstraint", by_role.get(r))}
                for r, n in minimums.items()
            ]
    elif gang.backend == "kubernetes" and job_entry is not None:
        out["schedulingConstraints"] = {"topology": [{"key": job_entry.level}]}
    return out


def _only(key: str, value: Any) -> dict[str, Any]:
    return {} if value is None else {key: value}


def _volcano_network(entry: TopologySpec) -> dict[str, Any]:
    """Volcano's ``networkTopology``: ``hard`` up to the tier named after the level, or
    ``soft`` (as close as it can; a soft request names no tier)."""
    if entry.mode == "required":
        return {"mode": "hard", "highestTierName": entry.level}
    return {"mode": "soft"}


def _kai_constraint(gang: GangSpec, entry: TopologySpec) -> dict[str, Any]:
    level = "requiredTopologyLevel" if entry.mode == "required" else "preferredTopologyLevel"
    return {"topology": gang.topology_name or "", level: entry.level}
