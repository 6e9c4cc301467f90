"""Issue #32, item 9 against the real v1.20 control plane: two operators, one acts; hardening.

Operators run as real processes (``python -m longtail_operator``, the image's entry point) as
the limited identity ``longtail-operator`` bound to exactly ``operator/rbac/clusterrole.yaml``
(``longtail-operator-home`` by a RoleBinding in their own namespace), watching ``itha-*``, with
short lease timings. ``fakekubelet.FakeKubelet`` plays the kubelet (``opharness.py``).

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
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from opharness import apply, events, get, job_manifest, live_pods, pods, wait_phase

if TYPE_CHECKING:
    from conftest import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ALL_PODS = {"tiny-trainer-0", "tiny-verifier-0", "tiny-rollout-0", "tiny-rollout-1"}
LEASE = "longtail-operator-leader"
KEY_SECRET = "longtail-operator-token-key"
LEASE_ENV = {  # short timings keep the test quick; the order rule is client-go's
    "LONGTAIL_OPERATOR_LEASE_DURATION_S": "4",
    "LONGTAIL_OPERATOR_RENEW_DEADLINE_S": "3",
    "LONGTAIL_OPERATOR_RETRY_PERIOD_S": "0.5",
}
ONCE = ("CreatedPods", "JobInitializing", "JobRunning")
"""Reasons one reconciling operator posts exactly once for a job that starts and runs (with no
trainer answering, readiness-derived reasons may repeat as the fake pods' probes settle)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class OperatorProcess:
    """One ``python -m longtail_operator`` process and where its log and metrics are."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    metrics_port: int

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def metric(self, series: str) -> float:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            lines = resp.read().decode().splitlines()
        return sum(float(line.split()[-1]) for line in lines if line.startswith(series))

    def reconciles(self) -> float:
        return self.metric("longtail_operator_reconcile_total{")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal it and return its exit status; one that does not exit in time is aborted
        (PYTHONFAULTHANDLER: every thread's stack goes to its log) and the test fails."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(timeout=10)
            raise AssertionError(
                f"operator {self.name} did not exit {timeout:.0f} s after signal {sig}:\n"
                + self.text()[-6000:]
            ) from None


@pytest.fixture(scope="module")
def home(control_plane: ControlPlane, rbac: None) -> Iterator[str]:
    """The operators' own namespace, with the home Role bound there (as the chart does)."""
    ns = control_plane.create_namespace(prefix="haop")
    control_plane.kubectl(
        "-n",
        ns,
        "create",
        "rolebinding",
        "home",
        "--clusterrole=longtail-operator-home",
        "--user=longtail-operator",
    )
    yield ns
    control_plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture
def start(control_plane: ControlPlane, home: str, kubelet: Any, tmp_path: Path) -> Iterator[Any]:
    """``start("a")``: an operator process named ``a`` (its POD_NAME, so its Lease identity
    starts with it); every one still running is stopped at the end."""
    started: list[OperatorProcess] = []

    def _start(name: str) -> OperatorProcess:
        port = _free_port()
        env = {
            **os.environ,
            **LEASE_ENV,
            "KUBECONFIG": str(control_plane.operator_kubeconfig),
            "PYTHONFAULTHANDLER": "1",
            "POD_NAME": name,
            "LONGTAIL_OPERATOR_NAMESPACES": "itha-*",
            "LONGTAIL_OPERATOR_OPERATOR_NAMESPACE": home,
            "LONGTAIL_OPERATOR_METRICS_HOST": "127.0.0.1",
            "LONGTAIL_OPERATOR_METRICS_PORT": str(port),
            "LONGTAIL_OPERATOR_RECONCILE_PERIOD_S": "1",
            "LONGTAIL_OPERATOR_HTTP_TIMEOUT_S": "0.5",
            "LONGTAIL_OPERATOR_WORKER_IMAGE": "longtail-worker:integration",
        }
        log = tmp_path / f"operator-{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "longtail_operator"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        op = OperatorProcess(name, proc, log, port)
        started.append(op)
        return op

    yield _start
    for op in started:
        if op.proc.poll() is None:
            os.kill(op.proc.pid, signal.SIGCONT)  # a frozen one must be able to stop
            op.stop(signal.SIGTERM, timeout=30)  # releases the Lease for the next test


def holder(cp: ControlPlane, home: str) -> str:
    lease = get(cp, home, "lease", LEASE) if _lease_exists(cp, home) else {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def _lease_exists(cp: ControlPlane, home: str) -> bool:
    return cp.kubectl("-n", home, "get", "lease", LEASE, check=False).returncode == 0


def wait_holder(cp: ControlPlane, home: str, op: OperatorProcess, timeout: float = 60) -> str:
    def held() -> str | None:
        assert op.proc.poll() is None, f"operator {op.name} exited:\n{op.text()[-3000:]}"
        who = holder(cp, home)
        return who if who.startswith(f"{op.name}_") else None

    return cp.wait_for(held, timeout=timeout, what=f"operator {op.name} to hold the Lease")


def wait_log(cp: ControlPlane, op: OperatorProcess, text: str, timeout: float = 60) -> None:
    def logged() -> bool:
        assert op.proc.poll() is None, f"operator {op.name} exited:\n{op.text()[-3000:]}"
        return text in op.text()

    cp.wait_for(logged, timeout=timeout, what=f"{text!r} in operator {op.name}'s log")


def job_namespace(cp: ControlPlane) -> str:
    return cp.create_namespace(prefix="itha")


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
    assert holder(cp, home).startswith("op-a_")

    # The leader stops: it releases the Lease, the standby takes over and repairs the job.
    assert a.stop() == 0, a.text()[-3000:]
    assert "released by op-a_" in a.text()
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
    assert holder(cp, home).startswith("op-new_")
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
