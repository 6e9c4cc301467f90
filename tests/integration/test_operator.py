"""The operator against the real v1.20 control plane: every scenario of issue #7.

One operator per module runs in-process under ``kopf.testing.KopfRunner`` as the limited
identity ``longtail-operator`` bound to exactly ``operator/rbac/clusterrole.yaml``, watching
namespaces ``itop-*`` (fixtures and helpers: ``opharness.py``). ``fakekubelet.FakeKubelet``
plays the kubelet (fake GPU Node, pods Running/Ready with loopback IPs, failures on demand).
Trainer and worker HTTP endpoints are loopback servers bound to the pod IPs the kubelet hands
out: the loopback ``FakeTrainer`` / ``FakeWorker`` from ``tests/doubles/fakeworker.py`` and,
for the harvest scenario, a real rollout worker (``longtail_workers.rollout.http.ControlServer``
with a tiny torch model).
"""

from __future__ import annotations

import base64
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from fakeworker import FakeWorker
from opharness import (
    ALL_PODS,
    IPS,
    apply,
    cond,
    events,
    get,
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

pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]


def test_create_objects_status_printer_columns_and_events(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings
) -> None:
    cp = control_plane
    trainer = trainer_at(kubelet, settings, ns)
    try:
        trainer.status = trainer.status.__class__(
            step=3,
            total_steps=20,
            phase="running",
            policy_version=3,
            drafter_version=2,
            reward_mean=0.42,
            accepted_length=3.5,
        )
        apply(cp, job_manifest(ns))
        j = wait_phase(cp, ns, "Running")
        uid = j["metadata"]["uid"]
        got = pods(cp, ns)
        assert set(got) == ALL_PODS
        for name, p in got.items():
            meta, spec = p["metadata"], p["spec"]
            role = meta["labels"]["longtail.dev/role"]
            assert meta["labels"]["longtail.dev/rljob"] == "tiny"
            assert name == f"tiny-{role}-{meta['labels']['longtail.dev/replica-index']}"
            assert meta["labels"]["app.kubernetes.io/managed-by"] == "longtail-operator"
            [owner] = meta["ownerReferences"]
            assert owner["uid"] == uid and owner["kind"] == "RLJob" and owner["controller"]
            assert spec["nodeName"] == "fake-gpu-node"  # the real scheduler placed it
            c = spec["containers"][0]
            assert c["args"][:2] == ["worker", role] and c["image"] == "longtail-worker:integration"
        rollout = got["tiny-rollout-1"]["spec"]["containers"][0]["resources"]
        assert rollout["limits"]["nvidia.com/gpu"] == "1"
        svcs = get(cp, ns, "services", "-l", "longtail.dev/rljob=tiny")["items"]
        assert sorted(s["metadata"]["name"] for s in svcs) == [
            "tiny-rollout",
            "tiny-trainer",
            "tiny-verifier",
        ]
        assert all(s["spec"]["clusterIP"] == "None" for s in svcs)
        cm = get(cp, ns, "configmap", "tiny-config")
        assert yaml.safe_load(cm["data"]["rljob.yaml"])["spec"]["algorithm"]["totalSteps"] == 20

        def columns() -> list[str] | None:
            row = cp.kubectl("-n", ns, "get", "rljobs", "--no-headers").stdout.split()
            return row if row[1:6] == ["Running", "3", "0.42", "3.5", "2"] else None

        row = cp.wait_for(columns, timeout=30, what="printer columns with the trainer's values")
        assert row[0] == "tiny"
        j = job(cp, ns)
        assert j["status"]["observedGeneration"] == j["metadata"]["generation"]
        assert j["status"]["roles"]["rollout"] == {"ready": 2, "total": 2, "failed": 0}
        assert cond(j, "RolloutReady") == ("True", "AllReplicasReady")
        assert j["status"]["drafter"]["version"] == 2 and j["status"]["policyVersion"] == 3
        described = cp.kubectl("-n", ns, "describe", "rljob", "tiny").stdout
        for reason in ("CreatedPods", "JobInitializing", "JobRunning", "AllReplicasReady"):
            assert reason in described, described
    finally:
        trainer.close()


