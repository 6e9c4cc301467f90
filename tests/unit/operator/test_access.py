"""Issue #21, item 3 on the operator's side: the job's token Secret (made once, owned,
immutable), its injection into every pod, the per-job NetworkPolicy, the settings that shape
it, and the operator's own write calls carrying the token. Issue #32, item 9: the token is
derived from the operator's key (no job Secret is read), the NetworkPolicy admits the operator
from its own namespace only, and worker pods carry no service account token."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from fakeworker import FakeTrainer, FakeWorker
from optest import JOB, all_pods, example, observed, spec_of

from longtail_api.auth import TOKEN_ENV
from longtail_api.policies import HarvestSpec
from longtail_operator import access, builders, derive
from longtail_operator.clients import TrainerClient, WorkerClient
from longtail_operator.harvester import Harvester
from longtail_operator.kube import KubeError
from longtail_operator.reconcile import Reconciler
from longtail_operator.settings import Settings, SettingsError, from_env
from longtail_operator.sources import Observation, WorkerTarget

SETTINGS = Settings(worker_port=9200, trainer_port=9300, weights_port=9301, verifier_port=9100)
SECRET_REF = {"secretKeyRef": {"name": "tiny-auth", "key": "token"}}


def worker_env(pod: dict[str, Any]) -> list[dict[str, Any]]:
    [worker] = [c for c in pod["spec"]["containers"] if c["name"] == builders.CONTAINER]
    return worker["env"]  # type: ignore[no-any-return]


def test_every_pod_reads_the_token_from_the_jobs_secret() -> None:
    spec = spec_of(example())
    for role, index in builders.desired_pods(spec).values():
        env = worker_env(builders.worker_pod(JOB, spec, SETTINGS, role, index))
        [token] = [e for e in env if e["name"] == TOKEN_ENV]
        assert token == {"name": TOKEN_ENV, "valueFrom": SECRET_REF}  # never the value itself


def test_a_template_cannot_drop_or_replace_the_token() -> None:
    container = {"name": "worker", "env": [{"name": TOKEN_ENV, "value": "mine"}]}
    manifest = example(rollout__template={"spec": {"containers": [container]}})
    pod = builders.worker_pod(JOB, spec_of(manifest), SETTINGS, "rollout", 0)
    assert [e for e in worker_env(pod) if e["name"] == TOKEN_ENV] == [
        {"name": TOKEN_ENV, "valueFrom": SECRET_REF}
    ]


KEY = bytes(range(32))


def test_secret_is_owned_immutable_and_names_its_key() -> None:
    secret = access.job_secret(JOB, "s3cret", KEY)
    assert secret["metadata"]["name"] == "tiny-auth" and secret["immutable"] is True
    assert secret["metadata"]["ownerReferences"][0]["uid"] == JOB.uid
    assert secret["metadata"]["labels"][builders.LABEL_JOB] == JOB.name
    assert secret["stringData"] == {"token": "s3cret"}
    assert secret["metadata"]["labels"][access.LABEL_KEY_ID] == access.key_id(KEY)
    assert KEY.hex() not in str(secret) and access.key_id(KEY) != access.key_id(KEY[::-1])


def test_job_token_is_derived_from_the_key_and_the_jobs_identity() -> None:
    token = access.job_token(KEY, JOB)
    assert len(token) >= 40 and token == access.job_token(KEY, JOB)  # any replica, any restart
    others = {
        access.job_token(KEY[::-1], JOB),
        access.job_token(KEY, replace(JOB, uid="another-uid")),  # a new RLJob of the same name
        access.job_token(KEY, replace(JOB, namespace="other")),
        access.job_token(KEY, replace(JOB, name="tiny2")),
    }
    assert token not in others and len(others) == 4


def test_token_key_secret_made_read_and_refused_when_short() -> None:
    made = access.key_secret("lt-system", "longtail-operator-token-key", KEY)
    assert made["immutable"] is True and made["metadata"]["namespace"] == "lt-system"
    assert access.token_key(made) == KEY  # as the API server returns it: data, base64
    short = access.key_secret("lt-system", "longtail-operator-token-key", b"x" * 31)
    with pytest.raises(access.TokenKeyError, match=r"lt-system/longtail-operator-token-key: "):
        access.token_key(short)
    with pytest.raises(access.TokenKeyError, match=r"at least 32 random bytes.*got 0"):
        access.token_key({**made, "data": {"key": "not base64!"}})


def test_worker_pods_mount_no_service_account_token() -> None:
    spec = spec_of(example())
    for role, index in builders.desired_pods(spec).values():
        pod = builders.worker_pod(JOB, spec, SETTINGS, role, index)
        assert pod["spec"]["automountServiceAccountToken"] is False, role


def test_network_policy_admits_the_job_the_operator_and_optionally_scrapers() -> None:
    policy = access.network_policy(JOB, SETTINGS)
    spec = policy["spec"]
    assert policy["metadata"]["name"] == "tiny-workers"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == JOB.uid
    assert spec["podSelector"] == {"matchLabels": {builders.LABEL_JOB: "tiny"}}
    assert spec["policyTypes"] == ["Ingress"]
    ports = [{"protocol": "TCP", "port": p} for p in (9100, 9200, 9300, 9301)]
    job_rule, operator_rule = spec["ingress"]
    assert job_rule == {
        "from": [{"podSelector": {"matchLabels": {builders.LABEL_JOB: "tiny"}}}],
        "ports": ports,
    }
    [peer] = operator_rule["from"]
    # The operator's own namespace only (by the name label Kubernetes >= 1.21 sets), never
    # the operator's pod labels in any namespace.
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "default"}}
    at_home = access.network_policy(JOB, Settings(operator_namespace="lt-system"))
    [peer_home] = at_home["spec"]["ingress"][1]["from"]
    assert peer_home["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "lt-system"
    }
    assert peer["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "longtail",
        "app.kubernetes.io/component": "operator",
    }
    assert operator_rule["ports"] == ports
    settings = Settings(
        network_policy_operator_namespace_labels=("team=platform",),
        network_policy_metrics_namespace_labels=("monitoring=true",),
    )
    rules = access.network_policy(JOB, settings)["spec"]["ingress"]
    assert rules[1]["from"][0]["namespaceSelector"] == {"matchLabels": {"team": "platform"}}
    assert rules[2]["from"] == [{"namespaceSelector": {"matchLabels": {"monitoring": "true"}}}]


def test_the_planner_creates_the_network_policy_once_and_ttl_removes_it() -> None:
    manifest = example()
    spec = spec_of(manifest)
    trainers = {"trainer_policy": True}  # test_trainergroup.py's
    plan = derive.plan(observed(manifest, [], network_policy=False, **trainers), SETTINGS)
    assert [m["metadata"]["name"] for m in plan.create if m["kind"] == "NetworkPolicy"] == [
        "tiny-workers"
    ]
    off = Settings(network_policy=False)
    for present, settings in (
        (True, SETTINGS),
        (None, off),
    ):  # exists, or the operator manages none
        found = observed(manifest, all_pods(spec), network_policy=present, **trainers)
        plan = derive.plan(found, settings)
        assert not [m for m in plan.create if m["kind"] == "NetworkPolicy"]
    assert not [
        m
        for m in derive.plan(observed(manifest, [], network_policy=False), off).create
        if m["kind"] == "NetworkPolicy"
    ]


def test_network_policy_settings_from_env() -> None:
    env = {
        "LONGTAIL_OPERATOR_NETWORK_POLICY": "false",
        "LONGTAIL_OPERATOR_NETWORK_POLICY_OPERATOR_LABELS": "a=b, c=d",
    }
    settings = from_env(env)
    assert settings.network_policy is False
    assert settings.network_policy_operator_labels == ("a=b", "c=d")
    with pytest.raises(SettingsError, match="NETWORK_POLICY: must be true or false, got 'yes'"):
        from_env({"LONGTAIL_OPERATOR_NETWORK_POLICY": "yes"})
    with pytest.raises(SettingsError, match="'nolabel' is not key=value"):
        from_env({"LONGTAIL_OPERATOR_NETWORK_POLICY_METRICS_NAMESPACE_LABELS": "nolabel"})


class FakeKube:
    """The one call ``Reconciler._job_token`` makes, with the API server's behaviour; reading a
    Secret fails the test (the operator may not read the jobs' Secrets)."""

    def __init__(self) -> None:
        self.secrets: dict[str, dict[str, Any]] = {}
        self.created: list[dict[str, Any]] = []

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        raise AssertionError(f"read Secret {namespace}/{name}: the RBAC grants no get")

    def create(self, obj: dict[str, Any]) -> None:
        self.created.append(obj)  # 409 when it exists: the first one stays
        self.secrets.setdefault(obj["metadata"]["name"], obj)


def test_the_reconciler_derives_the_token_and_never_reads_a_secret() -> None:
    kube = FakeKube()
    reconciler = Reconciler(kube, replace(SETTINGS, token_key=KEY))  # type: ignore[arg-type]
    first = reconciler._job_token(JOB)
    assert first == access.job_token(KEY, JOB) and len(kube.created) == 1
    restarted = Reconciler(kube, replace(SETTINGS, token_key=KEY))  # type: ignore[arg-type]
    assert restarted._job_token(JOB) == first  # the Secret made earlier holds this one
    assert kube.secrets["tiny-auth"]["stringData"] == {"token": first}
    with pytest.raises(KubeError, match=r"no token key loaded.*longtail-operator-token-key"):
        Reconciler(FakeKube(), SETTINGS)._job_token(JOB)  # type: ignore[arg-type]


class Idleness:
    """w0 idle for a minute, w1 still generating (the long tail)."""

    last_error: str | None = None

    def trainer_report(self, t: Any) -> Observation | None:
        return None

    def observe(self, targets: Any) -> dict[str, Observation]:
        return {
            "w0": Observation(busy=False, idle_seconds=60.0, observed="rollout"),
            "w1": Observation(busy=True, idle_seconds=None, observed="rollout"),
        }


def test_role_switches_and_checkpoints_carry_the_token() -> None:
    workers, trainer = [FakeWorker("w0"), FakeWorker("w1")], FakeTrainer()
    for served in (*workers, trainer):
        served.token = "tok"
    w0 = workers[0]
    try:
        client = WorkerClient(timeout=2.0)
        assert client.put_role(w0.host, w0.port, "rollout").code == 401
        assert client.put_role(w0.host, w0.port, "rollout", "tok").code == 200
        checkpoint = TrainerClient(timeout=2.0).checkpoint
        answer = checkpoint(trainer.host, trainer.port, reason="suspend", timeout=2.0)
        assert isinstance(answer, str) and "HTTP 401" in answer
        kw: dict[str, Any] = {"reason": "suspend", "timeout": 2.0, "token": "tok"}
        assert not isinstance(checkpoint(trainer.host, trainer.port, **kw), str)
        assert trainer.unauthorized == 1 and len(trainer.checkpoints) == 1
        harvester = Harvester("job", client, token="tok")
        targets = [WorkerTarget(w.name, "rollout", w.host, w.port, 1, uid=w.name) for w in workers]
        harvester.step(HarvestSpec(idle_seconds=1.0), targets, Idleness())
        assert w0.role_requests[-1] == "drafter-train" and w0.unauthorized == 1
        assert harvester.snapshot().unacknowledged == ()
    finally:
        for served in (*workers, trainer):
            served.close()
