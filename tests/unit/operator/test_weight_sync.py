"""``spec.weightSync`` on the operator's side (issue #33, deliverable 7): the worker flags each
role's pods get per resolved transport, the weight-sync NetworkPolicy (made only for
``broadcast`` jobs, removed when a suspended edit turns the job to ``http``, cleaned up after
the TTL), and the ``weight_sync_port`` setting. The real control plane:
``tests/integration/test_operator_weight_sync.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from optest import JOB, all_pods, example, observed, policy_key, spec_of

from longtail_api.podenv import PodEnv
from longtail_operator import access, builders, derive
from longtail_operator.settings import Settings, SettingsError, from_env
from longtail_workers.podenv import pod_args

SETTINGS = Settings(
    worker_port=9200, trainer_port=9300, weights_port=9301, verifier_port=9100,
    weight_sync_port=9600,
)  # fmt: skip
TRAINER_0 = "tiny-trainer-0.tiny-trainer.ns.svc"


def broadcast(**changes: Any) -> dict[str, Any]:
    """Example 01 (CPU pods) with ``weightSync.transport: broadcast`` (gloo on CPU)."""
    return example(weightSync={"transport": "broadcast"}, **changes)


def args_of(pod: dict[str, Any]) -> list[str]:
    return pod["spec"]["containers"][0]["args"]  # type: ignore[no-any-return]


def container_ports(pod: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}


def test_broadcast_pods_get_the_transport_the_store_port_and_its_address() -> None:
    spec = spec_of(broadcast(drafter={"replicas": 1}, trainer={"replicas": 2}))
    assert spec.weight_sync_transport() == "broadcast"
    base = ["--host", "0.0.0.0"]
    for index in (0, 1):  # every trainer pod: the same flags (rank 0, on pod 0, binds)
        trainer = builders.worker_pod(JOB, spec, SETTINGS, "trainer", index)
        assert args_of(trainer) == [
            "worker", "trainer", *base, "--port", "9300",
            "--weight-sync", "broadcast", "--weight-sync-port", "9600",
        ]  # fmt: skip
        assert container_ports(trainer)["weight-sync"] == 9600
    rollout = builders.worker_pod(JOB, spec, SETTINGS, "rollout", 1)
    assert args_of(rollout) == [
        "worker", "rollout", *base, "--port", "9200",
        "--weight-sync", "broadcast", "--weight-sync-addr", f"{TRAINER_0}:9600",
    ]  # fmt: skip
    assert "weight-sync" not in container_ports(rollout)
    # Drafter pods always pull over HTTP; the verifier has no weights.
    for role in ("drafter", "verifier"):
        pod = builders.worker_pod(JOB, spec, SETTINGS, role, 0)
        assert not any(a.startswith("--weight-sync") for a in args_of(pod)), role


@pytest.mark.parametrize(
    "changes",
    [
        {},  # auto on CPU pods: http
        {"weightSync": {"transport": "http"}},
        {"weightSync": {"transport": "auto"}, "rollout": {"resources": {"gpus": 1}}},
    ],
    ids=["auto-cpu", "http", "auto-rollout-gpu-only"],
)
def test_http_jobs_get_exactly_the_args_and_ports_they_had(changes: dict[str, Any]) -> None:
    spec = spec_of(example(**changes))
    assert spec.weight_sync_transport() == "http"
    for role, port in (("trainer", "9300"), ("rollout", "9200"), ("verifier", "9100")):
        pod = builders.worker_pod(JOB, spec, SETTINGS, role, 0)
        assert args_of(pod) == ["worker", role, "--host", "0.0.0.0", "--port", port]
        assert "weight-sync" not in container_ports(pod)


def test_auto_with_gpus_on_both_roles_is_broadcast() -> None:
    gpus = {"resources": {"gpus": 1}}
    spec = spec_of(example(trainer=gpus, rollout=gpus))
    assert spec.weight_sync_transport() == "broadcast"
    assert "--weight-sync-addr" in args_of(builders.worker_pod(JOB, spec, SETTINGS, "rollout", 0))


def test_a_rollout_worker_registers_under_the_name_the_trainer_calls_it(tmp_path: Path) -> None:
    """The worker's ``--name`` (what it registers in the store under) and the trainer's
    ``--rollout NAME=URL`` both come from the pods the operator builds, through the workers'
    own reading of the pod (``longtail_workers.podenv.pod_args``, with the job's config as the
    pod mounts it), and the rollout pod keeps its weights URL for the HTTP catch-up."""
    manifest = broadcast(rollout={"replicas": 3})
    spec = spec_of(manifest)
    config = tmp_path / "rljob.yaml"
    config.write_text(yaml.safe_dump(manifest))

    def argv(role: str, index: int) -> list[str]:
        pod = builders.worker_pod(JOB, spec, SETTINGS, role, index)
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}
        env |= {"LONGTAIL_POD_NAME": pod["metadata"]["name"], "LONGTAIL_CONFIG": str(config)}
        assert PodEnv.from_env(env).pod_name == pod["metadata"]["name"]
        return pod_args(role, args_of(pod)[2:], env)

    trainer = argv("trainer", 0)
    named = [trainer[i + 1].split("=")[0] for i, a in enumerate(trainer) if a == "--rollout"]
    assert named == ["tiny-rollout-0", "tiny-rollout-1", "tiny-rollout-2"]
    for index in (0, 1, 2):
        rollout = argv("rollout", index)
        assert rollout[rollout.index("--name") + 1] == named[index]
        assert rollout[rollout.index("--weights-url") + 1] == f"http://{TRAINER_0}:9301"
        assert rollout[rollout.index("--weight-sync-addr") + 1] == f"{TRAINER_0}:9600"


def test_weight_sync_policy_admits_the_store_port_and_the_groups_connections() -> None:
    policy = access.weight_sync_network_policy(JOB, SETTINGS)
    assert policy["metadata"]["name"] == "tiny-weight-sync"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == JOB.uid
    spec = policy["spec"]
    members = {
        "matchLabels": {builders.LABEL_JOB: "tiny"},
        "matchExpressions": [
            {"key": builders.LABEL_ROLE, "operator": "In", "values": ["trainer", "rollout"]}
        ],
    }
    assert spec["podSelector"] == members and spec["policyTypes"] == ["Ingress"]
    store, group = spec["ingress"]
    rollouts = {"matchLabels": {builders.LABEL_JOB: "tiny", builders.LABEL_ROLE: "rollout"}}
    assert store == {
        "from": [{"podSelector": rollouts}],
        "ports": [{"protocol": "TCP", "port": 9600}],
    }
    # Every TCP port, both directions, among the trainer and rollout pods of this job only.
    assert group == {"from": [{"podSelector": members}], "ports": [{"protocol": "TCP"}]}
    # The job-wide policy is unchanged: the worker ports only.
    ports = {p["port"] for p in access.network_policy(JOB, SETTINGS)["spec"]["ingress"][0]["ports"]}
    assert ports == {9100, 9200, 9300, 9301}


def names(objects: list[dict[str, Any]]) -> list[str]:
    return [m["metadata"]["name"] for m in objects if m["kind"] == "NetworkPolicy"]


def test_the_planner_makes_the_policy_for_broadcast_jobs_only() -> None:
    m = broadcast()
    spec = spec_of(m)
    obs = dict(network_policy=True, trainer_policy=True)
    plan = derive.plan(observed(m, [], weight_sync_policy=False, **obs), SETTINGS)
    assert names(plan.create) == ["tiny-weight-sync"]
    plan = derive.plan(observed(m, all_pods(spec), weight_sync_policy=True, **obs), SETTINGS)
    assert names(plan.create) == [] and plan.delete_objects == []
    off = Settings(network_policy=False)
    plan = derive.plan(observed(m, [], weight_sync_policy=None), off)
    assert names(plan.create) == []
    # An http job never gets it; one that was broadcast before a suspended edit loses it.
    http = example(weightSync={"transport": "http"})
    plan = derive.plan(observed(http, [], weight_sync_policy=False, **obs), SETTINGS)
    assert names(plan.create) == [] and plan.delete_objects == []
    plan = derive.plan(observed(http, [], weight_sync_policy=True, **obs), SETTINGS)
    assert plan.delete_objects == [policy_key("tiny-weight-sync")]


def test_ttl_clean_up_removes_the_weight_sync_policy() -> None:
    from longtail_api.status import RLJobStatus

    m = broadcast(ttlSecondsAfterFinished=0)
    done = RLJobStatus(phase="Succeeded", completion_time="2026-01-01T11:00:00Z")
    obs = observed(m, [], previous=done, weight_sync_policy=True, network_policy=True)
    plan = derive.plan(obs, SETTINGS)
    assert policy_key("tiny-weight-sync") in plan.delete_objects
    assert policy_key("tiny-workers") in plan.delete_objects


def test_weight_sync_port_setting() -> None:
    assert Settings().weight_sync_port == 29600
    assert from_env({"LONGTAIL_OPERATOR_WEIGHT_SYNC_PORT": "29700"}).weight_sync_port == 29700
    bad = {
        "0": "LONGTAIL_OPERATOR_WEIGHT_SYNC_PORT: must be a port rollout pods can dial",
        "29500": "29500 is already the trainer group's rendezvous port on trainer pods",
        "8301": "8301 is already LONGTAIL_OPERATOR_WEIGHTS_PORT on trainer pods",
        "70000": "must be a non-negative value (a port <= 65535), got '70000'",
        "x": "LONGTAIL_OPERATOR_WEIGHT_SYNC_PORT: must be an integer, got 'x'",
    }
    for raw, message in bad.items():
        with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
            from_env({"LONGTAIL_OPERATOR_WEIGHT_SYNC_PORT": raw})


def test_the_workers_own_parsers_read_the_flags_the_operator_writes(tmp_path: Path) -> None:
    """The operator spells the workers' flags as strings (it does not import the workers): the
    rollout and trainer services' own parsers must read them back as meant."""
    from longtail_workers.rollout.service import build_parser as rollout_parser
    from longtail_workers.trainer.service import build_parser as trainer_parser

    manifest = broadcast()
    spec = spec_of(manifest)
    config = tmp_path / "rljob.yaml"
    config.write_text(yaml.safe_dump(manifest))
    parsed = {}
    for role, parser in (("trainer", trainer_parser), ("rollout", rollout_parser)):
        pod = builders.worker_pod(JOB, spec, SETTINGS, role, 0)
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}
        env |= {"LONGTAIL_POD_NAME": pod["metadata"]["name"], "LONGTAIL_CONFIG": str(config)}
        parsed[role] = parser().parse_args(pod_args(role, args_of(pod)[2:], env))
    assert parsed["trainer"].weight_sync == parsed["rollout"].weight_sync == "broadcast"
    assert parsed["trainer"].weight_sync_port == 9600
    assert parsed["rollout"].weight_sync_addr == f"{TRAINER_0}:9600"
    assert parsed["rollout"].name == "tiny-rollout-0"
    assert parsed["rollout"].weights_url == f"http://{TRAINER_0}:9301"
