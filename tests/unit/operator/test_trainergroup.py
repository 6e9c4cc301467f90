"""Issue #20 on the operator's side: the trainer pods as one indexed group (rendezvous env,
labels, headless Service, NetworkPolicy), everything that talks to "the trainer" addressing
pod 0, and role-scoped recovery: one trainer pod down restarts the whole group, once counted
against backoffLimit, while the other roles keep running."""

from __future__ import annotations

import dataclasses
from typing import Any

from optest import JOB, NOW, example, observed, pod, policy_key, spec_of

from longtail_api.rendezvous import TrainerRendezvous
from longtail_api.status import RLJobStatus
from longtail_operator import access, builders, trainergroup
from longtail_operator.derive import plan
from longtail_operator.model import Plan
from longtail_operator.observe import PodView, rfc3339
from longtail_operator.settings import Settings
from longtail_operator.targets import harvest_targets, rank0

SETTINGS = Settings(worker_port=9200, trainer_port=9300, weights_port=9301, verifier_port=9100)
TWO = {"trainer": {"replicas": 2}}
HOST = "tiny-trainer-0.tiny-trainer.ns.svc"


def env_of(p: dict[str, Any]) -> dict[str, Any]:
    [c] = [c for c in p["spec"]["containers"] if c["name"] == builders.CONTAINER]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def tpod(index: int, group: int = 0, world: str | None = "2x1", **kw: Any) -> PodView:
    return dataclasses.replace(pod("trainer", index, **kw), group=group, world=world)


def others(**kw: Any) -> list[PodView]:
    return [pod("verifier", 0, **kw), pod("rollout", 0, **kw), pod("rollout", 1, **kw)]


def created(p: Plan, role: str = "trainer") -> list[str]:
    return sorted(
        m["metadata"]["name"]
        for m in p.create
        if m["kind"] == "Pod" and m["metadata"]["labels"][builders.LABEL_ROLE] == role
    )


def trainer_cond(p: Plan) -> tuple[str, str, str]:
    [c] = [c for c in p.status.conditions if c.type == "TrainerReady"]
    return c.status, c.reason, c.message


def test_trainer_pods_get_the_rendezvous_of_one_group() -> None:
    spec = spec_of(example(trainer={"replicas": 2, "resources": {"gpus": 4}}))
    for index in (0, 1):
        p = builders.worker_pod(JOB, spec, SETTINGS, "trainer", index, trainer_group=3)
        env = env_of(p)
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (HOST, "29500")
        assert (env["NNODES"], env["NODE_RANK"]) == ("2", str(index))
        assert (env["LOCAL_WORLD_SIZE"], env["WORLD_SIZE"]) == ("4", "8")
        assert "RANK" not in env and "LOCAL_RANK" not in env  # per rank, set by the entrypoint
        got = TrainerRendezvous.from_env({k: v for k, v in env.items() if isinstance(v, str)})
        assert got == TrainerRendezvous(HOST, 29500, nnodes=2, node_rank=index, local_world_size=4)
        # Every trainer pod talks to "the trainer" at pod 0, like the other roles.
        assert env["LONGTAIL_TRAINER_URL"] == f"http://{HOST}:9300"
        assert env["LONGTAIL_WEIGHTS_URL"] == f"http://{HOST}:9301"
        labels = p["metadata"]["labels"]
        assert labels[builders.LABEL_TRAINER_GROUP] == "3"
        assert labels[builders.LABEL_TRAINER_WORLD] == "2x4"
        assert p["spec"]["hostname"] == f"tiny-trainer-{index}"
        assert p["spec"]["subdomain"] == "tiny-trainer"
        ports = p["spec"]["containers"][0]["ports"]
        assert {"name": "rendezvous", "containerPort": 29500, "protocol": "TCP"} in ports
    rollout = env_of(builders.worker_pod(JOB, spec, SETTINGS, "rollout", 0))
    assert "MASTER_ADDR" not in rollout and "NNODES" not in rollout
    assert rollout["LONGTAIL_WEIGHTS_URL"] == f"http://{HOST}:9301"
    cpu = env_of(
        builders.worker_pod(JOB, spec_of(example(trainer=TWO["trainer"])), SETTINGS, "trainer", 1)
    )
    assert (cpu["LOCAL_WORLD_SIZE"], cpu["WORLD_SIZE"]) == ("1", "2")  # one rank per CPU pod


