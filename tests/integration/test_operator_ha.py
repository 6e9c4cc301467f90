"""Issue #32, item 9 against the real v1.20 control plane: two operators, one acts; hardening.

Operators run as real processes (``python -m longtail_operator``, the image's entry point) as
the limited identity ``longtail-operator`` bound to exactly ``operator/rbac/clusterrole.yaml``
(``longtail-operator-home`` by a RoleBinding in their own namespace), watching ``itha-*``, with
short lease timings (``opprocess.py``). ``fakekubelet.FakeKubelet`` plays the kubelet.

- Two operators against one control plane: one holds the Lease and acts; the standby
  reconciles nothing (its own /metrics count no reconcile) and the job gets one set of pods
  and no duplicated event. When the leader stops (SIGTERM: it releases the Lease) the standby
  takes over and repairs a deleted pod. A leader frozen past the lease (SIGSTOP) is replaced,
  and once it runs again it exits 1 without acting.
- Worker pods get no service account token (the v1.20 ServiceAccount admission plugin mounts
  one unless the pod opts out).
- Each job's token is derived from the operator's key (HMAC of namespace/name/uid); the
  operator cannot read Secrets in the job's namespace, only its key Secret by name.
- The per-job NetworkPolicy admits the operator from its own namespace only; on v1.20 that
  namespace lacks ``kubernetes.io/metadata.name``, and the operator says so with the fix.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import hmac
import os
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from opharness import ALL_PODS, apply, events, get, job_manifest, live_pods, pods, wait_phase
from opprocess import (
    LEASE,
    OperatorProcess,
    Operators,
    holder,
    job_namespace,
    wait_holder,
    wait_log,
)

if TYPE_CHECKING:
    from conftest import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

KEY_SECRET = "longtail-operator-token-key"
HA_ENV = {  # short timings keep the test quick; the order rule is client-go's
    "LONGTAIL_OPERATOR_LEASE_DURATION_S": "4",
    "LONGTAIL_OPERATOR_RENEW_DEADLINE_S": "3",
    "LONGTAIL_OPERATOR_RETRY_PERIOD_S": "0.5",
    "LONGTAIL_OPERATOR_RECONCILE_PERIOD_S": "1",
    "LONGTAIL_OPERATOR_HTTP_TIMEOUT_S": "0.5",
}
ONCE = ("CreatedPods", "JobInitializing", "JobRunning")
"""Reasons one reconciling operator posts exactly once for a job that starts and runs (with no
trainer answering, readiness-derived reasons may repeat as the fake pods' probes settle)."""


@pytest.fixture
def start(operators: Operators) -> Callable[[str], OperatorProcess]:
    """``start("a")``: an operator process in pod ``a`` (its Lease identity), short timings."""
    return lambda name: operators.start(name, HA_ENV)


def test_two_operators_act_once_and_the_standby_takes_over(
    control_plane: ControlPlane, home: str, start: Any
) -> None:
    cp = control_plane
    a = start("op-a")
    wait_holder(cp, home, a)
    b = start("op-b")
    wait_log(cp, b, f"waiting for Lease {home}/{LEASE}")
    ns = job_namespace(cp)
    apply(cp, job_manifest(ns))
    wait_phase(cp, ns, "Running")
    time.sleep(3.0)  # several reconcile periods of both: a second actor would show by now
    assert b.reconciles() == 0, "the standby reconciled"
    assert a.reconciles() > 0
    assert set(pods(cp, ns)) == ALL_PODS
    counts = collections.Counter(events(cp, ns))
    assert all(counts[reason] == 1 for reason in ONCE), counts
    assert holder(cp, home) == "op-a"

    # The leader stops: it releases the Lease, the standby takes over and repairs the job.
    assert a.stop() == 0, a.text()[-3000:]
    assert "released by op-a" in a.text()
    wait_holder(cp, home, b, timeout=20)
    cp.kubectl("-n", ns, "delete", "pod", "tiny-rollout-1", "--wait=false")

    def repaired() -> bool:
        got = pods(cp, ns).get("tiny-rollout-1")
        return bool(got) and not got["metadata"].get("deletionTimestamp") and b.reconciles() > 0

    cp.wait_for(repaired, timeout=60, what="the new leader to recreate tiny-rollout-1")
    assert live_pods(cp, ns) == ALL_PODS


def test_a_frozen_leader_is_replaced_and_exits_without_acting(
    control_plane: ControlPlane, home: str, start: Any
) -> None:
    cp = control_plane
    old = start("op-old")
    wait_holder(cp, home, old, timeout=60)
    new = start("op-new")
    wait_log(cp, new, f"waiting for Lease {home}/{LEASE}")
    os.kill(old.proc.pid, signal.SIGSTOP)  # no renewal, no release: the lease must expire
    try:
        wait_holder(cp, home, new, timeout=30)
        ns = job_namespace(cp)
        apply(cp, job_manifest(ns))
        wait_phase(cp, ns, "Running")
    finally:
        os.kill(old.proc.pid, signal.SIGCONT)
    code = old.proc.wait(timeout=30)  # it finds it overslept its renew deadline: exits 1
    assert code == 1, old.text()[-3000:]
    assert "stopped acting" in old.text() and "lost the Lease" in old.text()
    assert holder(cp, home) == "op-new"
    counts = collections.Counter(events(cp, ns))
    assert all(counts[reason] == 1 for reason in ONCE), counts


def test_pods_tokens_and_network_policy_are_hardened(
    control_plane: ControlPlane, home: str, start: Any
) -> None:
    cp = control_plane
    op = start("op-solo")
    wait_holder(cp, home, op)
    ns = job_namespace(cp)
    apply(cp, job_manifest(ns))
    uid = wait_phase(cp, ns, "Running")["metadata"]["uid"]

    # No service account token in any worker pod (v1.20 mounts one unless told not to).
    for name, p in pods(cp, ns).items():
        assert p["spec"]["automountServiceAccountToken"] is False, name
        volumes = [v for v in p["spec"].get("volumes", []) if "secret" in v]
        assert not volumes, (name, volumes)
        for c in p["spec"]["containers"]:
            mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
            assert "/var/run/secrets/kubernetes.io/serviceaccount" not in mounts, (name, mounts)

    # The job's token is HMAC(key, namespace/name/uid); the operator reads no Secret there.
    key_secret = get(cp, home, "secret", KEY_SECRET)
    key = base64.b64decode(key_secret["data"]["key"])
    digest = hmac.new(key, f"{ns}/tiny/{uid}".encode(), hashlib.sha256).digest()
    want = base64.urlsafe_b64encode(digest).decode().rstrip("=")
    token = base64.b64decode(get(cp, ns, "secret", "tiny-auth")["data"]["token"]).decode()
    assert token == want

    def can(*args: str) -> str:
        return cp.kubectl("auth", "can-i", *args, as_operator=True, check=False).stdout.strip()

    assert can("get", "secrets", "-n", ns) == "no"
    assert can("get", "secrets", "--all-namespaces") == "no"
    assert can("get", f"secrets/{KEY_SECRET}", "-n", home) == "yes"
    assert can("get", "secrets/some-other-secret", "-n", home) == "no"
    assert can("update", f"leases.coordination.k8s.io/{LEASE}", "-n", home) == "yes"
    assert can("update", "leases.coordination.k8s.io/another", "-n", home) == "no"

    # The operator is admitted from its own namespace only; v1.20 lacks the name label.
    policy = get(cp, ns, "networkpolicy", "tiny-workers")
    [peer] = policy["spec"]["ingress"][1]["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": home}}
    wait_log(cp, op, f"namespace {home} lacks the label(s) kubernetes.io/metadata.name={home}")
    assert f"kubectl label namespace {home} kubernetes.io/metadata.name={home}" in op.text()
