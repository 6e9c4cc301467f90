"""``spec.scheduling.topology`` and ``spec.scheduling.priorityClassName`` in the operator
(issue #52, items 2-3; docs/scheduling.md, "Topology and priority"): what each placer's object
says (the gang's PodGroup per backend, Kueue's Workload and its admitted pods), every pod's
class, the Workload's priority read from its class (a missing class: the job waits, naming it),
and what a placer cannot express refused like a bad field, a running job losing nothing.
The same objects against the CRDs on a real control plane: ``tests/integration/
test_operator_scheduling.py`` and ``test_operator_kueue_topology.py``."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import kubernetes_validate
import pytest
import yaml
from optest import JOB, REPO, all_pods, example, observed, spec_of

from longtail_api.manifest import validate_manifest
from longtail_api.status import RLJobStatus
from longtail_operator import builders, kueue, specgate
from longtail_operator.derive import plan
from longtail_operator.placement import refusals
from longtail_operator.settings import Settings

SETTINGS = Settings()
BLOCK = "network.topology.kubernetes.io/block"
SPINE = "network.topology.kubernetes.io/spine"
QUEUE = {"kueue.x-k8s.io/queue-name": "team-a"}


def job(gang: dict[str, Any] | None, *topology: dict[str, str], **scheduling: Any) -> Any:
    """examples/01 with 2 trainer pods, ``gang``, ``topology`` entries and other fields."""
    block: dict[str, Any] = {"topology": list(topology), **scheduling}
    if gang is not None:
        block["gang"] = gang
    return example(scheduling=block, trainer__replicas=2)


def group_of(manifest: dict[str, Any], kueue_label: bool = False) -> dict[str, Any]:
    return builders.gang_group(JOB, spec_of(manifest), SETTINGS, kueue=kueue_label)


def pods_of(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = spec_of(manifest)
    return {
        f"{role}-{i}": builders.worker_pod(JOB, spec, SETTINGS, role, i)
        for role, i in builders.desired_pods(spec).values()
    }


# --- every pod's priority class ---------------------------------------------------------------


def test_every_pod_gets_the_jobs_priority_class_whatever_a_template_says() -> None:
    manifest = job({"backend": "kubernetes"}, priorityClassName="research-high")
    manifest["spec"]["rollout"]["template"] = {"spec": {"priorityClassName": "other"}}
    made = pods_of(manifest)
    assert len(made) == 5
    for key, p in made.items():
        assert p["spec"]["priorityClassName"] == "research-high", key
        kubernetes_validate.validate(p, "1.36.0", strict=True)
    assert "priorityClassName" not in pods_of(job(None))["rollout-0"]["spec"]


# --- the gang's PodGroup, per backend ---------------------------------------------------------


def test_volcano_network_topology_for_the_job_and_a_subgroup_policy_per_role() -> None:
    manifest = job(
        {"backend": "volcano", "queue": "research"},
        {"group": "job", "level": SPINE},
        {"group": "trainer", "level": BLOCK},
        {"group": "rollout", "level": SPINE, "mode": "preferred"},
        priorityClassName="research-high",
    )
    spec = group_of(manifest)["spec"]
    assert spec["networkTopology"] == {"mode": "hard", "highestTierName": SPINE}
    assert spec["subGroupPolicy"] == [
        {
            "name": "trainer",
            "subGroupSize": 2,
            "labelSelector": {
                "matchLabels": {"longtail.dev/rljob": "tiny", "longtail.dev/role": "trainer"}
            },
            "networkTopology": {"mode": "hard", "highestTierName": BLOCK},
        },
        {
            "name": "rollout",
            "subGroupSize": 2,
            "labelSelector": {
                "matchLabels": {"longtail.dev/rljob": "tiny", "longtail.dev/role": "rollout"}
            },
            "networkTopology": {"mode": "soft"},
        },
    ]
    assert spec["priorityClassName"] == "research-high"
    assert spec["minTaskMember"] == {"trainer": 2, "rollout": 2, "verifier": 1}  # unchanged
    # The selector matches exactly the role's pods.
    for key, p in pods_of(manifest).items():
        labels = p["metadata"]["labels"]
        matches = [
            g["name"]
            for g in spec["subGroupPolicy"]
            if g["labelSelector"]["matchLabels"].items() <= labels.items()
        ]
        assert matches == ([key.split("-")[0]] if not key.startswith("verifier") else []), key
    soft = group_of(
        job({"backend": "volcano"}, {"group": "job", "level": BLOCK, "mode": "preferred"})
    )
    assert soft["spec"]["networkTopology"] == {"mode": "soft"}
    assert "subGroupPolicy" not in soft["spec"] and "priorityClassName" not in soft["spec"]


def test_kai_topology_constraint_on_the_group_and_on_the_roles_subgroups() -> None:
    gang = {"backend": "kai", "queue": "team-a", "topologyName": "cluster-topology"}
    manifest = job(
        gang,
        {"group": "job", "level": SPINE, "mode": "preferred"},
        {"group": "trainer", "level": BLOCK},
        priorityClassName="research-high",
    )
    spec = group_of(manifest)["spec"]
    assert spec["topologyConstraint"] == {
        "topology": "cluster-topology",
        "preferredTopologyLevel": SPINE,
    }
    required = {"topology": "cluster-topology", "requiredTopologyLevel": BLOCK}
    assert {g["name"]: g for g in spec["subGroups"]} == {
        "trainer": {"name": "trainer", "minMember": 2, "topologyConstraint": required},
        "rollout": {"name": "rollout", "minMember": 2},
        "verifier": {"name": "verifier", "minMember": 1},
    }
    assert spec["priorityClassName"] == "research-high" and spec["minMember"] == 5


def test_core_podgroup_takes_the_jobs_required_topology_valid_for_1_36() -> None:
    manifest = job(
        {"backend": "kubernetes"}, {"group": "job", "level": BLOCK}, priorityClassName="high"
    )
    group = group_of(manifest)
    assert group["spec"] == {
        "schedulingPolicy": {"gang": {"minCount": 5}},
        "schedulingConstraints": {"topology": [{"key": BLOCK}]},
    }  # no priorityClassName: the pods' class is what kube-scheduler reads
    kubernetes_validate.validate(group, "1.36.0", strict=True)
    wrong = copy.deepcopy(group)  # the check has teeth: a misplaced constraint is refused
    wrong["spec"]["schedulingPolicy"]["topology"] = wrong["spec"].pop("schedulingConstraints")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, "1.36.0", strict=True)


def test_a_job_placed_by_kueue_gets_no_topology_on_its_gang_group() -> None:
    manifest = job({"backend": "volcano"}, {"group": "trainer", "level": BLOCK})
    assert "subGroupPolicy" in group_of(manifest)["spec"]
    assert "subGroupPolicy" not in group_of(manifest, kueue_label=True)["spec"]


# --- Kueue: the Workload's topology requests and priority, the admitted pods ------------------


def queued(manifest: dict[str, Any], pods: list[Any], workload: Any = None, **kw: Any) -> Any:
    return observed(manifest, pods, queue="team-a", kueue_served=True, workload=workload, **kw)


def admitted(raw: dict[str, Any]) -> kueue.View:
    obj = copy.deepcopy(raw)
    sets = obj["spec"]["podSets"]
    assign = [{"name": ps["name"], "flavors": {"cpu": "h100"}, "count": ps["count"]} for ps in sets]
    obj["status"] = {
        "admission": {"clusterQueue": "cq", "podSetAssignments": assign},
        "conditions": [
            {"type": "QuotaReserved", "status": "True"},
            {"type": "Admitted", "status": "True"},
        ],
    }
    return kueue.view(obj, {"h100": {"spec": {"nodeLabels": {"gpu": "h100"}}}})


def the_workload(p: Any) -> dict[str, Any]:
    [w] = [m for m in p.create if m["kind"] == "Workload"]
    return w  # type: ignore[no-any-return]


def test_kueue_podsets_ask_the_roles_topology_and_admitted_pods_wait_for_the_ungater() -> None:
    manifest = job(
        None,
        {"group": "trainer", "level": BLOCK},
        {"group": "rollout", "level": SPINE, "mode": "preferred"},
    )
    w = the_workload(plan(queued(manifest, []), SETTINGS))
    sets = {ps["name"]: ps for ps in w["spec"]["podSets"]}
    index = "longtail.dev/replica-index"
    assert sets["trainer"]["topologyRequest"] == {"required": BLOCK, "podIndexLabel": index}
    assert sets["rollout"]["topologyRequest"] == {"preferred": SPINE, "podIndexLabel": index}
    assert "topologyRequest" not in sets["verifier"]
    shape = w["metadata"]["annotations"]["longtail.dev/podsets"]
    assert BLOCK in shape  # a changed request is a changed shape: the Workload is replaced
    plain = the_workload(plan(queued(job(None), []), SETTINGS))
    assert plain["metadata"]["annotations"]["longtail.dev/podsets"] != shape
    go = plan(queued(manifest, [], admitted(w)), SETTINGS)
    made = {m["metadata"]["name"]: m for m in go.create if m["kind"] == "Pod"}
    assert len(made) == 5
    for name, m in made.items():
        gated = not name.startswith("tiny-verifier")
        gates = m["spec"].get("schedulingGates", [])
        assert (gates == [{"name": "kueue.x-k8s.io/topology"}]) == gated, name
        notes = m["metadata"]["annotations"]
        assert (notes.get("kueue.x-k8s.io/workload") == w["metadata"]["name"]) == gated, name
        assert m["spec"]["nodeSelector"]["gpu"] == "h100"  # the flavour, as before
        assert m["metadata"]["labels"][index]  # the podIndexLabel the ungater ranks by
        kubernetes_validate.validate(m, "1.36.0", strict=True)


def priority(kind: str, name: str, value: int | None) -> kueue.Priority:
    group = "kueue.x-k8s.io" if kind == "WorkloadPriorityClass" else "scheduling.k8s.io"
    return kueue.Priority(group, kind, name, value)


def test_the_workload_names_its_priority_class_and_value_the_label_winning() -> None:
    manifest = job(None, priorityClassName="research-high")
    source = kueue.priority_source(None, "research-high")
    assert source == priority("PriorityClass", "research-high", None)
    assert (source.api_version, source.plural) == ("scheduling.k8s.io/v1", "priorityclasses")
    p = plan(
        queued(manifest, [], workload_priority=priority("PriorityClass", "research-high", 1000)),
        SETTINGS,
    )
    spec = the_workload(p)["spec"]
    assert spec["priorityClassRef"] == {
        "group": "scheduling.k8s.io",
        "kind": "PriorityClass",
        "name": "research-high",
    }
    assert spec["priority"] == 1000
    assert "priorityClassName" not in spec and "priorityClassSource" not in spec  # v1beta1's
    label = kueue.priority_source("batch-low", "research-high")
    assert label == priority("WorkloadPriorityClass", "batch-low", None)
    assert (label.api_version, label.plural) == (
        "kueue.x-k8s.io/v1beta2",
        "workloadpriorityclasses",
    )
    wpc = priority("WorkloadPriorityClass", "batch-low", 10)
    spec = the_workload(
        plan(queued(manifest, [], priority="batch-low", workload_priority=wpc), SETTINGS)
    )["spec"]
    assert spec["priorityClassRef"]["kind"] == "WorkloadPriorityClass"
    assert (spec["priorityClassRef"]["group"], spec["priority"]) == ("kueue.x-k8s.io", 10)
    assert kueue.priority_source(None, None) is None
    assert "priority" not in the_workload(plan(queued(job(None), []), SETTINGS))["spec"]


def test_a_missing_priority_class_makes_no_workload_and_the_job_waits_naming_it() -> None:
    manifest = job(None, priorityClassName="research-high")
    missing = priority("PriorityClass", "research-high", None)
    p = plan(queued(manifest, [], workload_priority=missing), SETTINGS)
    assert not [m for m in p.create if m["kind"] in ("Workload", "Pod")]
    assert p.status.phase == "Queued"
    queued_cond = next(c for c in p.status.conditions if c.type == "Queued")
    assert queued_cond.reason == "PriorityClassNotFound"
    assert "research-high" in queued_cond.message and "PriorityClass" in queued_cond.message
    found = plan(
        queued(manifest, [], workload_priority=priority("PriorityClass", "research-high", 5)),
        SETTINGS,
    )
    assert the_workload(found)["spec"]["priority"] == 5


# --- what a placer cannot express: refused, a running job losing nothing ----------------------


def test_what_the_placer_cannot_express_is_refused_naming_field_and_backend() -> None:
    cosched = job({"backend": "coscheduling"}, {"group": "trainer", "level": BLOCK})
    [err] = refusals(spec_of(cosched), SETTINGS, {})
    assert err.path == "spec.scheduling.topology" and "coscheduling" in str(err)
    on_kueue = job(None, {"group": "job", "level": BLOCK})
    [err] = refusals(spec_of(on_kueue), SETTINGS, QUEUE)
    assert err.path == "spec.scheduling.topology[0].group" and "Kueue" in str(err)
    assert refusals(spec_of(job(None, {"group": "trainer", "level": BLOCK})), SETTINGS, QUEUE) == []
    # The install's default gang counts: no gang of the job's own, the default places it.
    alone = job(None, {"group": "trainer", "level": BLOCK})
    [err] = refusals(spec_of(alone), SETTINGS, {})
    assert "no gang backend" in str(err)
    by_default = Settings(default_gang_backend="volcano")
    assert refusals(spec_of(alone), by_default, {}) == []
    cosched_default = Settings(default_gang_backend="coscheduling")
    [err] = refusals(spec_of(alone), cosched_default, {})
    assert "coscheduling" in str(err)
    assert refusals(None, SETTINGS, {}) == []  # field errors are reported as they are


def test_a_refused_topology_edit_keeps_a_running_job_and_its_pods() -> None:
    accepted = job({"backend": "volcano"}, {"group": "trainer", "level": BLOCK})
    accepted["spec"]["trainer"]["replicas"] = 1  # the test's pods carry no group labels
    spec = spec_of(accepted)
    pods = all_pods(spec, ready=True)
    edit = copy.deepcopy(accepted)
    edit["spec"]["scheduling"]["gang"] = {"backend": "coscheduling"}
    checked = validate_manifest(edit)
    errors = tuple(str(e) for e in refusals(checked.spec, SETTINGS, {}))
    assert errors and "coscheduling" in errors[0]
    cm = builders.job_configmap(JOB, accepted["spec"])["data"]
    gate = specgate.decide(checked.spec, edit["spec"], errors, cm, pods, finished=False)
    obs = observed(
        edit,
        pods,
        spec=gate.spec,
        raw_spec=gate.raw_spec,
        errors=errors,
        gate=gate,
        configmap=cm,
        gang_group=True,
        previous=RLJobStatus(phase="Running"),
    )
    p = plan(obs, SETTINGS)
    assert not p.delete_pods and not p.delete_objects
    conds = {c.type: c for c in p.status.conditions}
    assert conds["SpecAccepted"].status == "False"
    assert "spec.scheduling.topology" in conds["SpecAccepted"].message


# --- a required topology nothing can hold: the job waits, naming the label -------------------


def test_unscheduled_pods_under_a_required_topology_name_the_label_they_wait_for() -> None:
    manifest = job({"backend": "volcano"}, {"group": "trainer", "level": BLOCK})
    spec = spec_of(manifest)

    def pending(scheduled: bool) -> list[Any]:
        world = builders.trainer_world(spec)
        return [
            dataclasses.replace(q, scheduled=scheduled, ready=False, phase="Pending")
            if q.role != "trainer"
            else dataclasses.replace(
                q, scheduled=scheduled, ready=False, phase="Pending", group=0, world=world
            )
            for q in all_pods(spec)
        ]

    p = plan(observed(manifest, pending(False), gang_group=True), SETTINGS)
    conds = {c.type: c for c in p.status.conditions}
    trainer = conds["TrainerReady"]
    assert (trainer.status, trainer.reason) == ("False", "ReplicasNotReady")
    assert BLOCK in trainer.message and "2 pod(s) not scheduled" in trainer.message
    assert "label the nodes" in trainer.message
    assert BLOCK not in conds["RolloutReady"].message  # the rollout pods ask for nothing
    p = plan(observed(manifest, pending(True), gang_group=True), SETTINGS)
    assert BLOCK not in {c.type: c for c in p.status.conditions}["TrainerReady"].message


def test_a_workload_waiting_for_admission_names_its_required_levels() -> None:
    manifest = job(None, {"group": "trainer", "level": BLOCK})
    w = the_workload(plan(queued(manifest, []), SETTINGS))
    pending = kueue.view(w, {})
    p = plan(queued(manifest, [], pending), SETTINGS)
    queued_cond = next(c for c in p.status.conditions if c.type == "Queued")
    assert queued_cond.reason == "WaitingForAdmission"
    assert f"trainer in one domain of {BLOCK}" in queued_cond.message


def test_example_09_is_accepted_and_asks_kueue_for_its_topology_and_priority() -> None:
    manifest = yaml.safe_load((REPO / "examples" / "09-tiny-arith-topology.yaml").read_text())
    manifest["metadata"]["name"] = JOB.name
    labels = manifest["metadata"]["labels"]
    assert refusals(spec_of(manifest), SETTINGS, labels) == []
    high = priority("PriorityClass", "research-high", 1000)
    p = plan(queued(manifest, [], workload_priority=high), SETTINGS)
    spec = the_workload(p)["spec"]
    requests = {ps["name"]: ps.get("topologyRequest") for ps in spec["podSets"]}
    assert requests["trainer"]["required"] == BLOCK
    assert requests["rollout"]["preferred"] == SPINE
    assert (spec["priorityClassRef"]["name"], spec["priority"]) == ("research-high", 1000)
    # Without its queue label a gang places it; coscheduling cannot, and says so.
    cosched = copy.deepcopy(manifest)
    cosched["spec"]["scheduling"]["gang"] = {"backend": "coscheduling"}
    [err] = refusals(spec_of(cosched), SETTINGS, {})
    assert "coscheduling" in str(err)