def test_a_template_cannot_change_the_rendezvous_and_the_service_names_its_port() -> None:
    container = {
        "name": "worker",
        "env": [{"name": "NNODES", "value": "5"}, {"name": "X", "value": "y"}],
    }
    spec = spec_of(
        example(trainer={"replicas": 2, "template": {"spec": {"containers": [container]}}})
    )
    env = env_of(builders.worker_pod(JOB, spec, SETTINGS, "trainer", 1))
    assert env["NNODES"] == "2" and env["NODE_RANK"] == "1" and env["X"] == "y"
    svc = builders.role_service(JOB, "trainer", SETTINGS)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    assert [p["name"] for p in svc["spec"]["ports"]] == ["http", "rendezvous"]
    assert [
        p["name"] for p in builders.role_service(JOB, "rollout", SETTINGS)["spec"]["ports"]
    ] == ["http"]


def test_trainer_pods_reach_each_other_on_every_tcp_port() -> None:
    policy = access.trainer_network_policy(JOB)
    trainers = {"matchLabels": {builders.LABEL_JOB: "tiny", builders.LABEL_ROLE: "trainer"}}
    assert policy["metadata"]["name"] == "tiny-trainers"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == JOB.uid
    assert policy["spec"]["podSelector"] == trainers  # only the trainer pods are opened up
    assert policy["spec"]["ingress"] == [
        {"from": [{"podSelector": trainers}], "ports": [{"protocol": "TCP"}]}
    ]
    manifest = example(**TWO)
    made = plan(observed(manifest, [], network_policy=True, trainer_policy=False), SETTINGS)
    assert [m["metadata"]["name"] for m in made.create if m["kind"] == "NetworkPolicy"] == [
        "tiny-trainers"
    ]
    off = plan(observed(manifest, [], trainer_policy=False), Settings(network_policy=False))
    assert not [m for m in off.create if m["kind"] == "NetworkPolicy"]
    done = RLJobStatus(phase="Succeeded", completion_time=rfc3339(NOW))
    ttl = plan(
        observed(example(ttlSecondsAfterFinished=0, **TWO), [], previous=done, trainer_policy=True),
        SETTINGS,
    )
    assert policy_key("tiny-trainers") in ttl.delete_objects


def test_new_group_is_created_whole_and_status_shows_the_world() -> None:
    manifest = example(trainer={"replicas": 2, "resources": {"gpus": 2}})
    first = plan(observed(manifest, []), SETTINGS)
    assert created(first) == ["tiny-trainer-0", "tiny-trainer-1"]
    t = first.status.trainer
    assert (t.replicas, t.local_world_size, t.world_size, t.restarts) == (2, 2, 4, 0)
    assert not t.formed
    pods = [tpod(0, world="2x2"), tpod(1, world="2x2"), *others()]
    running = plan(observed(manifest, pods, previous=first.status), SETTINGS)
    assert running.status.trainer.formed and not created(running) and not running.delete_pods
    assert trainer_cond(running)[:2] == ("True", "AllReplicasReady")
    assert running.status.phase == "Running" and running.status.gpus.total == 4


def test_a_group_made_halfway_is_completed_not_restarted() -> None:
    manifest = example(**TWO)
    first = plan(observed(manifest, []), SETTINGS)
    # Pod 1's creation failed (a quota): it is only made again, no restart, nothing counted.
    p = plan(observed(manifest, [tpod(0), *others()], previous=first.status), SETTINGS)
    assert created(p) == ["tiny-trainer-1"] and not p.delete_pods
    assert p.status.trainer.restarts == 0 and p.status.roles["trainer"].failed == 0


