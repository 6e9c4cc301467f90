"""Manifest builders: names, labels, owners, resources, discovery env and template merging."""

from __future__ import annotations

import yaml
from optest import JOB, example, spec_of

from longtail_operator import builders
from longtail_operator.merge import deep_merge
from longtail_operator.settings import Settings

SETTINGS = Settings(worker_image="img:1", worker_port=9200, trainer_port=9300, verifier_port=9100)


def env_of(pod: dict) -> dict[str, object]:
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]
    }


def test_rollout_pod_identity_resources_and_args() -> None:
    spec = spec_of(
        example(rollout={"replicas": 3, "resources": {"gpus": 2, "cpu": "4", "memory": "8Gi"}})
    )
    pod = builders.worker_pod(JOB, spec, SETTINGS, "rollout", 2, min_policy_version=7)
    meta, c = pod["metadata"], pod["spec"]["containers"][0]
    assert pod["kind"] == "Pod" and meta["name"] == "tiny-rollout-2" and meta["namespace"] == "ns"
    assert meta["labels"]["longtail.dev/rljob"] == "tiny"
    assert meta["labels"]["longtail.dev/role"] == "rollout"
    assert meta["labels"]["longtail.dev/replica-index"] == "2"
    assert meta["labels"]["app.kubernetes.io/component"] == "rollout"
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "longtail-operator"
    [owner] = meta["ownerReferences"]
    assert owner == {
        "apiVersion": "longtail.dev/v1alpha1",
        "kind": "RLJob",
        "name": "tiny",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert c["resources"]["limits"] == {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2"}
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert c["image"] == "img:1" and c["command"] == ["longtail"]
    assert c["args"] == ["worker", "rollout", "--host", "0.0.0.0", "--port", "9200"]
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["subdomain"] == "tiny-rollout"
    env = env_of(pod)
    assert env["LONGTAIL_TRAINER_URL"] == "http://tiny-trainer-0.tiny-trainer.ns.svc:9300"
    assert env["LONGTAIL_ROLLOUT_SERVICE"] == "tiny-rollout.ns.svc"
    assert env["LONGTAIL_VERIFIER_PORT"] == "9100"
    assert env["LONGTAIL_REPLICAS"] == "3" and env["LONGTAIL_REPLICA_INDEX"] == "2"
    assert env["LONGTAIL_MIN_POLICY_VERSION"] == "7"
    assert env["LONGTAIL_CONFIG"] == "/etc/longtail/rljob.yaml"


def test_vllm_rollout_pods_get_shared_memory_and_every_worker_a_startup_probe() -> None:
    spec = spec_of(example(rollout__engine="vllm", drafterTraining__layout="eagle1"))
    pod = builders.worker_pod(JOB, spec, SETTINGS, "rollout", 0)
    c = pod["spec"]["containers"][0]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["spec"]["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    trainer = builders.worker_pod(JOB, spec, SETTINGS, "trainer", 0)
    assert all(v["name"] != "dshm" for v in trainer["spec"]["volumes"])
    torch_pod = builders.worker_pod(JOB, spec_of(example()), SETTINGS, "rollout", 0)
    assert all(v["name"] != "dshm" for v in torch_pod["spec"]["volumes"])
    for p in (pod, trainer, torch_pod):
        probe = p["spec"]["containers"][0]["startupProbe"]
        assert probe["httpGet"]["path"] == "/healthz"
        assert probe["periodSeconds"] * probe["failureThreshold"] >= 600  # model loads take time


def test_cpu_only_pod_has_no_gpu_and_trainer_gets_checkpoints() -> None:
    spec = spec_of(example())
    verifier = builders.worker_pod(JOB, spec, SETTINGS, "verifier", 0)
    assert "nvidia.com/gpu" not in verifier["spec"]["containers"][0]["resources"]["limits"]
    trainer = builders.worker_pod(JOB, spec, SETTINGS, "trainer", 0)
    mounts = {m["name"]: m["mountPath"] for m in trainer["spec"]["containers"][0]["volumeMounts"]}
    # The example's relative location resolves under the container's working directory.
    assert mounts == {
        "config": "/etc/longtail",
        "checkpoints": "/var/lib/longtail/checkpoints",
        "weight-spool": "/var/lib/longtail/weight-spool",  # --weight-spool-dir's default
    }
    volumes = {v["name"]: v for v in trainer["spec"]["volumes"]}
    assert volumes["checkpoints"]["emptyDir"] == {}
    assert volumes["weight-spool"]["emptyDir"] == {}  # the node's disk, not the writable layer
    spec = spec_of(example(checkpoint={"location": "/ckpt", "persistentVolumeClaim": "data"}))
    trainer = builders.worker_pod(JOB, spec, SETTINGS, "trainer", 0)
    volumes = {v["name"]: v for v in trainer["spec"]["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "data"}


def test_rollout_pods_exchange_drafters_with_the_trainer_over_http() -> None:
    spec = spec_of(example())  # drafterTraining enabled
    rollout = env_of(builders.worker_pod(JOB, spec, SETTINGS, "rollout", 1))
    assert rollout["LONGTAIL_DRAFTER_URL"] == "http://tiny-trainer-0.tiny-trainer.ns.svc:9300"
    assert "LONGTAIL_DRAFTER_DIR" not in rollout  # no shared volume needed
    trainer = env_of(builders.worker_pod(JOB, spec, SETTINGS, "trainer", 0))
    # The trainer's own registry lives on its checkpoint volume (survives a trainer restart).
    assert trainer["LONGTAIL_DRAFTER_DIR"] == "/var/lib/longtail/checkpoints/drafters"
    assert "LONGTAIL_DRAFTER_URL" not in trainer
    verifier = env_of(builders.worker_pod(JOB, spec, SETTINGS, "verifier", 0))
    assert not {"LONGTAIL_DRAFTER_URL", "LONGTAIL_DRAFTER_DIR"} & set(verifier)
    off = spec_of(
        example(drafterTraining__enabled=False, speculative__enabled=False, harvest__enabled=False)
    )
    for role in ("rollout", "trainer"):
        env = env_of(builders.worker_pod(JOB, off, SETTINGS, role, 0))
        assert not {"LONGTAIL_DRAFTER_URL", "LONGTAIL_DRAFTER_DIR"} & set(env), role


def test_template_override_is_merged_not_replaced() -> None:
    template = {
        "metadata": {
            "labels": {"team": "rl", "longtail.dev/role": "hijack"},
            "annotations": {"a": "b"},
        },
        "spec": {
            "nodeSelector": {"gpu": "h100"},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "containers": [
                {
                    "name": "worker",
                    "env": [
                        {"name": "EXTRA", "value": "1"},
                        {"name": "LONGTAIL_ROLE", "value": "x"},
                    ],
                },
                {"name": "sidecar", "image": "busybox"},
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }
    spec = spec_of(example(rollout={"replicas": 1, "template": template}))
    pod = builders.worker_pod(JOB, spec, SETTINGS, "rollout", 0)
    names = [c["name"] for c in pod["spec"]["containers"]]
    assert names == ["worker", "sidecar"]
    worker = pod["spec"]["containers"][0]
    assert worker["image"] == "img:1" and worker["args"][:2] == ["worker", "rollout"]
    env = env_of(pod)
    assert env["EXTRA"] == "1" and "LONGTAIL_TRAINER_URL" in env
    assert env["LONGTAIL_ROLE"] == "x"  # the user asked for it explicitly: merged by name
    assert pod["spec"]["nodeSelector"] == {"gpu": "h100"} and pod["spec"]["tolerations"]
    assert {v["name"] for v in pod["spec"]["volumes"]} == {"config", "data"}
    # Identity labels cannot be overridden (the operator selects on them); others are added.
    assert pod["metadata"]["labels"]["longtail.dev/role"] == "rollout"
    assert pod["metadata"]["labels"]["team"] == "rl"
    assert pod["metadata"]["annotations"] == {"a": "b"}


def test_deep_merge_rules() -> None:
    base = {"a": {"b": 1, "c": [1, 2]}, "l": [{"name": "x", "v": 1}], "k": 5}
    out = deep_merge(
        base, {"a": {"c": [3]}, "l": [{"name": "x", "w": 2}, {"name": "y"}], "k": None}
    )
    assert out == {"a": {"b": 1, "c": [3]}, "l": [{"name": "x", "v": 1, "w": 2}, {"name": "y"}]}
    assert base["k"] == 5 and base["l"] == [{"name": "x", "v": 1}]  # inputs untouched


def test_service_and_configmap() -> None:
    svc = builders.role_service(JOB, "rollout", SETTINGS)
    assert svc["metadata"]["name"] == "tiny-rollout" and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {"longtail.dev/rljob": "tiny", "longtail.dev/role": "rollout"}
    assert svc["spec"]["ports"][0]["port"] == 9200
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    manifest = example()
    cm = builders.job_configmap(JOB, manifest["spec"])
    rendered = yaml.safe_load(cm["data"]["rljob.yaml"])
    assert rendered["kind"] == "RLJob" and rendered["spec"] == manifest["spec"]
    assert rendered["metadata"] == {"name": "tiny", "namespace": "ns"}


def test_desired_pods_per_role() -> None:
    spec = spec_of(example(drafter={"replicas": 2}))
    want = builders.desired_pods(spec)
    assert sorted(want) == sorted(
        ["trainer-0", "verifier-0", "rollout-0", "rollout-1", "drafter-0", "drafter-1"]
    )


def test_a_crash_leaves_its_last_log_lines_as_the_termination_message() -> None:
    spec = spec_of(example())
    for role in ("trainer", "rollout", "verifier"):
        pod = builders.worker_pod(JOB, spec, SETTINGS, role, 0)
        c = pod["spec"]["containers"][0]
        # the kubelet copies the log tail into the message the WorkerFailed event carries
        assert c["terminationMessagePolicy"] == "FallbackToLogsOnError", role