def test_invalid_spec_sets_validation_failed_and_touches_nothing(
    control_plane: ControlPlane, ns: str
) -> None:
    cp = control_plane
    # Schema-valid, but a cross-field rule fails: speculative decoding on vLLM needs the eagle1
    # drafter layout (CEL is dropped on v1.20).
    bad = job_manifest(ns, "bad")
    bad["spec"]["rollout"] = {"replicas": 2, "engine": "vllm", "resources": {"gpus": 0}}
    bad["spec"]["drafterTraining"] = {"layout": "longtail"}
    apply(cp, bad)

    def failed() -> dict[str, Any] | None:
        j = job(cp, ns, "bad")
        return j if cond(j, "ValidationFailed") == ("True", "InvalidSpec") else None

    j = cp.wait_for(failed, timeout=60, what="ValidationFailed on rljob bad")
    message = next(
        c["message"] for c in j["status"]["conditions"] if c["type"] == "ValidationFailed"
    )
    assert "spec.drafterTraining.layout: must be 'eagle1' when rollout.engine is 'vllm'" in message
    assert live_pods(cp, ns) == set()
    assert "InvalidSpec" in events(cp, ns)
    # A running job whose spec turns invalid keeps its pods (and its scale).
    apply(cp, job_manifest(ns))
    wait_phase(cp, ns, "Running")
    broken = job_manifest(ns)
    broken["spec"]["rollout"] = {"replicas": 4, "engine": "vllm", "resources": {"gpus": 0}}
    broken["spec"]["drafterTraining"] = {"layout": "longtail"}
    apply(cp, broken)
    cp.wait_for(
        lambda: cond(job(cp, ns), "ValidationFailed") == ("True", "InvalidSpec"),
        timeout=60,
        what="ValidationFailed on the running job",
    )
    assert live_pods(cp, ns) == ALL_PODS
    assert job(cp, ns)["status"]["phase"] == "Running"


def test_scale_up_and_down(control_plane: ControlPlane, ns: str) -> None:
    cp = control_plane
    apply(cp, job_manifest(ns))
    wait_phase(cp, ns, "Running")
    m = job_manifest(ns)
    m["spec"]["rollout"]["replicas"] = 4
    apply(cp, m)
    want = ALL_PODS | {"tiny-rollout-2", "tiny-rollout-3"}
    cp.wait_for(lambda: live_pods(cp, ns) == want, timeout=60, what="4 rollout pods")
    j = wait_phase(cp, ns, "Running")
    assert j["status"]["gpus"]["total"] in (2, 4)  # 4 once the status caught up
    cp.wait_for(lambda: job(cp, ns)["status"]["gpus"]["total"] == 4, timeout=30, what="4 GPUs")
    m["spec"]["rollout"]["replicas"] = 1
    apply(cp, m)
    want = {"tiny-trainer-0", "tiny-verifier-0", "tiny-rollout-0"}
    cp.wait_for(lambda: set(pods(cp, ns)) == want, timeout=60, what="scale down to 1 rollout pod")
    cp.wait_for(
        lambda: job(cp, ns)["status"]["roles"]["rollout"]["total"] == 1,
        timeout=30,
        what="status total 1",
    )


def test_failed_pod_recreated_until_backoff_limit(
    control_plane: ControlPlane, ns: str, kubelet: Any
) -> None:
    cp = control_plane
    apply(cp, job_manifest(ns, backoffLimit=1))
    wait_phase(cp, ns, "Running")
    first = pods(cp, ns)["tiny-rollout-0"]
    first_uid = first["metadata"]["uid"]
    # the API server keeps the policy that turns a crash's last log lines into the message
    policy = first["spec"]["containers"][0]["terminationMessagePolicy"]
    assert policy == "FallbackToLogsOnError"
    kubelet.fail(ns, "tiny-rollout-0")

    def recreated() -> bool:
        p = pods(cp, ns).get("tiny-rollout-0")
        return (
            p is not None
            and p["metadata"]["uid"] != first_uid
            and p["status"].get("phase") == "Running"
        )

    cp.wait_for(recreated, timeout=60, what="tiny-rollout-0 recreated")
    j = wait_phase(cp, ns, "Running")
    assert j["status"]["roles"]["rollout"]["failed"] == 1
    assert "WorkerFailed" in events(cp, ns)
    failed = get(cp, ns, "events", "--field-selector", "reason=WorkerFailed")["items"]
    assert any("CUDA error: out of memory" in e["message"] for e in failed), failed
    kubelet.fail(ns, "tiny-rollout-1", "segfault")
    j = wait_phase(cp, ns, "Failed")
    assert cond(j, "Failed") == ("True", "BackoffLimitExceeded")
    assert j["status"]["completionTime"]
    cp.wait_for(lambda: pods(cp, ns) == {}, timeout=60, what="all pods deleted after Failed")
    assert "BackoffLimitExceeded" in events(cp, ns)


