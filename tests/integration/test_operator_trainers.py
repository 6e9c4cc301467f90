"""Issue #20 against the real v1.20 control plane: a sharded trainer as one group of pods.

An RLJob with ``trainer.replicas: 2`` gets two trainer pods with the rendezvous environment
(``MASTER_ADDR`` = pod 0's DNS name behind the headless Service, ranks, world size), labels
naming their group and world, the headless Service with the rendezvous port and the
NetworkPolicy between trainer pods. Deleting one trainer pod restarts the whole trainer group
(the rollout and verifier pods stay), counts once against ``backoffLimit`` and the status says
why; a failed one does the same, and past ``backoffLimit`` the job fails. The operator talks to
pod 0 only: its ``FakeTrainer`` (``tests/doubles/fakeworker.py``) answers the status polls.
Fixtures (the operator as its limited identity, the fake kubelet): ``opharness.py``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pytest
from opharness import apply, cond, events, get, job, job_manifest, pods, trainer_at, wait_phase

from longtail_operator.settings import Settings

if TYPE_CHECKING:
    from conftest import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TRAINERS = ("tiny-trainer-0", "tiny-trainer-1")


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    [c] = [c for c in pod["spec"]["containers"] if c["name"] == "worker"]
    return {e["name"]: e.get("value") for e in c["env"]}


def uids(cp: ControlPlane, ns: str) -> dict[str, str]:
    return {name: p["metadata"]["uid"] for name, p in pods(cp, ns).items()}


def check_group(cp: ControlPlane, ns: str, group: str) -> None:
    """Both trainer pods carry the rendezvous of one 2 pods x 2 ranks world and the labels."""
    got = pods(cp, ns)
    host = f"tiny-trainer-0.tiny-trainer.{ns}.svc"
    for rank, name in enumerate(TRAINERS):
        p = got[name]
        env, labels = env_of(p), p["metadata"]["labels"]
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (host, "29500"), env
        assert (env["NNODES"], env["NODE_RANK"]) == ("2", str(rank)), env
        assert (env["LOCAL_WORLD_SIZE"], env["WORLD_SIZE"]) == ("2", "4"), env
        assert labels["longtail.dev/trainer-group"] == group
        assert labels["longtail.dev/trainer-world"] == "2x2"
        assert (p["spec"]["hostname"], p["spec"]["subdomain"]) == (name, "tiny-trainer")
    for name in ("tiny-rollout-0", "tiny-verifier-0"):
        assert env_of(got[name])["LONGTAIL_TRAINER_URL"].startswith(f"http://{host}:")


def test_two_trainer_pods_form_one_group_and_restart_together(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings
) -> None:
    cp = control_plane
    trainer = trainer_at(kubelet, settings, ns)  # pod 0's IP: the only trainer polled
    try:
        trainer.status = dataclasses.replace(trainer.status, step=5)
        m = job_manifest(ns, backoffLimit=1)
        m["spec"]["trainer"] = {"replicas": 2, "resources": {"gpus": 2, "cpu": "2"}}
        apply(cp, m)
        j = wait_phase(cp, ns, "Running")
        check_group(cp, ns, "0")
        [svc] = get(cp, ns, "services", "-l", "longtail.dev/role=trainer")["items"]
        assert svc["metadata"]["name"] == "tiny-trainer" and svc["spec"]["clusterIP"] == "None"
        assert {p["name"]: p["port"] for p in svc["spec"]["ports"]}["rendezvous"] == 29500
        policy = get(cp, ns, "networkpolicy", "tiny-trainers")
        assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP"}]
        cp.wait_for(lambda: job(cp, ns)["status"]["step"] == 5, timeout=30, what="pod 0 polled")
        t = job(cp, ns)["status"]["trainer"]
        assert (t["replicas"], t["localWorldSize"], t["worldSize"]) == (2, 2, 4)
        assert t["restarts"] == 0 and t["formed"] is True
        before = uids(cp, ns)

        # One trainer pod deleted: both go and come back as group 1; the others stay.
        cp.kubectl("-n", ns, "delete", "pod", "tiny-trainer-1", "--wait=false")

        def regrouped() -> bool:
            now = {n: p for n, p in pods(cp, ns).items() if n in TRAINERS}
            return len(now) == 2 and all(
                p["metadata"]["uid"] != before[n]
                and p["metadata"]["labels"]["longtail.dev/trainer-group"] == "1"
                and p["status"].get("phase") == "Running"
                for n, p in now.items()
            )

        cp.wait_for(regrouped, timeout=90, what="the trainer group recreated as group 1")
        j = wait_phase(cp, ns, "Running")
        check_group(cp, ns, "1")
        after = uids(cp, ns)
        for name in ("tiny-rollout-0", "tiny-rollout-1", "tiny-verifier-0"):
            assert after[name] == before[name], f"{name} was recreated"
        t = j["status"]["trainer"]
        assert t["restarts"] == 1 and j["status"]["roles"]["trainer"]["failed"] == 1
        last = t["lastRestart"]
        assert (last["reason"], last["pod"]) == ("TrainerPodDeleted", "tiny-trainer-1"), last
        assert "restarting the trainer group" in last["message"], last
        assert "last checkpoint" in last["message"], last
        assert cond(j, "TrainerReady") == ("True", "AllReplicasReady")
        seen = events(cp, ns)
        assert "TrainerGroupRestarted" in seen and "TrainerGroupRestarting" in seen, seen

        # A failed trainer pod: the second restart, over backoffLimit=1, fails the job.
        kubelet.fail(ns, "tiny-trainer-0", "NCCL error: remote process exited")
        j = wait_phase(cp, ns, "Failed")
        assert cond(j, "Failed") == ("True", "BackoffLimitExceeded")
        failed = next(c for c in j["status"]["conditions"] if c["type"] == "Failed")
        assert "trainer group restarts" in failed["message"], failed
        last = j["status"]["trainer"]["lastRestart"]
        assert (last["reason"], last["pod"]) == ("TrainerPodFailed", "tiny-trainer-0"), last
        assert "NCCL error" in last["message"], last
        cp.wait_for(lambda: pods(cp, ns) == {}, timeout=60, what="all pods deleted after Failed")
    finally:
        trainer.close()
