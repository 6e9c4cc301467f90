"""Placement on shared clusters, on the real v1.20 control plane: the operator's PodGroup of
each gang backend, and an RLJob labelled for Kueue on a cluster without Kueue.

The three gang schedulers' PodGroup APIs are installed as CRDs (``crds/podgroups.yaml``: the
real group, version, kind and plural with a structural schema of the spec, so a field the
operator misspells is pruned and missing here). The operator (``opharness.py``) runs as its
limited identity bound to exactly ``operator/rbac/clusterrole.yaml``. No real Volcano, coscheduling
or KAI runs: the pods name a scheduler that does not exist, so kube-scheduler leaves them, and
:func:`gang_bind` plays the gang scheduler where a test needs running pods: once every member
of the group exists it binds them all to the fake GPU node, which the fake kubelet then runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from opharness import (
    REPO,
    apply,
    get,
    install_crds,
    job_manifest,
    live_pods,
    pods,
    trainer_at,
    wait_phase,
)

from longtail_operator.settings import Settings

if TYPE_CHECKING:
    from conftest import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

CRDS = REPO / "tests" / "integration" / "crds" / "podgroups.yaml"
GROUPS = {
    "volcano": "podgroups.scheduling.volcano.sh",
    "coscheduling": "podgroups.scheduling.x-k8s.io",
    "kai": "podgroups.scheduling.run.ai",
}
GANGS = {
    "volcano": {"backend": "volcano", "queue": "research"},
    "coscheduling": {"backend": "coscheduling", "scheduleTimeoutSeconds": 90},
    "kai": {"backend": "kai", "queue": "team-a"},
}
MEMBERS = 5  # 2 trainer pods (one group), 2 rollout, 1 verifier


@pytest.fixture(scope="module")
def podgroup_crds(control_plane: ControlPlane) -> Iterator[None]:
    groups = [crd.split(".", 1)[1] for crd in GROUPS.values()]
    install_crds(control_plane, CRDS, list(GROUPS.values()), groups)
    yield


def gang_job(ns: str, gang: dict[str, Any]) -> dict[str, Any]:
    m = job_manifest(ns)
    m["spec"]["trainer"]["replicas"] = 2
    m["spec"]["scheduling"] = {"gang": gang}
    return m


def podgroup(cp: ControlPlane, ns: str, backend: str) -> dict[str, Any] | None:
    out = cp.kubectl("-n", ns, "get", GROUPS[backend], "tiny", "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def gang_bind(cp: ControlPlane, ns: str) -> int:
    """The gang scheduler's part: bind every unbound pod once all members exist."""
    unbound = [
        p for p in pods(cp, ns).values()
        if not p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
    ]  # fmt: skip
    bound = len(live_pods(cp, ns)) - len(unbound)
    if not unbound or bound + len(unbound) < MEMBERS:
        return 0
    done = 0
    for p in unbound:
        name = p["metadata"]["name"]
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "fake-gpu-node"},
        }
        # A pod deleted meanwhile (a restarting trainer group) cannot be bound: next round.
        out = cp.kubectl("-n", ns, "create", "-f", "-", input=json.dumps(body), check=False)
        done += out.returncode == 0
    return done


def suspend(cp: ControlPlane, ns: str, value: bool) -> None:
    patch = json.dumps({"spec": {"suspend": value}})
    cp.kubectl("-n", ns, "patch", "rljob", "tiny", "--type=merge", "-p", patch)


