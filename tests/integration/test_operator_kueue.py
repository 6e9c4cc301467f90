"""Admission by Kueue on the real v1.20 control plane, with a fake Kueue controller.

Kueue's Workload and ResourceFlavor APIs are installed as CRDs (``crds/kueue.yaml``: real
group, version, kinds, plurals and scopes). :class:`FakeKueue` plays Kueue's part through the
Workload status only, as Kueue does: it admits every active Workload of the test's namespace
that holds no admission (assigning the flavour ``fake-gpu``, whose node labels match the fake
kubelet's GPU node) unless the test holds it back, and evicts on demand. The operator
(``opharness.py``, its limited identity bound to exactly ``operator/rbac/clusterrole.yaml``)
does the job framework's part. A module of its own: once these CRDs exist the cluster serves
Kueue's API (``test_operator_scheduling.py`` checks a cluster without it).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException
from opharness import (
    ALL_PODS,
    REPO,
    apply,
    cond,
    install_crds,
    job,
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

CRDS = REPO / "tests" / "integration" / "crds" / "kueue.yaml"
FLAVOR = {
    "apiVersion": "kueue.x-k8s.io/v1beta2",
    "kind": "ResourceFlavor",
    "metadata": {"name": "fake-gpu"},
    "spec": {
        "nodeLabels": {"longtail.dev/fake-node": "true"},
        "tolerations": [{"key": "longtail.dev/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
}


class FakeKueue:
    """Admits and evicts the Workloads of one namespace through their status (see the module)."""

    def __init__(self, cp: ControlPlane, ns: str) -> None:
        self.cp, self.ns = cp, ns
        self.hold = False
        """While True nothing is admitted (a full queue)."""
        self.admissions = 0
        self.partial: dict[str, int] = {}
        """Pods admitted per podSet name, for a podSet asking for partial admission
        (``minCount``): Kueue's partial admission when the queue has room for fewer."""
        self.admitted_at = 0.0
        """``time.monotonic()`` when the last admission was written."""
        self.errors: list[str] = []
        """Failed passes of the admission loop (each retried at the next pass)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def workloads(self) -> list[dict[str, Any]]:
        # The API client, not kubectl: kubectl's discovery cache (shared by the session) can
        # still lack the Workload kind just after a module reinstalled Kueue.
        from kubernetes import client

        api = client.CustomObjectsApi(self.cp.api_client())
        found = api.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", self.ns, "workloads")
        return found["items"]  # type: ignore[no-any-return]

    def _patch_status(self, name: str, status: dict[str, Any]) -> None:
        # kubectl 1.20 has no --subresource: the API client patches the status subresource.
        from kubernetes import client

        api = client.CustomObjectsApi(self.cp.api_client())
        api.patch_namespaced_custom_object_status(
            "kueue.x-k8s.io", "v1beta2", self.ns, "workloads", name, {"status": status}
        )

    def _loop(self) -> None:
        while not self._stop.wait(0.3):
            if self.hold:
                continue
            try:
                self._admit_all()
            except (ApiException, urllib3.exceptions.HTTPError) as exc:  # tried again next pass
                self.errors.append(repr(exc))

    def _admit_all(self) -> None:
        for w in self.workloads():
            status = w.get("status") or {}
            if not w["spec"].get("active", True) or status.get("admission"):
                continue
            if w["metadata"].get("deletionTimestamp"):
                continue
            assign = [
                {"name": ps["name"], "count": self._count(ps), "flavors": {"cpu": "fake-gpu"}}
                for ps in w["spec"]["podSets"]
            ]
            conds = [
                {"type": t, "status": s, "reason": r, "message": r,
                 "lastTransitionTime": "2026-11-27T00:00:00Z"}
                for t, s, r in (("QuotaReserved", "True", "QuotaReserved"),
                                ("Admitted", "True", "Admitted"),
                                ("Evicted", "False", "QuotaReserved"))
            ]  # fmt: skip
            admission = {"clusterQueue": "cq", "podSetAssignments": assign}
            self._patch_status(w["metadata"]["name"], {"admission": admission, "conditions": conds})
            self.admitted_at = time.monotonic()
            self.admissions += 1

    def _count(self, ps: dict[str, Any]) -> int:
        if "minCount" not in ps or ps["name"] not in self.partial:
            return int(ps["count"])
        return max(int(ps["minCount"]), min(int(ps["count"]), self.partial[ps["name"]]))

    def admit_count(self, name: str, podset: str, count: int) -> None:
        """Kueue admits ``count`` pods of ``podset`` of the admitted Workload ``name`` now (its
        admission written again with the new count, as after a re-admission)."""
        w = next(x for x in self.workloads() if x["metadata"]["name"] == name)
        admission = w["status"]["admission"]
        for a in admission["podSetAssignments"]:
            if a["name"] == podset:
                a["count"] = count
        self._patch_status(name, {"admission": admission})

    def evict(self, name: str) -> float:
        """Evict the Workload ``name``; ``time.monotonic()`` once the API server has it."""
        w = next(x for x in self.workloads() if x["metadata"]["name"] == name)
        conds = [c for c in w["status"]["conditions"] if c["type"] != "Evicted"]
        conds.append({"type": "Evicted", "status": "True", "reason": "Preempted",
                      "message": "preempted by a higher priority workload",
                      "lastTransitionTime": "2026-11-27T00:00:01Z"})  # fmt: skip
        self._patch_status(name, {"conditions": conds})
        return time.monotonic()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def install_kueue(cp: ControlPlane) -> None:
    """Kueue's Workload and ResourceFlavor APIs, and the flavour :class:`FakeKueue` assigns."""
    crds = [
        "workloads.kueue.x-k8s.io",
        "resourceflavors.kueue.x-k8s.io",
        "workloadpriorityclasses.kueue.x-k8s.io",
    ]
    install_crds(cp, CRDS, crds, ["kueue.x-k8s.io"])
    cp.kubectl("apply", "-f", "-", input=json.dumps(FLAVOR))


