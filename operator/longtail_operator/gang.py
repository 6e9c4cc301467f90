"""Gang placement (``spec.scheduling.gang``): an RLJob's group object and what its pods carry.

Pure builders, called by ``builders.worker_pod`` (each pod's labels, annotations and
``schedulerName``) and by ``builders.gang_group`` for ``derive.plan`` (the group object, made
in the same pass as the pods and before them: ``Reconciler._execute`` creates every other
object first; deleted with the pods on suspend or finish, made again on resume). One group per
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

Which gang a job gets, its own or the install's default, is
:func:`longtail_api.scheduling.effective_gang` (``builders.job_gang``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from longtail_api.scheduling import GROUP_APIS, GangSpec

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
    gang: GangSpec, minimums: dict[str, int], metadata: dict[str, Any]
) -> dict[str, Any]:
    """The job's group object: ``minimums`` pods of each role placed together (``metadata``:
    name, namespace, labels, owner reference; ``builders.gang_group`` fills both)."""
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
    return {"apiVersion": f"{group}/{version}", "kind": KIND, "metadata": metadata, "spec": body}
