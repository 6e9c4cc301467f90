"""Dedicated drafter pods (``spec.drafter``, issue #22): built like rollout pods, run through the
same lifecycle (readiness, backoff, suspend), counted as drafter capacity, reachable to the
trainer through the job's NetworkPolicy, and started with a command the CLI accepts."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pytest
from optest import JOB, all_pods, example, observed, pod, spec_of

from longtail_api.status import RLJobStatus, RoleStatus
from longtail_cli.main import build_parser
from longtail_operator import access, builders
from longtail_operator.derive import plan
from longtail_operator.metrics import OperatorMetrics
from longtail_operator.model import HarvestSnapshot, Plan
from longtail_operator.settings import Settings
from longtail_operator.targets import harvest_targets

SETTINGS = Settings(worker_image="img:1", worker_port=9200, trainer_port=9300, verifier_port=9100)
MODELS = {
    "spec": {
        "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models"}}],
        "containers": [
            {"name": "worker", "volumeMounts": [{"name": "models", "mountPath": "/models"}]}
        ],
    }
}
DRAFTER = {"replicas": 2, "resources": {"gpus": 1, "cpu": "2", "memory": "8Gi"}, "template": MODELS}


def env_of(p: dict[str, Any]) -> dict[str, Any]:
    [c] = [c for c in p["spec"]["containers"] if c["name"] == "worker"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def worker(p: dict[str, Any]) -> dict[str, Any]:
    [c] = [c for c in p["spec"]["containers"] if c["name"] == "worker"]
    return c


def conds(p: Plan) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in p.status.conditions}


def test_drafter_pod_gets_what_a_rollout_pod_gets() -> None:
    spec = spec_of(example(drafter=DRAFTER))
    drafter = builders.worker_pod(JOB, spec, SETTINGS, "drafter", 1)
    rollout = builders.worker_pod(JOB, spec, SETTINGS, "rollout", 1)
    c = worker(drafter)
    assert c["command"] == ["longtail"]
    assert c["args"] == ["worker", "drafter", "--host", "0.0.0.0", "--port", "9200"]
    assert c["ports"] == [{"name": "http", "containerPort": 9200, "protocol": "TCP"}]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    env, peer = env_of(drafter), env_of(rollout)
    # Trainer, weights, drafter exchange, token and config: exactly what a rollout pod gets.
    for name in (
        "LONGTAIL_TRAINER_URL",
        "LONGTAIL_WEIGHTS_URL",
        "LONGTAIL_DRAFTER_URL",
        "LONGTAIL_AUTH_TOKEN",
        "LONGTAIL_CONFIG",
        "LONGTAIL_JOB_NAME",
        "LONGTAIL_NAMESPACE",
        "LONGTAIL_POD_NAME",
        "LONGTAIL_MIN_POLICY_VERSION",
        "LONGTAIL_MIN_DRAFTER_VERSION",
    ):
        assert env[name] == peer[name], name
    assert env["LONGTAIL_DRAFTER_URL"] == "http://tiny-trainer-0.tiny-trainer.ns.svc:9300"
    assert env["LONGTAIL_AUTH_TOKEN"] == {"secretKeyRef": {"name": "tiny-auth", "key": "token"}}
    assert (env["LONGTAIL_ROLE"], env["LONGTAIL_REPLICA_INDEX"], env["LONGTAIL_REPLICAS"]) == (
        "drafter",
        "1",
        "2",
    )
    assert env["LONGTAIL_DRAFTER_SERVICE"] == "tiny-drafter.ns.svc"
    assert "LONGTAIL_DRAFTER_DIR" not in env  # no shared volume: the trainer's HTTP exchange
    # The job config and the model volume of spec.drafter.template.
    volumes = {v["name"]: v for v in drafter["spec"]["volumes"]}
    assert volumes["config"] == {"name": "config", "configMap": {"name": "tiny-config"}}
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "models"}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts == {"config": "/etc/longtail", "models": "/models"}
    assert (drafter["spec"]["hostname"], drafter["spec"]["subdomain"]) == (
        "tiny-drafter-1",
        "tiny-drafter",
    )
    assert drafter["metadata"]["labels"]["longtail.dev/role"] == "drafter"
    assert drafter["spec"]["restartPolicy"] == "Never"


def test_a_drafter_template_cannot_drop_the_token() -> None:
    template = {
        "spec": {
            "containers": [
                {"name": "worker", "env": [{"name": "LONGTAIL_AUTH_TOKEN", "value": "x"}]}
            ]
        }
    }
    spec = spec_of(example(drafter={"template": template}))
    env = env_of(builders.worker_pod(JOB, spec, SETTINGS, "drafter", 0))
    assert env["LONGTAIL_AUTH_TOKEN"] == {"secretKeyRef": {"name": "tiny-auth", "key": "token"}}


def test_drafter_without_drafter_training_is_refused_before_any_pod() -> None:
    from longtail_api.manifest import validate_manifest

    m = example(
        drafter={"replicas": 1},
        drafterTraining__enabled=False,
        speculative__enabled=False,
        harvest__enabled=False,
    )
    result = validate_manifest(m)
    assert not result.ok and any("spec.drafter" in str(e) for e in result.errors)


@pytest.mark.parametrize("role", builders.ROLES)
def test_every_role_s_pod_command_is_a_cli_worker_role(role: str) -> None:
    """What a pod runs must parse with ``longtail``'s own parser (not executed): a role the
    CLI does not know makes every such pod exit at start (issue #22)."""
    spec = spec_of(example(drafter={"replicas": 1}))
    c = worker(builders.worker_pod(JOB, spec, SETTINGS, role, 0))
    assert c["command"] == ["longtail"]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args, rest = build_parser().parse_known_args(c["args"])
    except SystemExit:
        pytest.fail(f"`longtail {' '.join(c['args'])}` is refused by the CLI: {err.getvalue()}")
    assert (args.command, args.role) == ("worker", role)
    assert rest == ["--host", "0.0.0.0", "--port", str(builders.role_port(SETTINGS, role))]


def test_drafter_pods_may_reach_the_trainer_through_the_network_policy() -> None:
    spec = spec_of(example(drafter={"replicas": 1}))
    drafter = builders.worker_pod(JOB, spec, SETTINGS, "drafter", 0)
    policy = access.network_policy(JOB, SETTINGS)["spec"]
    own = policy["ingress"][0]
    selector = own["from"][0]["podSelector"]["matchLabels"]
    labels = drafter["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in selector.items())  # a peer of the trainer
    ports = {p["port"] for p in own["ports"]}
    assert {SETTINGS.trainer_port, SETTINGS.weights_port, SETTINGS.worker_port} <= ports
    # ... and is itself admitted on its own port (operator, peers, metrics).
    assert all(labels.get(k) == v for k, v in policy["podSelector"]["matchLabels"].items())


def test_drafter_pods_lifecycle_and_capacity() -> None:
    manifest = example(drafter=DRAFTER, backoffLimit=1)
    spec = spec_of(manifest)
    new = plan(observed(manifest, []), SETTINGS)
    made = sorted(m["metadata"]["name"] for m in new.create if m["kind"] == "Pod")
    assert "tiny-drafter-0" in made and "tiny-drafter-1" in made
    assert any(
        m["kind"] == "Service" and m["metadata"]["name"] == "tiny-drafter" for m in new.create
    )
    assert conds(new)["DrafterReady"] == ("False", "ReplicasNotReady")

    pods = all_pods(spec)
    services = frozenset(f"tiny-{r}" for r in builders.role_specs(spec))
    running = plan(observed(manifest, pods, services=services), SETTINGS)
    st = running.status
    assert st.phase == "Running"
    assert st.roles["drafter"] == RoleStatus(ready=2, total=2, failed=0)
    assert conds(running)["DrafterReady"] == ("True", "AllReplicasReady")
    assert conds(running)["DrafterTraining"] == ("True", "DedicatedDrafters")
    assert st.gpus.drafter == 2 and st.gpus.harvested == 0
    assert st.gpus.total == 2  # the example runs its other roles on CPU
    # Drafter pods are not harvest targets: they train the drafter already, never reassigned.
    targets = harvest_targets(spec, pods, set(), SETTINGS)
    assert {t.role for t in targets} == {"rollout"}
    # With harvested workers too, both capacities are reported side by side.
    snap = HarvestSnapshot(harvested_gpus=1, training_workers=1)
    both = plan(observed(manifest, pods, services=services, harvest=snap), SETTINGS)
    assert (both.status.gpus.harvested, both.status.gpus.drafter) == (1, 2)
    [dt] = [c for c in both.status.conditions if c.type == "DrafterTraining"]
    assert dt.reason == "IdleGpusHarvested" and "2 dedicated drafter pods" in dt.message

    # A failed drafter pod: counted, deleted, recreated; the rollout pods stay.
    failed = [q if q.name != "tiny-drafter-1" else pod("drafter", 1, "Failed") for q in pods]
    once = plan(observed(manifest, failed, services=services, previous=st), SETTINGS)
    assert once.delete_pods == ["tiny-drafter-1"] and once.counted == ["uid-drafter-1"]
    assert once.status.roles["drafter"].failed == 1 and once.status.gpus.drafter == 1
    assert "WorkerFailed" in [e.reason for e in once.events]
    recreate = [q for q in pods if q.name != "tiny-drafter-1"]
    again = plan(observed(manifest, recreate, services=services, previous=once.status), SETTINGS)
    assert [m["metadata"]["name"] for m in again.create if m["kind"] == "Pod"] == ["tiny-drafter-1"]
    # Past backoffLimit=1 the job fails, and says which role.
    failed2 = [
        q if q.name != "tiny-drafter-0" else pod("drafter", 0, "Failed", uid="u2") for q in pods
    ]
    over = plan(observed(manifest, failed2, services=services, previous=again.status), SETTINGS)
    assert over.status.phase == "Failed" and over.status.roles["drafter"].failed == 2
    assert conds(over)["Failed"] == ("True", "BackoffLimitExceeded")
    assert "drafter pods failed" in next(
        c.message for c in over.status.conditions if c.type == "Failed"
    )


def test_suspend_deletes_drafter_pods_after_the_checkpoint_and_resume_recreates_them() -> None:
    manifest = example(drafter=DRAFTER, suspend=True)
    spec = spec_of(manifest)
    pods = all_pods(spec)
    services = frozenset(f"tiny-{r}" for r in builders.role_specs(spec))
    previous = RLJobStatus(phase="Running")
    p = plan(observed(manifest, pods, services=services, previous=previous), SETTINGS)
    assert p.status.phase == "Suspended" and p.checkpoint  # the trainer checkpoints first
    assert {"tiny-drafter-0", "tiny-drafter-1"} <= set(p.delete_pods)
    assert p.status.gpus.drafter == 0
    assert conds(p)["DrafterReady"] == ("False", "JobSuspended")
    resumed = example(drafter=DRAFTER, suspend=False)
    r = plan(observed(resumed, [], services=services, previous=p.status), SETTINGS)
    made = {m["metadata"]["name"] for m in r.create if m["kind"] == "Pod"}
    assert {"tiny-drafter-0", "tiny-drafter-1"} <= made


def test_drafter_gpus_are_a_gauge_state() -> None:
    metrics = OperatorMetrics()
    metrics.job_gpus("ns", "job", 8, 2, 1, 3)
    text = metrics.exposition().decode()
    assert 'longtail_operator_job_gpus{namespace="ns",rljob="job",state="drafter"} 3.0' in text
    metrics.forget_job("ns", "job")
    assert 'state="drafter"' not in metrics.exposition().decode()