def remove_kueue(cp: ControlPlane) -> None:
    """Undo :func:`install_kueue`, also for the Workloads the tests' namespaces left."""
    # Kueue's finalizer holds every Workload left by the tests' deleted namespaces: release them.
    left = json.loads(cp.kubectl("get", "workloads.kueue.x-k8s.io", "-A", "-o", "json").stdout)
    for w in left["items"]:
        meta = w["metadata"]
        drop = json.dumps({"metadata": {"finalizers": None}})
        cp.kubectl("-n", meta["namespace"], "patch", "workloads.kueue.x-k8s.io", meta["name"],
                   "--type=merge", "-p", drop, check=False)  # fmt: skip
    cp.kubectl("delete", "resourceflavor.kueue.x-k8s.io", "fake-gpu", check=False)
    cp.kubectl("delete", "-f", str(CRDS), "--wait=true", check=False)
    cp.wait_for(  # the next modules see a cluster without Kueue again
        lambda: "kueue.x-k8s.io" not in cp.kubectl("api-versions").stdout,
        timeout=60, what="kueue.x-k8s.io gone from discovery",
    )  # fmt: skip


@pytest.fixture(scope="module")
def kueue_crds(control_plane: ControlPlane) -> Iterator[None]:
    install_kueue(control_plane)
    yield
    remove_kueue(control_plane)


@pytest.fixture
def kueue(control_plane: ControlPlane, ns: str, kueue_crds: None) -> Iterator[FakeKueue]:
    k = FakeKueue(control_plane, ns)
    yield k
    k.close()