@pytest.mark.parametrize("backend", ["volcano", "coscheduling", "kai"])
def test_the_group_comes_before_the_pods_and_every_pod_joins_it(
    control_plane: ControlPlane, ns: str, podgroup_crds: None, backend: str
) -> None:
    cp = control_plane
    apply(cp, gang_job(ns, GANGS[backend]))
    cp.wait_for(lambda: len(live_pods(cp, ns)) == MEMBERS, timeout=60, what="the 5 pods")
    group = podgroup(cp, ns, backend)
    assert group is not None
    spec = group["spec"]
    assert spec["minMember"] == MEMBERS
    if backend == "volcano":
        assert spec["minTaskMember"] == {"trainer": 2, "rollout": 2, "verifier": 1}
        assert spec["queue"] == "research"
    elif backend == "coscheduling":
        assert spec["scheduleTimeoutSeconds"] == 90
    else:
        assert spec["queue"] == "team-a"
        assert {g["name"]: g["minMember"] for g in spec["subGroups"]} == {
            "trainer": 2, "rollout": 2, "verifier": 1,
        }  # fmt: skip
    [owner] = group["metadata"]["ownerReferences"]
    assert owner["kind"] == "RLJob" and owner["name"] == "tiny" and owner["controller"]
    made = group["metadata"]["creationTimestamp"]
    scheduler = {"volcano": "volcano", "coscheduling": "scheduler-plugins-scheduler"}
    for name, p in pods(cp, ns).items():
        assert p["metadata"]["creationTimestamp"] >= made, name  # never a pod without its group
        assert p["spec"]["schedulerName"] == scheduler.get(backend, "kai-scheduler")
        assert not p["spec"].get("nodeName")  # kube-scheduler leaves another scheduler's pods
        meta, role = p["metadata"], p["metadata"]["labels"]["longtail.dev/role"]
        if backend == "volcano":
            assert meta["annotations"]["scheduling.k8s.io/group-name"] == "tiny"
            assert meta["annotations"]["volcano.sh/task-spec"] == role
        elif backend == "coscheduling":
            assert meta["labels"]["scheduling.x-k8s.io/pod-group"] == "tiny"
        else:
            assert meta["annotations"]["pod-group-name"] == "tiny"
            assert meta["annotations"]["kai.scheduler/skip-podgrouper"] == "true"
            assert meta["labels"]["kai.scheduler/subgroup-name"] == role


BLOCK = "network.topology.kubernetes.io/block"
TOPOLOGY = {
    "volcano": {"backend": "volcano", "queue": "research"},
    "kai": {"backend": "kai", "queue": "team-a", "topologyName": "cluster-topology"},
}


@pytest.mark.parametrize("backend", ["volcano", "kai"])
def test_the_groups_topology_and_priority_pass_the_schedulers_schema(
    control_plane: ControlPlane, ns: str, podgroup_crds: None, backend: str
) -> None:
    """The job's and the trainer's topology and the priority class, in the PodGroup as stored:
    a field the CRD does not know would be pruned (issue #52; docs/scheduling.md)."""
    cp = control_plane
    high = f"lt-high-{ns}"[:63]
    body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": high}, "value": 1000}  # fmt: skip
    cp.kubectl("apply", "-f", "-", input=json.dumps(body))
    try:
        m = gang_job(ns, TOPOLOGY[backend])
        m["spec"]["scheduling"]["priorityClassName"] = high
        m["spec"]["scheduling"]["topology"] = [
            {"group": "job", "level": "topology.kubernetes.io/zone", "mode": "preferred"},
            {"group": "trainer", "level": BLOCK},
        ]
        apply(cp, m)
        cp.wait_for(lambda: len(live_pods(cp, ns)) == MEMBERS, timeout=60, what="the 5 pods")
        group = podgroup(cp, ns, backend)
        assert group is not None
        spec = group["spec"]
        assert spec["priorityClassName"] == high
        if backend == "volcano":
            assert spec["networkTopology"] == {"mode": "soft"}
            [trainer] = spec["subGroupPolicy"]
            assert trainer == {
                "name": "trainer",
                "subGroupSize": 2,
                "labelSelector": {
                    "matchLabels": {"longtail.dev/rljob": "tiny", "longtail.dev/role": "trainer"}
                },
                "networkTopology": {"mode": "hard", "highestTierName": BLOCK},
            }
        else:
            assert spec["topologyConstraint"] == {
                "topology": "cluster-topology",
                "preferredTopologyLevel": "topology.kubernetes.io/zone",
            }
            subgroups = {g["name"]: g for g in spec["subGroups"]}
            assert subgroups["trainer"]["topologyConstraint"] == {
                "topology": "cluster-topology", "requiredTopologyLevel": BLOCK,
            }  # fmt: skip
            assert "topologyConstraint" not in subgroups["rollout"]
        for name, p in pods(cp, ns).items():
            assert p["spec"]["priorityClassName"] == high, name
            assert p["spec"]["priority"] == 1000, name

        # No scheduler places them (no node carries the level either): the job says why.
        def trainer_waits() -> str | None:
            found = get(cp, ns, "rljob", "tiny").get("status", {}).get("conditions", [])
            text = next((c["message"] for c in found if c["type"] == "TrainerReady"), "")
            return text if BLOCK in text else None

        text = cp.wait_for(trainer_waits, timeout=60, what="TrainerReady naming the level")
        assert "2 pod(s) not scheduled" in text and "label the nodes" in text
    finally:
        cp.kubectl("delete", "priorityclass", high, "--wait=false", check=False)


