"""Topology and priority of a job admitted by Kueue, on the real v1.20 control plane (issue #52,
items 2-3; docs/scheduling.md, "Topology and priority").

Kueue's APIs and the fake Kueue are ``test_operator_kueue.py``'s (``crds/kueue.yaml`` holds
v1beta2's field names, so a field the operator misspells, such as v1beta1's
``priorityClassName``, is pruned and missing here). The operator runs as its limited identity
bound to exactly ``operator/rbac/clusterrole.yaml``, so reading the priority classes is checked
against its RBAC too. What the v1.20 control plane cannot show: it predates pod scheduling
gates (1.26), so it drops the ``kueue.x-k8s.io/topology`` gate the operator sets and the pods
schedule at once; the gate is checked against the 1.36 schema in
``tests/unit/operator/test_topology_priority.py``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from opharness import ALL_PODS, apply, cond, job, live_pods, pods, wait_phase
from test_operator_kueue import FakeKueue, kueue, kueue_crds, queued_job, the_workload

if TYPE_CHECKING:
    from conftest import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
__all__ = ["kueue", "kueue_crds"]  # the fake Kueue's fixtures, used here too

BLOCK = "network.topology.kubernetes.io/block"
RESOURCES = {
    "PriorityClass": ("scheduling.k8s.io/v1", "priorityclasses.scheduling.k8s.io"),
    "WorkloadPriorityClass": ("kueue.x-k8s.io/v1beta2", "workloadpriorityclasses.kueue.x-k8s.io"),
}


@pytest.fixture
def classes(control_plane: ControlPlane) -> Iterator[list[tuple[str, str]]]:
    """Cluster-scoped priority classes a test makes, (resource, name), deleted after it."""
    made: list[tuple[str, str]] = []
    yield made
    for resource, name in made:
        control_plane.kubectl("delete", resource, name, "--wait=false", check=False)


def class_name(made: list[tuple[str, str]], kind: str) -> str:
    """A unique name for a class of ``kind`` (deleted after the test once made)."""
    name = f"lt-{kind.lower()}-{uuid.uuid4().hex[:6]}"
    made.append((RESOURCES[kind][1], name))
    return name


def create_class(cp: ControlPlane, kind: str, name: str, value: int) -> None:
    body = {"apiVersion": RESOURCES[kind][0], "kind": kind, "metadata": {"name": name}}
    cp.kubectl("apply", "-f", "-", input=json.dumps({**body, "value": value}))


def test_a_trainer_topology_and_a_priority_class_reach_the_workload_and_every_pod(
    control_plane: ControlPlane, ns: str, kueue: FakeKueue, classes: list[tuple[str, str]]
) -> None:
    cp = control_plane
    kueue.hold = True
    high = class_name(classes, "PriorityClass")
    m = queued_job(ns)
    m["spec"]["scheduling"] = {
        "priorityClassName": high,
        "topology": [{"group": "trainer", "level": BLOCK}],
    }
    apply(cp, m)
    # The class does not exist yet: no Workload (Kueue needs its value), the job says why. The
    # operator may first say KueueNotInstalled: it learns that the Workload API is served again
    # (this module installs it after the one before removed it) by its next discovery.
    wait_phase(cp, ns, "Queued", timeout=60)

    def queued_for_the_class() -> dict[str, Any] | None:
        j = job(cp, ns)
        return j if cond(j, "Queued") == ("True", "PriorityClassNotFound") else None

    j = cp.wait_for(queued_for_the_class, timeout=60, what="Queued for the missing class")
    message = next(c["message"] for c in j["status"]["conditions"] if c["type"] == "Queued")
    assert high in message and "PriorityClass" in message
    assert not kueue.workloads() and not pods(cp, ns)
    create_class(cp, "PriorityClass", high, 1000)
    w = cp.wait_for(lambda: the_workload(kueue), timeout=60, what="the Workload")
    assert w["spec"]["priorityClassRef"] == {
        "group": "scheduling.k8s.io", "kind": "PriorityClass", "name": high,
    }  # fmt: skip
    assert w["spec"]["priority"] == 1000
    sets = {ps["name"]: ps for ps in w["spec"]["podSets"]}
    assert sets["trainer"]["topologyRequest"] == {
        "required": BLOCK, "podIndexLabel": "longtail.dev/replica-index",
    }  # fmt: skip
    assert "topologyRequest" not in sets["rollout"]
    kueue.hold = False
    cp.wait_for(lambda: live_pods(cp, ns) == ALL_PODS, timeout=60, what="pods after admission")
    name = w["metadata"]["name"]
    for pod_name, p in pods(cp, ns).items():
        assert p["spec"]["priorityClassName"] == high, pod_name
        assert p["spec"]["priority"] == 1000, pod_name  # the API server resolved the class
        notes = p["metadata"].get("annotations") or {}
        role = p["metadata"]["labels"]["longtail.dev/role"]
        assert (notes.get("kueue.x-k8s.io/workload") == name) == (role == "trainer"), pod_name
    wait_phase(cp, ns, "Running", timeout=90)


def test_the_workload_priority_class_label_wins_over_the_pods_class(
    control_plane: ControlPlane, ns: str, kueue: FakeKueue, classes: list[tuple[str, str]]
) -> None:
    cp = control_plane
    kueue.hold = True
    pods_class, batch = (
        class_name(classes, "PriorityClass"),
        class_name(classes, "WorkloadPriorityClass"),
    )
    create_class(cp, "PriorityClass", pods_class, 500)
    create_class(cp, "WorkloadPriorityClass", batch, 10)
    m = queued_job(ns)
    m["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = batch
    m["spec"]["scheduling"] = {"priorityClassName": pods_class}
    apply(cp, m)
    w: dict[str, Any] = cp.wait_for(lambda: the_workload(kueue), timeout=60, what="the Workload")
    assert w["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": batch,
    }  # fmt: skip
    assert w["spec"]["priority"] == 10
    kueue.hold = False
    cp.wait_for(lambda: live_pods(cp, ns) == ALL_PODS, timeout=60, what="pods after admission")
    assert {p["spec"]["priorityClassName"] for p in pods(cp, ns).values()} == {pods_class}
