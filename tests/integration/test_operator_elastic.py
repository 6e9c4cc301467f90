"""Elastic rollout (``spec.rollout.minReplicas``) on the real v1.20 control plane: a rollout pod
evicted through the real Eviction API (``policy/v1beta1``, as a drain does it) shrinks the job
without charging ``backoffLimit`` and is made again; Kueue's partial admission (the fake Kueue
of ``test_operator_kueue.py``) runs the job with the rollout pods admitted and adds pods when
more are admitted; below ``minReplicas`` past the grace the job checkpoints, gives its quota
back and resumes once admitted again.

A v1.20 eviction leaves no mark on the pod but its graceful deletion (no ``DisruptionTarget``
condition before 1.26): the fake kubelet finishes the deletion at once, so the operator sees a
rollout pod it knew gone, and says so (``status.rollout.lastShrink``, a ``RolloutShrunk``
event).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest
from opharness import (
    ALL_PODS,
    apply,
    cond,
    events,
    job,
    job_manifest,
    live_pods,
    pods,
    trainer_at,
    wait_phase,
)
from test_operator_kueue import FakeKueue, kueue, kueue_crds, queued_job, the_workload

from longtail_operator.settings import Settings

if TYPE_CHECKING:
    from conftest import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
__all__ = ["kueue", "kueue_crds"]  # the fake Kueue's fixtures, used here too


def evict(cp: ControlPlane, ns: str, pod: str) -> float:
    """Evict ``pod`` through the Eviction API (``policy/v1beta1`` on a v1.20 API server, as
    ``kubectl drain`` does); ``time.monotonic()`` once the API server accepted it."""
    body = {
        "apiVersion": "policy/v1beta1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": ns},
    }
    path = f"/api/v1/namespaces/{ns}/pods/{pod}/eviction"
    cp.kubectl("create", "--raw", path, "-f", "-", input=json.dumps(body))
    return time.monotonic()


def uid(cp: ControlPlane, ns: str, pod: str) -> str | None:
    found = pods(cp, ns).get(pod)
    return None if found is None else str(found["metadata"]["uid"])


def rollout_status(cp: ControlPlane, ns: str) -> dict[str, Any]:
    return job(cp, ns).get("status", {}).get("rollout") or {}


def test_an_evicted_rollout_pod_shrinks_the_job_uncharged_and_is_made_again(
    control_plane: ControlPlane, ns: str
) -> None:
    cp = control_plane
    m = job_manifest(ns)
    m["spec"]["rollout"]["minReplicas"] = 1
    apply(cp, m)
    wait_phase(cp, ns, "Running", timeout=90)
    cp.wait_for(lambda: rollout_status(cp, ns).get("ready") == 2, timeout=60, what="2 ready")
    before = uid(cp, ns, "tiny-rollout-1")
    evict(cp, ns, "tiny-rollout-1")

    def shrunk() -> dict[str, Any] | None:
        last = rollout_status(cp, ns).get("lastShrink") or {}
        return last if last.get("pods") == ["tiny-rollout-1"] else None

    last = cp.wait_for(shrunk, timeout=60, what="status.rollout.lastShrink")
    assert last["reason"] == "PodDeleted" and "Eviction API" in last["message"]
    cp.wait_for(
        lambda: uid(cp, ns, "tiny-rollout-1") not in (None, before), timeout=60,
        what="the evicted rollout pod made again",
    )  # fmt: skip
    cp.wait_for(lambda: rollout_status(cp, ns).get("ready") == 2, timeout=60, what="2 ready again")
    j = job(cp, ns)
    assert j["status"]["roles"]["rollout"]["failed"] == 0  # not charged to backoffLimit
    assert j["status"]["phase"] == "Running"
    assert cond(j, "RolloutCapacity") == ("True", "MinReplicasReady")
    assert "RolloutShrunk" in events(cp, ns)


def test_partial_admission_runs_with_the_admitted_pods_and_adds_them_when_more_are_admitted(
    control_plane: ControlPlane, ns: str, kueue: FakeKueue
) -> None:
    cp = control_plane
    kueue.partial = {"rollout": 1}  # the queue has room for one rollout pod of three
    m = queued_job(ns)
    m["spec"]["rollout"].update(replicas=3, minReplicas=1)
    apply(cp, m)
    w = cp.wait_for(lambda: the_workload(kueue), timeout=60, what="the Workload")
    rollout = next(ps for ps in w["spec"]["podSets"] if ps["name"] == "rollout")
    assert (rollout["count"], rollout["minCount"]) == (3, 1)
    wait_phase(cp, ns, "Running", timeout=90)
    assert live_pods(cp, ns) == {"tiny-trainer-0", "tiny-verifier-0", "tiny-rollout-0"}
    st = rollout_status(cp, ns)
    assert (st["desired"], st["admitted"], st["ready"]) == (3, 1, 1)
    kueue.admit_count(w["metadata"]["name"], "rollout", 3)  # room for all three now
    cp.wait_for(
        lambda: live_pods(cp, ns) == ALL_PODS | {"tiny-rollout-2"}, timeout=60,
        what="the newly admitted rollout pods",
    )  # fmt: skip
    cp.wait_for(lambda: rollout_status(cp, ns).get("ready") == 3, timeout=60, what="3 ready")
    assert rollout_status(cp, ns)["admitted"] == 3 and job(cp, ns)["status"]["phase"] == "Running"


def test_below_min_replicas_past_the_grace_checkpoints_releases_the_quota_and_resumes(
    control_plane: ControlPlane, ns: str, kueue: FakeKueue, kubelet: Any, settings: Settings
) -> None:
    cp = control_plane
    trainer = trainer_at(kubelet, settings, ns)
    try:
        trainer.status = trainer.status.__class__(
            step=4, total_steps=20, phase="running", policy_version=4, drafter_version=1
        )
        m = queued_job(ns)
        m["spec"]["rollout"].update(minReplicas=2, belowMinGraceSeconds=3)
        apply(cp, m)
        wait_phase(cp, ns, "Running", timeout=90)
        cp.wait_for(lambda: rollout_status(cp, ns).get("ready") == 2, timeout=60, what="2 ready")
        w = the_workload(kueue)
        assert w is not None
        kueue.hold = True  # nothing admitted again until the test says so
        kubelet.not_ready.add((ns, "tiny-rollout-1"))  # its replacement never gets ready
        evict(cp, ns, "tiny-rollout-1")

        cp.wait_for(lambda: not pods(cp, ns), timeout=90, what="every pod gone")
        assert trainer.checkpoints == [4]  # checkpointed before the pods went
        cp.wait_for(
            lambda: (the_workload(kueue) or {}).get("status", {}).get("admission") is None,
            timeout=60, what="the quota given back",
        )  # fmt: skip
        j = job(cp, ns)
        assert j["status"]["phase"] == "Queued" and j["status"]["roles"]["rollout"]["failed"] == 0
        # What happened, where the user looks: the events (the stop itself can be over within
        # one poll here: the fake trainer checkpoints at once and the fake kubelet deletes at
        # once) and Kueue's Admitted condition, which the release wrote.
        said = events(cp, ns)
        assert {"RolloutShrunk", "BelowMinReplicas", "CheckpointSaved"} <= set(said), said
        admitted = {c["type"]: c for c in (the_workload(kueue) or {})["status"]["conditions"]}
        assert "rollout.minReplicas=2" in admitted["Admitted"]["message"]
        kubelet.not_ready.discard((ns, "tiny-rollout-1"))
        kueue.hold = False  # admitted again
        cp.wait_for(lambda: live_pods(cp, ns) == ALL_PODS, timeout=60, what="pods re-admitted")
        j = wait_phase(cp, ns, "Running", timeout=90)
        assert cond(j, "RolloutCapacity") == ("True", "MinReplicasReady")
    finally:
        trainer.close()