def test_a_missing_priority_class_is_named_and_the_job_starts_once_it_exists(
    control_plane: ControlPlane, ns: str, podgroup_crds: None
) -> None:
    """Without Kueue the pods carry the class: the API server refuses a pod naming a class
    that does not exist (403), which the operator shows, creating nothing, until it exists."""
    cp = control_plane
    high = f"lt-missing-{ns}"[:63]
    m = gang_job(ns, GANGS["volcano"])
    m["spec"]["scheduling"]["priorityClassName"] = high
    apply(cp, m)

    def named() -> str | None:
        found = get(cp, ns, "rljob", "tiny").get("status", {}).get("conditions", [])
        return next((c["message"] for c in found if high in c.get("message", "")), None)

    text = cp.wait_for(named, timeout=60, what="a condition naming the missing class")
    assert "no PriorityClass with name" in text
    assert not pods(cp, ns) and podgroup(cp, ns, "volcano") is None
    body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": high}, "value": 10}  # fmt: skip
    cp.kubectl("apply", "-f", "-", input=json.dumps(body))
    try:
        cp.wait_for(lambda: len(live_pods(cp, ns)) == MEMBERS, timeout=90, what="the pods")
    finally:
        cp.kubectl("delete", "priorityclass", high, "--wait=false", check=False)


def test_a_topology_the_backend_cannot_express_is_refused_and_the_running_pods_stay(
    control_plane: ControlPlane, ns: str, podgroup_crds: None
) -> None:
    cp = control_plane
    apply(cp, gang_job(ns, GANGS["coscheduling"]))
    cp.wait_for(lambda: len(live_pods(cp, ns)) == MEMBERS, timeout=60, what="the 5 pods")
    before = {n: p["metadata"]["uid"] for n, p in pods(cp, ns).items()}
    edit = {"spec": {"scheduling": {"topology": [{"group": "trainer", "level": BLOCK}]}}}
    cp.kubectl("-n", ns, "patch", "rljob", "tiny", "--type=merge", "-p", json.dumps(edit))

    def refused() -> dict[str, Any] | None:
        j = get(cp, ns, "rljob", "tiny")
        found = {c["type"]: c for c in j.get("status", {}).get("conditions", [])}
        accepted = found.get("SpecAccepted")
        return accepted if accepted is not None and accepted["status"] == "False" else None

    accepted = cp.wait_for(refused, timeout=60, what="SpecAccepted False")
    assert "spec.scheduling.topology" in accepted["message"]
    assert "coscheduling" in accepted["message"]
    after = {n: p["metadata"]["uid"] for n, p in pods(cp, ns).items()}
    assert after == before  # nothing of the running job was lost