def test_a_failed_trainer_pod_restarts_the_whole_group_once() -> None:
    manifest = example(backoffLimit=3, **TWO)
    pods = [tpod(0), tpod(1), *others()]
    formed = plan(observed(manifest, pods), SETTINGS).status
    assert formed.trainer.formed
    broken = [tpod(0), tpod(1, phase="Failed", uid="f1"), *others()]
    broken[1] = dataclasses.replace(
        broken[1], message="container worker exited 1 Error NCCL timeout"
    )
    p = plan(observed(manifest, broken, previous=formed), SETTINGS)
    assert sorted(p.delete_pods) == ["tiny-trainer-0", "tiny-trainer-1"]  # not the others
    assert not created(p)
    t = p.status.trainer
    assert t.restarts == 1 and not t.formed and p.status.roles["trainer"].failed == 1
    assert t.last_restart is not None and t.last_restart.reason == "TrainerPodFailed"
    assert t.last_restart.pod == "tiny-trainer-1" and t.last_restart.time == rfc3339(NOW)
    assert "NCCL timeout" in t.last_restart.message and "last checkpoint" in t.last_restart.message
    status, reason, message = trainer_cond(p)
    assert (status, reason) == ("False", trainergroup.RESTARTING) and "tiny-trainer-1" in message
    events = {e.reason: e for e in p.events}
    assert events["TrainerGroupRestarted"].type == "Warning" and "WorkerFailed" in events
    assert p.status.phase == "Initializing"
    # Pod 0 crashes too (its peer is gone) before its deletion shows: the same restart.
    dying = [tpod(0, phase="Failed", uid="f0"), tpod(1, phase="Failed", deleting=True), *others()]
    q = plan(observed(manifest, dying, previous=p.status, counted=frozenset({"f1"})), SETTINGS)
    assert q.status.trainer.restarts == 1 and q.status.roles["trainer"].failed == 1
    assert q.delete_pods == ["tiny-trainer-0"] and not created(q)
    assert trainer_cond(q)[1] == "TrainerGroupRestarting"
    # All old pods gone: the new group (label 1) is made whole.
    r = plan(observed(manifest, others(), previous=q.status), SETTINGS)
    assert created(r) == ["tiny-trainer-0", "tiny-trainer-1"] and not r.delete_pods
    labels = [m["metadata"]["labels"] for m in r.create if m["kind"] == "Pod"]
    assert {lbl[builders.LABEL_TRAINER_GROUP] for lbl in labels} == {"1"}
    assert trainer_cond(r)[1] == "TrainerGroupRestarting"
    # Ready again: the condition clears; the last restart stays in status.
    back = [tpod(0, group=1), tpod(1, group=1), *others()]
    s = plan(observed(manifest, back, previous=r.status), SETTINGS)
    assert trainer_cond(s)[:2] == ("True", "AllReplicasReady") and s.status.phase == "Running"
    assert s.status.trainer.formed and s.status.trainer.last_restart == t.last_restart
    assert (
        not created(s)
        and not s.delete_pods
        and "TrainerGroupRestarted" not in [e.reason for e in s.events]
    )


def test_a_deleted_trainer_pod_restarts_the_group_and_backoff_limit_counts_it() -> None:
    manifest = example(backoffLimit=0, **TWO)
    formed = plan(observed(manifest, [tpod(0), tpod(1), *others()]), SETTINGS).status
    p = plan(observed(manifest, [tpod(0), *others()], previous=formed), SETTINGS)
    t = p.status.trainer
    assert t.last_restart is not None and t.last_restart.reason == "TrainerPodDeleted"
    assert t.last_restart.pod == "tiny-trainer-1" and "was deleted" in t.last_restart.message
    # backoffLimit=0: the first restart already fails the job, and every pod goes.
    assert p.status.phase == "Failed"
    [failed] = [c for c in p.status.conditions if c.type == "Failed"]
    assert failed.reason == "BackoffLimitExceeded"
    assert failed.message == "1 trainer group restarts, over backoffLimit=0"
    assert sorted(p.delete_pods) == sorted(q.name for q in [tpod(0), *others()])
    # A pod being deleted counts the same, once.
    manifest = example(backoffLimit=2, **TWO)
    q = plan(
        observed(manifest, [tpod(0), tpod(1, deleting=True), *others()], previous=formed), SETTINGS
    )
    assert q.status.roles["trainer"].failed == 1 and q.delete_pods == ["tiny-trainer-0"]