def test_workers_that_do_not_answer_status_polls_show_in_status_and_metrics(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings
) -> None:
    cp = control_plane
    trainer = trainer_at(kubelet, settings, ns)
    live = FakeWorker("tiny-rollout-0", host=next(IPS), port=settings.worker_port)
    kubelet.ips[(ns, "tiny-rollout-0")] = live.host
    try:  # tiny-rollout-1 gets an IP where nothing listens: every poll of it fails
        apply(cp, job_manifest(ns))
        wait_phase(cp, ns, "Running")

        def unreachable() -> dict[str, Any] | None:
            j = job(cp, ns)
            return j if cond(j, "WorkersUnreachable") == ("True", "WorkersUnreachable") else None

        j = cp.wait_for(unreachable, timeout=60, what="condition WorkersUnreachable=True")
        [c] = [c for c in j["status"]["conditions"] if c["type"] == "WorkersUnreachable"]
        assert "tiny-rollout-1: " in c["message"] and "tiny-rollout-0" not in c["message"]
        assert "WorkersUnreachable" in events(cp, ns)
        url = f"http://127.0.0.1:{settings.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        line = f'longtail_operator_unreachable_workers{{namespace="{ns}",rljob="tiny"}} 1.0'
        assert line in text
    finally:
        live.close()
        trainer.close()


def test_suspend_checkpoints_and_resume(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings
) -> None:
    cp = control_plane
    trainer = trainer_at(kubelet, settings, ns)
    try:
        trainer.status = trainer.status.__class__(
            step=7, total_steps=20, phase="running", policy_version=7, drafter_version=1
        )
        apply(cp, job_manifest(ns))
        wait_phase(cp, ns, "Running")
        apply(cp, job_manifest(ns, suspend=True))
        j = wait_phase(cp, ns, "Suspended")
        cp.wait_for(lambda: pods(cp, ns) == {}, timeout=60, what="pods deleted on suspend")
        assert trainer.checkpoints == [7]
        j = job(cp, ns)
        assert (
            cond(j, "Suspended") == ("True", "JobSuspended") and j["status"]["gpus"]["total"] == 0
        )
        assert "CheckpointSaved" in events(cp, ns)
        assert get(cp, ns, "configmap", "tiny-config")  # the job's config stays
        apply(cp, job_manifest(ns, suspend=False))
        cp.wait_for(lambda: live_pods(cp, ns) == ALL_PODS, timeout=60, what="pods back on resume")
        j = wait_phase(cp, ns, "Running")
        assert cond(j, "Suspended") == ("False", "JobResumed")
        env = {
            e["name"]: e.get("value")
            for e in pods(cp, ns)["tiny-rollout-0"]["spec"]["containers"][0]["env"]
        }
        assert env["LONGTAIL_MIN_POLICY_VERSION"] == "7" and env["LONGTAIL_RESUME"] == "true"
    finally:
        trainer.close()


def test_delete_garbage_collects_children(control_plane: ControlPlane, ns: str) -> None:
    cp = control_plane
    apply(cp, job_manifest(ns))
    wait_phase(cp, ns, "Running")
    cp.kubectl("-n", ns, "delete", "rljob", "tiny", "--wait=true", "--timeout=60s", timeout=90)

    def empty() -> bool:
        kinds = "pods,services,configmaps,secrets,networkpolicies"
        return not get(cp, ns, kinds, "-l", "longtail.dev/rljob=tiny")["items"]

    cp.wait_for(empty, timeout=90, what="pods, Services, ConfigMap, Secret, NetworkPolicy GC'd")