def test_suspend_deletes_the_group_with_the_pods_and_resume_makes_it_again(
    control_plane: ControlPlane, ns: str, podgroup_crds: None
) -> None:
    cp = control_plane
    apply(cp, gang_job(ns, GANGS["volcano"]))
    cp.wait_for(lambda: podgroup(cp, ns, "volcano"), timeout=60, what="the PodGroup")
    first = podgroup(cp, ns, "volcano")
    assert first is not None
    suspend(cp, ns, True)
    wait_phase(cp, ns, "Suspended", timeout=90)
    cp.wait_for(lambda: podgroup(cp, ns, "volcano") is None, timeout=60, what="group deleted")
    cp.wait_for(lambda: not live_pods(cp, ns), timeout=60, what="pods deleted")
    spec = get(cp, ns, "rljob", "tiny")["spec"]
    assert spec["suspend"] is True  # the user's suspend stays
    suspend(cp, ns, False)
    cp.wait_for(lambda: podgroup(cp, ns, "volcano"), timeout=60, what="group made again")
    again = podgroup(cp, ns, "volcano")
    assert again is not None and again["metadata"]["uid"] != first["metadata"]["uid"]
    cp.wait_for(lambda: len(live_pods(cp, ns)) == MEMBERS, timeout=60, what="pods made again")


def test_a_trainer_group_restart_keeps_one_group(
    control_plane: ControlPlane, ns: str, podgroup_crds: None, kubelet: Any, settings: Settings
) -> None:
    cp = control_plane
    trainer = trainer_at(kubelet, settings, ns)
    try:
        apply(cp, gang_job(ns, GANGS["coscheduling"]))

        # Bind on every poll until Running: a bind refused by a busy API server (or a pod
        # replaced meanwhile) is retried, as a gang scheduler would.
        def running() -> bool:
            gang_bind(cp, ns)
            return get(cp, ns, "rljob", "tiny").get("status", {}).get("phase") == "Running"

        cp.wait_for(running, timeout=150, what="the gang bound and the job Running")
        group = podgroup(cp, ns, "coscheduling")
        assert group is not None
        before = {n: p["metadata"]["uid"] for n, p in pods(cp, ns).items()}
        kubelet.fail(ns, "tiny-trainer-1", "NCCL error: unhandled system error")

        def restarted() -> bool:
            gang_bind(cp, ns)  # the new trainer pods, placed against the running members
            now = {n: p["metadata"]["uid"] for n, p in pods(cp, ns).items()}
            new = [n for n in ("tiny-trainer-0", "tiny-trainer-1") if now.get(n) != before[n]]
            return len(new) == 2 and len(live_pods(cp, ns)) == MEMBERS

        cp.wait_for(restarted, timeout=120, what="the trainer group replaced")
        after = podgroup(cp, ns, "coscheduling")
        assert after is not None and after["metadata"]["uid"] == group["metadata"]["uid"]
        listed = cp.kubectl("-n", ns, "get", GROUPS["coscheduling"], "-o", "json").stdout
        assert [g["metadata"]["name"] for g in json.loads(listed)["items"]] == ["tiny"]
    finally:
        trainer.close()


def test_a_job_labelled_for_kueue_on_a_cluster_without_kueue_waits_and_says_why(
    control_plane: ControlPlane, ns: str
) -> None:
    cp = control_plane
    m = job_manifest(ns)
    m["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    apply(cp, m)
    j = wait_phase(cp, ns, "Queued", timeout=60)
    queued = next(c for c in j["status"]["conditions"] if c["type"] == "Queued")
    assert (queued["status"], queued["reason"]) == ("True", "KueueNotInstalled")
    assert "install Kueue" in queued["message"] and "remove the label" in queued["message"]
    assert not live_pods(cp, ns)  # never started around the queue
    cp.kubectl("-n", ns, "label", "rljob", "tiny", "kueue.x-k8s.io/queue-name-")
    cp.wait_for(lambda: len(live_pods(cp, ns)) == 4, timeout=60, what="the pods, label removed")