def test_an_exited_trainer_pod_restarts_without_counting() -> None:
    manifest = example(**TWO)
    formed = plan(observed(manifest, [tpod(0), tpod(1), *others()]), SETTINGS).status
    p = plan(
        observed(manifest, [tpod(0), tpod(1, phase="Succeeded"), *others()], previous=formed),
        SETTINGS,
    )
    assert p.status.trainer.restarts == 1 and p.status.roles["trainer"].failed == 0
    assert p.status.trainer.last_restart is not None
    assert p.status.trainer.last_restart.reason == "TrainerPodExited"


def test_a_world_change_checkpoints_and_recreates_the_group_without_counting() -> None:
    formed = plan(observed(example(**TWO), [tpod(0), tpod(1), *others()]), SETTINGS).status
    manifest = example(trainer={"replicas": 3})
    p = plan(observed(manifest, [tpod(0), tpod(1), *others()], previous=formed), SETTINGS)
    assert sorted(p.delete_pods) == ["tiny-trainer-0", "tiny-trainer-1"] and not created(p)
    assert p.checkpoint and p.checkpoint_reason == "resize"
    t = p.status.trainer
    assert (t.restarts, t.world_size, p.status.roles["trainer"].failed) == (0, 3, 0)
    assert t.last_restart is not None and t.last_restart.reason == "TrainerWorldChanged"
    assert "from 2x1 to 3x1" in t.last_restart.message
    assert [e.type for e in p.events if e.reason == "TrainerWorldChanged"] == ["Normal"]
    # Asked again while the checkpoint is pending: the same record, no new time.
    later = observed(manifest, [tpod(0), tpod(1), *others()], previous=p.status)
    later.now = NOW.replace(minute=5)
    again = plan(later, SETTINGS)
    assert again.delete_pods == p.delete_pods and again.checkpoint
    assert again.status.trainer.last_restart == t.last_restart
    gone = plan(observed(manifest, others(), previous=p.status), SETTINGS)
    assert created(gone) == ["tiny-trainer-0", "tiny-trainer-1", "tiny-trainer-2"]
    worlds = {
        m["metadata"]["labels"].get(builders.LABEL_TRAINER_WORLD)
        for m in gone.create
        if m["kind"] == "Pod"
    }
    assert worlds == {"3x1"}  # only the trainer pods were made again


def test_older_operators_pod_is_kept_and_suspend_leftovers_are_no_failure() -> None:
    manifest = example()
    old = [pod("trainer", 0), *others()]  # no group or world labels
    p = plan(observed(manifest, old), SETTINGS)
    assert not created(p) and not p.delete_pods and p.status.trainer.formed
    # Resumed while the suspended group's pods are still terminating: wait, count nothing.
    suspended = plan(observed(example(suspend=True), old, previous=p.status), SETTINGS).status
    assert not suspended.trainer.formed
    leaving = [tpod(0, world="1x1", deleting=True), *others()]
    r = plan(observed(manifest, leaving, previous=suspended), SETTINGS)
    assert not created(r) and r.status.trainer.restarts == 0
    assert created(plan(observed(manifest, others(), previous=r.status), SETTINGS)) == [
        "tiny-trainer-0"
    ]


def test_only_pod_0_is_the_trainer_the_operator_talks_to() -> None:
    # A sharded trainer is never a harvest target (the spec rules refuse 'trainer' in
    # harvest.eligibleRoles then), so only the rollout pods are.
    spec = spec_of(example(harvest={"eligibleRoles": ["rollout"]}, **TWO))
    pods = [tpod(1, ip="10.0.0.2"), tpod(0, ip="10.0.0.1"), *others()]
    assert rank0(pods, active=True) == pods[1]
    assert rank0([tpod(1), tpod(0, deleting=True)], active=True) is None
    assert rank0([tpod(0, deleting=True)], active=False) is not None
    targets = harvest_targets(spec, pods, set(), SETTINGS)
    assert targets and all(t.role == "rollout" for t in targets)
