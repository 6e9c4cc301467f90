"""Shared harness of the operator's integration tests (``test_operator*.py``): one operator per
test module under ``kopf.testing.KopfRunner`` as the limited identity ``longtail-operator``
bound to exactly ``operator/rbac/clusterrole.yaml``, watching namespaces ``itop-*``, with
``fakekubelet.FakeKubelet`` playing the kubelet; plus the kubectl helpers the tests share.

``conftest.py`` imports the fixtures, so any test module can request them; module-scoped ones
(the operator, the kubelet) are made once per test module that uses them. Test modules import
the helpers (``apply``, ``job``, ``wait_phase``, ...) from here.
"""

from __future__ import annotations

import itertools
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from fakeworker import FakeTrainer

from longtail_operator import handlers
from longtail_operator.settings import Settings

if TYPE_CHECKING:
    from conftest import ControlPlane

REPO = Path(__file__).resolve().parents[2]
RBAC = REPO / "operator" / "rbac" / "clusterrole.yaml"
CLUSTER_BOUND = (
    "longtail-operator",
    "longtail-operator-discovery",
    "longtail-operator-kueue",
    "longtail-operator-kueue-flavors",
    "longtail-operator-gang",
)
"""The ClusterRoles bound cluster-wide to the operator's identity (every one but -home)."""
EXAMPLE = REPO / "examples" / "01-tiny-arith.yaml"
ALL_PODS = {"tiny-trainer-0", "tiny-verifier-0", "tiny-rollout-0", "tiny-rollout-1"}
"""Every pod of :func:`job_manifest`'s job (example 01: a trainer, a verifier, two rollouts)."""
USER = "longtail-operator"
IPS = (f"127.0.50.{i}" for i in itertools.count(1))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings(
        worker_image="longtail-worker:integration",
        metrics_host="127.0.0.1",
        metrics_port=_free_port(),
        reconcile_period_s=1.0,
        http_timeout_s=1.0,
        worker_port=_free_port(),
        trainer_port=_free_port(),
        verifier_port=_free_port(),
        role_retry_initial_s=0.1,
        role_retry_max_s=1.0,
        checkpoint_timeout_s=5.0,
    )


@pytest.fixture(scope="module")
def rbac(control_plane: ControlPlane, rljob_crd: str) -> Iterator[None]:
    cp = control_plane
    cp.kubectl("apply", "-f", str(RBAC))
    for role in CLUSTER_BOUND:
        cp.kubectl(
            "create", "clusterrolebinding", f"it-{role}", f"--clusterrole={role}", f"--user={USER}"
        )
    # Its own namespace (Settings.operator_namespace, "default"): its Lease and token key.
    home = ("-n", "default", "rolebinding", "it-longtail-operator-home")
    cp.kubectl("create", *home, "--clusterrole=longtail-operator-home", f"--user={USER}")
    yield
    for role in CLUSTER_BOUND:
        cp.kubectl("delete", "clusterrolebinding", f"it-{role}", check=False)
    cp.kubectl("delete", *home, check=False)


@pytest.fixture(scope="module")
def kubelet(control_plane: ControlPlane) -> Iterator[Any]:
    from fakekubelet import FakeKubelet

    k = FakeKubelet(control_plane.api_client()).start()
    yield k
    k.stop()


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, rbac: None, kubelet: Any, settings: Settings
) -> Iterator[Any]:
    from kopf.testing import KopfRunner

    handlers.configure(settings)
    args = ["run", "--standalone", "--namespace=itop-*", "-m", "longtail_operator.handlers"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBECONFIG", str(control_plane.operator_kubeconfig))
        with KopfRunner(args, timeout=60) as runner:
            op = control_plane.wait_for(handlers.current, timeout=60, what="the operator to start")
            yield op
    assert runner.exception is None, runner.exception
    assert not kubelet.errors, kubelet.errors


@pytest.fixture
def ns(control_plane: ControlPlane, operator: Any) -> Iterator[str]:
    name = control_plane.create_namespace(prefix="itop")
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def job_manifest(ns: str, name: str = "tiny", **spec: Any) -> dict[str, Any]:
    m = yaml.safe_load(EXAMPLE.read_text())
    m["metadata"] = {"name": name, "namespace": ns}
    m["spec"]["rollout"]["resources"] = {"gpus": 1, "cpu": "1", "memory": "2Gi"}
    m["spec"].update(spec)
    return m  # type: ignore[no-any-return]


def apply(cp: ControlPlane, manifest: dict[str, Any]) -> None:
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))


def get(cp: ControlPlane, ns: str, *what: str) -> Any:
    return json.loads(cp.kubectl("-n", ns, "get", *what, "-o", "json").stdout)


def job(cp: ControlPlane, ns: str, name: str = "tiny") -> dict[str, Any]:
    return get(cp, ns, "rljob", name)  # type: ignore[no-any-return]


def pods(cp: ControlPlane, ns: str) -> dict[str, dict[str, Any]]:
    items = get(cp, ns, "pods", "-l", "longtail.dev/rljob")["items"]
    return {p["metadata"]["name"]: p for p in items}


def cond(j: dict[str, Any], ctype: str) -> tuple[str, str] | None:
    for c in j.get("status", {}).get("conditions", []):
        if c["type"] == ctype:
            return c["status"], c["reason"]
    return None


def wait_phase(
    cp: ControlPlane, ns: str, phase: str, name: str = "tiny", timeout: float = 60
) -> dict[str, Any]:
    seen: list[str] = []

    def check() -> dict[str, Any] | None:
        j = job(cp, ns, name)
        now = j.get("status", {}).get("phase")
        if not seen or seen[-1] != now:
            seen.append(str(now))
        return j if now == phase else None

    what = f"rljob {ns}/{name} phase {phase}"
    try:
        return cp.wait_for(check, timeout=timeout, what=what)
    except AssertionError as e:  # say where it stood: the phases seen and the live pods
        pods_now = sorted(live_pods(cp, ns))
        raise AssertionError(f"{e}; phases seen {seen}; live pods {pods_now}") from e


def live_pods(cp: ControlPlane, ns: str) -> set[str]:
    return {n for n, p in pods(cp, ns).items() if not p["metadata"].get("deletionTimestamp")}


def events(cp: ControlPlane, ns: str) -> list[str]:
    items = get(cp, ns, "events", "--field-selector", "involvedObject.kind=RLJob")["items"]
    return [e["reason"] for e in items]


def trainer_at(kubelet: Any, settings: Settings, ns: str, name: str = "tiny") -> FakeTrainer:
    ip = next(IPS)
    kubelet.ips[(ns, f"{name}-trainer-0")] = ip
    return FakeTrainer(ip, settings.trainer_port)


def install_crds(cp: ControlPlane, path: Path, crds: list[str], groups: list[str]) -> None:
    """Apply the CRDs in ``path``; return once each is Established and every API group of
    ``groups`` is in discovery (the garbage collector and kubectl map kinds through it)."""
    cp.kubectl("apply", "-f", str(path))
    for crd in crds:
        cp.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")

    def discovered() -> bool:
        served = cp.kubectl("api-versions", check=False).stdout
        return all(f"{g}/" in served for g in groups)

    cp.wait_for(discovered, timeout=60, what=f"{', '.join(groups)} in API discovery")