def queued_job(ns: str, **spec: Any) -> dict[str, Any]:
    m = job_manifest(ns, **spec)
    m["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    return m


def the_workload(k: FakeKueue) -> dict[str, Any] | None:
    items = [w for w in k.workloads() if not w["metadata"].get("deletionTimestamp")]
    return items[0] if len(items) == 1 else None


def test_no_pod_before_admission_then_every_pod_placed_on_the_flavors_node(
    control_plane: ControlPlane, ns: str, kueue: FakeKueue
) -> None:
    cp = control_plane
    kueue.hold = True  # a full queue
    apply(cp, queued_job(ns))
    w = cp.wait_for(lambda: the_workload(kueue), timeout=60, what="the Workload")
    assert w["spec"]["queueName"] == "team-a" and w["spec"]["active"] is True
    assert w["metadata"]["finalizers"] == ["kueue.x-k8s.io/resource-in-use"]
    assert {ps["name"]: ps["count"] for ps in w["spec"]["podSets"]} == {
        "trainer": 1, "rollout": 2, "verifier": 1,
    }  # fmt: skip
    j = wait_phase(cp, ns, "Queued")
    assert cond(j, "Queued") == ("True", "WaitingForAdmission")
    time.sleep(3)
    assert not pods(cp, ns)  # no pod exists before admission
    kueue.hold = False
    cp.wait_for(lambda: live_pods(cp, ns) == ALL_PODS, timeout=60, what="pods after admission")
    for name, p in pods(cp, ns).items():
        assert p["spec"]["nodeSelector"]["longtail.dev/fake-node"] == "true", name
        assert {"key": "longtail.dev/gpu", "operator": "Exists", "effect": "NoSchedule"} in p[
            "spec"
        ]["tolerations"]
        assert (
            p["metadata"]["labels"]["kueue.x-k8s.io/podset"]
            == p["metadata"]["labels"]["longtail.dev/role"]
        )
    # The real kube-scheduler binds them to the node whose labels the flavour names.
    cp.wait_for(
        lambda: all(p["spec"].get("nodeName") == "fake-gpu-node" for p in pods(cp, ns).values()),
        timeout=60, what="pods bound to the fake GPU node",
    )  # fmt: skip


def test_eviction_checkpoints_first_releases_after_the_last_pod_and_readmission_resumes(
    control_plane: ControlPlane, ns: str, kueue: FakeKueue, kubelet: Any, settings: Settings
) -> None:
    cp = control_plane
    trainer = trainer_at(kubelet, settings, ns)
    try:
        trainer.status = trainer.status.__class__(
            step=6, total_steps=20, phase="running", policy_version=6, drafter_version=1
        )
        apply(cp, queued_job(ns))
        wait_phase(cp, ns, "Running", timeout=90)
        w = the_workload(kueue)
        assert w is not None
        kueue.hold = True  # nothing re-admitted until the test says so
        slow = (ns, "tiny-trainer-0")
        kubelet.linger.add(slow)  # the trainer pod takes its time to stop
        kueue.evict(w["metadata"]["name"])

        def others_gone() -> bool:
            left = pods(cp, ns)
            return set(left) == {"tiny-trainer-0"} and bool(
                left["tiny-trainer-0"]["metadata"].get("deletionTimestamp")
            )

        cp.wait_for(others_gone, timeout=90, what="every pod but the slow trainer gone")
        assert trainer.checkpoints == [6]  # checkpointed before any pod was deleted
        time.sleep(3)  # several reconciles: the quota stays held while a pod is left
        held = (the_workload(kueue) or {}).get("status", {}).get("admission")
        assert held is not None
        kubelet.linger.discard(slow)
        cp.wait_for(lambda: not pods(cp, ns), timeout=60, what="the last pod gone")
        cp.wait_for(
            lambda: (the_workload(kueue) or {}).get("status", {}).get("admission") is None,
            timeout=60, what="the admission released once no pod is left",
        )  # fmt: skip
        assert job(cp, ns)["status"]["phase"] == "Queued"
        kueue.hold = False  # re-admitted
        cp.wait_for(lambda: live_pods(cp, ns) == ALL_PODS, timeout=60, what="pods re-admitted")
        env = {
            e["name"]: e.get("value")
            for e in pods(cp, ns)["tiny-trainer-0"]["spec"]["containers"][0]["env"]
        }
        assert env["LONGTAIL_RESUME"] == "true"  # resumes from the checkpoint
    finally:
        trainer.close()


def test_suspend_is_the_users_and_a_replicas_change_replaces_the_workload(
    control_plane: ControlPlane, ns: str, kueue: FakeKueue
) -> None:
    cp = control_plane
    apply(cp, queued_job(ns))
    cp.wait_for(lambda: live_pods(cp, ns) == ALL_PODS, timeout=60, what="pods")
    first = the_workload(kueue)
    assert first is not None
    cp.kubectl(
        "-n", ns, "patch", "rljob", "tiny", "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    wait_phase(cp, ns, "Suspended", timeout=90)
    cp.wait_for(
        lambda: (the_workload(kueue) or {}).get("spec", {}).get("active") is False,
        timeout=60, what="Workload spec.active false",
    )  # fmt: skip
    assert job(cp, ns)["spec"]["suspend"] is True  # never written by the operator
    # A replicas change while suspended: the Workload is replaced by one of the new shape.
    patch = json.dumps({"spec": {"suspend": False, "rollout": {"replicas": 3}}})
    cp.kubectl("-n", ns, "patch", "rljob", "tiny", "--type=merge", "-p", patch)

    def replaced() -> bool:
        w = the_workload(kueue)
        return bool(w and w["metadata"]["uid"] != first["metadata"]["uid"])

    cp.wait_for(replaced, timeout=90, what="a new Workload")
    w = the_workload(kueue)
    assert w is not None
    assert {ps["name"]: ps["count"] for ps in w["spec"]["podSets"]}["rollout"] == 3
    cp.wait_for(lambda: len(live_pods(cp, ns)) == 5, timeout=90, what="5 pods after admission")


def test_deleting_a_queued_job_lets_its_workload_go(
    control_plane: ControlPlane, ns: str, kueue: FakeKueue
) -> None:
    """Kueue's finalizer keeps a Workload until its job controller takes it off: a deleted
    RLJob, still queued or admitted and running, must not leave its Workload stuck."""
    cp = control_plane
    for admitted in (False, True):
        kueue.hold = not admitted
        apply(cp, queued_job(ns))
        cp.wait_for(lambda: the_workload(kueue), timeout=60, what="the Workload")
        if admitted:
            cp.wait_for(lambda: live_pods(cp, ns) == ALL_PODS, timeout=60, what="pods")
        else:
            wait_phase(cp, ns, "Queued")
        cp.kubectl("-n", ns, "delete", "rljob", "tiny", "--wait=false")
        cp.wait_for(lambda: not kueue.workloads(), timeout=90, what="the Workload gone")
        cp.wait_for(lambda: not pods(cp, ns), timeout=90, what="the pods gone")