def test_job_token_secret_network_policy_and_the_operators_checkpoint_carries_it(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings
) -> None:
    cp = control_plane
    trainer = trainer_at(kubelet, settings, ns)
    try:
        apply(cp, job_manifest(ns))
        uid = wait_phase(cp, ns, "Running")["metadata"]["uid"]
        secret = get(cp, ns, "secret", "tiny-auth")
        assert [o["uid"] for o in secret["metadata"]["ownerReferences"]] == [uid]
        assert secret["immutable"] is True and secret["type"] == "Opaque"
        token = base64.b64decode(secret["data"]["token"]).decode()
        assert len(token) >= 40
        ref = {"secretKeyRef": {"name": "tiny-auth", "key": "token"}}
        for p in pods(cp, ns).values():
            env = {e["name"]: e for e in p["spec"]["containers"][0]["env"]}
            assert env["LONGTAIL_AUTH_TOKEN"] == {"name": "LONGTAIL_AUTH_TOKEN", "valueFrom": ref}
        policy = get(cp, ns, "networkpolicy", "tiny-workers")
        assert [o["uid"] for o in policy["metadata"]["ownerReferences"]] == [uid]
        spec = policy["spec"]
        assert spec["podSelector"] == {"matchLabels": {"longtail.dev/rljob": "tiny"}}
        ports = sorted(p["port"] for p in spec["ingress"][0]["ports"])
        want = {settings.trainer_port, settings.weights_port, settings.verifier_port}
        assert ports == sorted(want | {settings.worker_port})
        assert spec["ingress"][0]["from"] == [
            {"podSelector": {"matchLabels": {"longtail.dev/rljob": "tiny"}}}
        ]
        assert "podSelector" in spec["ingress"][1]["from"][0]  # the operator, by its labels
        # The trainer now requires the token: the operator's suspend checkpoint carries it.
        trainer.token = token
        apply(cp, job_manifest(ns, suspend=True))
        wait_phase(cp, ns, "Suspended")
        saved = lambda: "CheckpointSaved" in events(cp, ns)  # noqa: E731
        cp.wait_for(saved, timeout=30, what="the checkpoint, with the token")
        assert trainer.unauthorized == 0 and len(trainer.checkpoints) == 1
        again = get(cp, ns, "secret", "tiny-auth")  # never regenerated while the job exists
        assert again["data"] == secret["data"]
        assert again["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]
    finally:
        trainer.close()


def test_complete_then_ttl_cleanup_and_deadline(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings
) -> None:
    cp = control_plane
    trainer = trainer_at(kubelet, settings, ns)
    try:
        apply(cp, job_manifest(ns, ttlSecondsAfterFinished=2))
        wait_phase(cp, ns, "Running")
        trainer.status = trainer.status.__class__(
            step=20, total_steps=20, phase="complete", policy_version=20, drafter_version=4
        )
        j = wait_phase(cp, ns, "Succeeded")
        assert cond(j, "Complete") == ("True", "TrainingComplete") and j["status"]["step"] == 20

        def cleaned() -> bool:
            return not get(cp, ns, "pods,services,configmaps", "-l", "longtail.dev/rljob=tiny")[
                "items"
            ]

        cp.wait_for(cleaned, timeout=60, what="ttlSecondsAfterFinished clean-up")
        assert "CleanedUp" in events(cp, ns) and job(cp, ns)["status"]["phase"] == "Succeeded"
    finally:
        trainer.close()
    apply(cp, job_manifest(ns, "late", activeDeadlineSeconds=2))
    j = wait_phase(cp, ns, "Failed", name="late", timeout=60)
    assert cond(j, "Failed") == ("True", "DeadlineExceeded")


def test_harvest_idle_real_worker_switches_and_status_shows_it(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings, operator: Any
) -> None:
    torch = pytest.importorskip("torch")
    from tiny_targets import tiny_qwen2

    from longtail_api.policies import DrafterTrainingSpec
    from longtail_workers.engine.interface import GenerationRequest
    from longtail_workers.engine.native.torch_engine import TorchEngine
    from longtail_workers.rollout.control import RolloutWorker
    from longtail_workers.rollout.http import ControlConfig, ControlServer

    cp = control_plane
    torch.set_num_threads(1)
    model = tiny_qwen2(seed=5, vocab_size=32, hidden_size=32, intermediate_size=64)
    training = DrafterTrainingSpec(learning_rate=1e-3, window_tokens=16, max_steps_per_window=3)
    real = RolloutWorker(
        TorchEngine(model), target_id="t", name="tiny-rollout-0", training=training
    )
    real.generate([GenerationRequest([1, 2, i], max_new_tokens=12, seed=i) for i in range(3)])
    ip_real, ip_fake = next(IPS), next(IPS)
    kubelet.ips[(ns, "tiny-rollout-0")] = ip_real
    kubelet.ips[(ns, "tiny-rollout-1")] = ip_fake
    server = ControlServer(real, ControlConfig(host=ip_real, port=settings.worker_port))
    busy = FakeWorker("tiny-rollout-1", ip_fake, settings.worker_port)
    busy.set_generating(True)  # the long tail: one worker still generates
    try:
        with server:
            m = job_manifest(ns)
            m["spec"]["harvest"] = {
                "enabled": True,
                "source": "workers",
                "idleSeconds": 0.3,
                "pollPeriodSeconds": 0.2,
            }
            apply(cp, m)

            def harvested() -> dict[str, Any] | None:
                j = job(cp, ns)
                ws = {w["name"]: w for w in j.get("status", {}).get("workers", [])}
                w = ws.get("tiny-rollout-0", {})
                ok = (
                    w.get("observedRole") == "drafter-train"
                    and j["status"]["gpus"]["harvested"] == 1
                )
                return j if ok else None

            j = cp.wait_for(harvested, timeout=60, what="rollout-0 harvested and acknowledged")
            ws = {w["name"]: w for w in j["status"]["workers"]}
            assert ws["tiny-rollout-0"]["assignedRole"] == "drafter-train"
            assert ws["tiny-rollout-1"]["assignedRole"] == "rollout"
            assert real.role.activity().observed == "drafter-train"  # the real worker switched
            assert busy.role_requests == []
            cp.wait_for(
                lambda: cond(job(cp, ns), "DrafterTraining") == ("True", "IdleGpusHarvested"),
                timeout=30,
                what="DrafterTraining condition",
            )
            # The tail ends: the harvested worker is sent back to rollout and says so.
            busy.set_generating(False)

            def back() -> bool:
                ws = {w["name"]: w for w in job(cp, ns)["status"].get("workers", [])}
                return ws.get("tiny-rollout-0", {}).get("observedRole") == "rollout"

            cp.wait_for(back, timeout=60, what="rollout-0 back to rollout")
            assert real.role.activity().observed == "rollout"
            assert job(cp, ns)["status"]["gpus"]["harvestedGpuSeconds"] > 0
    finally:
        busy.close()
        if real.trainer is not None:
            real.trainer.stop(timeout=5.0)
    with urllib.request.urlopen(
        f"http://127.0.0.1:{settings.metrics_port}/metrics", timeout=5
    ) as r:
        text = r.read().decode()
    assert (
        'longtail_operator_role_switches_total{result="acknowledged",role="drafter-train"}' in text
    )
    assert 'longtail_operator_reconcile_total{result="ok"}' in text
    with urllib.request.urlopen(f"http://127.0.0.1:{settings.metrics_port}/readyz", timeout=5) as r:
        assert r.status == 200


def test_rbac_operator_identity_has_exactly_what_it_needs(
    control_plane: ControlPlane, operator: Any
) -> None:
    cp = control_plane

    def can(*args: str) -> str:
        return cp.kubectl("auth", "can-i", *args, as_operator=True, check=False).stdout.strip()

    allowed: list[tuple[str, ...]] = [
        ("create", "pods"),
        ("delete", "pods"),
        ("watch", "pods"),
        ("create", "services"),
        ("update", "configmaps"),
        ("patch", "rljobs.longtail.dev"),
        ("patch", "rljobs.longtail.dev", "--subresource=status"),
        ("update", "rljobs.longtail.dev", "--subresource=finalizers"),
        ("create", "events"),
        ("create", "secrets"),
        ("create", "networkpolicies.networking.k8s.io"),
        ("delete", "networkpolicies.networking.k8s.io"),
        ("list", "customresourcedefinitions.apiextensions.k8s.io"),
        ("watch", "namespaces"),
    ]
    denied: list[tuple[str, ...]] = [
        ("create", "rljobs.longtail.dev"),
        ("delete", "rljobs.longtail.dev"),
        ("get", "secrets"),  # the job tokens are derived from the operator's key
        ("list", "secrets"),
        ("watch", "secrets"),
        ("update", "secrets"),
        ("delete", "secrets"),
        ("update", "networkpolicies.networking.k8s.io"),
        ("update", "pods"),
        ("patch", "pods", "--subresource=status"),
        ("create", "deployments.apps"),
        ("delete", "namespaces"),
        ("get", "nodes"),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ]
    for check in allowed:
        assert can(*check, "-n", "default") == "yes", check
    for check in denied:
        assert can(*check, "-n", "default") == "no", check
