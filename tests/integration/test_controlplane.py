"""The local control plane is a real Kubernetes API, usable for the operator's integration tests.

Everything here runs against the real kube-apiserver / kube-controller-manager / kube-scheduler
v1.20.2 started by ``e2e/controlplane.sh`` (see tests/integration/conftest.py): schema validation
and defaulting, the status subresource, printer columns, RBAC, scheduling of GPU pods and
owner-reference garbage collection are the server's own behaviour, not a fake's.
"""

from __future__ import annotations

import copy
import json
import os
import ssl
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from longtail_chart.chartgen import dotted_get

if TYPE_CHECKING:  # the fixture's class, for annotations only (conftest is not importable)
    from conftest import ControlPlane

pytestmark = [
    pytest.mark.integration,
    # The first test also pays for the session fixture: a cold build of the binaries takes
    # ~6-10 minutes on 2 cores. Every wait inside the tests has its own, much shorter timeout.
    pytest.mark.timeout(3600),
]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "01-tiny-arith.yaml"
CRD_FILE = REPO / "crds" / "rljob.yaml"
GROUP, VERSION, PLURAL = "longtail.dev", "v1alpha1", "rljobs"


def _schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_FILE.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == VERSION)
    return version["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def _apply_structural_defaults(obj: Any, schema: dict[str, Any]) -> Any:
    """What the API server's structural defaulting does (k8s.io/apiextensions-apiserver
    pkg/apiserver/schema/defaulting): for each object, fill every missing property that has a
    ``default`` with a copy of it, then recurse into all present properties and array items."""
    if isinstance(obj, dict):
        props = schema.get("properties") or {}
        for key, prop in props.items():
            if key not in obj and "default" in prop:
                obj[key] = copy.deepcopy(prop["default"])
        for key, value in obj.items():
            if key in props:
                _apply_structural_defaults(value, props[key])
    elif isinstance(obj, list) and "items" in schema:
        for item in obj:
            _apply_structural_defaults(item, schema["items"])
    return obj


def _has(obj: dict[str, Any], dotted: str) -> bool:
    try:
        dotted_get(obj, dotted)
    except (KeyError, TypeError):
        return False
    return True


def _schema_default(dotted: str) -> Any:
    node = _schema()
    for part in dotted.split("."):
        node = node["properties"][part]
    return node["default"]


def _get_json(cp: ControlPlane, *args: str) -> dict[str, Any]:
    return json.loads(cp.kubectl("get", *args, "-o", "json").stdout)  # type: ignore[no-any-return]


def _example_in(ns: str, name: str | None = None) -> dict[str, Any]:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["metadata"]["namespace"] = ns
    if name:
        manifest["metadata"]["name"] = name
    return manifest  # type: ignore[no-any-return]


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Any:
    ns = control_plane.create_namespace()
    yield ns
    control_plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_control_plane_is_real_and_healthy(control_plane: ControlPlane) -> None:
    """The API server is v1.20.2 from our build, all readiness checks pass, and the scheduler
    and controller-manager report healthy through the API server's component status."""
    assert control_plane.api_url.startswith("https://127.0.0.1:")
    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v1.20.2"
    readyz = control_plane.kubectl("get", "--raw", "/readyz?verbose").stdout
    assert "readyz check passed" in readyz
    # The scheduler and controller-manager serve /healthz on their own loopback ports (with
    # self-signed certificates they generate); their URLs are in DIR/env.
    env = dict(
        line.split("=", 1)
        for line in (control_plane.state_dir / "env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    for key in ("CONTROLLER_MANAGER_URL", "SCHEDULER_URL"):
        with urllib.request.urlopen(f"{env[key]}/healthz", timeout=10, context=insecure) as r:
            assert r.read() == b"ok", key
    # The controller-manager's controllers run: every namespace gets a default ServiceAccount.
    control_plane.kubectl("-n", "kube-system", "get", "serviceaccount", "default")


def test_crd_established(control_plane: ControlPlane, rljob_crd: str) -> None:
    crd = _get_json(control_plane, "crd", rljob_crd)
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions.get("Established") == "True"
    assert conditions.get("NamesAccepted") == "True"
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
    # The server's copy of the schema is structural and kept as applied, except the CEL rules
    # v1.20 does not know: they are silently dropped (see e2e/README.md, "v1.20 limits").
    served = json.dumps(crd["spec"]["versions"][0]["schema"])
    assert "x-kubernetes-validations" not in served


def test_example_applies_and_server_fills_schema_defaults(
    control_plane: ControlPlane, rljob_crd: str, namespace: str
) -> None:
    manifest = _example_in(namespace)
    # Fields the example leaves out, whose schema defaults the server must fill in.
    omitted = [
        "spec.drafterTraining.bufferTokens",
        "spec.speculative.selector.fixedIndex",
        "spec.algorithm.klCoef",
        "spec.dataset.promptKey",
        "spec.backoffLimit",
        "spec.suspend",
    ]
    for path in omitted:
        assert not _has(manifest, path), f"{EXAMPLE.name} sets {path}; pick another omitted field"

    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    live = _get_json(control_plane, "-n", namespace, "rljob", manifest["metadata"]["name"])

    for path in omitted:
        assert dotted_get(live, path) == _schema_default(path), path
    # What the example sets is kept, not overwritten by a default.
    assert dotted_get(live, "spec.speculative.batchThreshold") == 8
    assert _schema_default("spec.speculative.batchThreshold") != 8
    # And, in full: the stored spec is exactly the manifest with the schema's structural
    # defaults applied (nothing pruned, nothing else changed).
    expected = _apply_structural_defaults(
        copy.deepcopy(manifest["spec"]), _schema()["properties"]["spec"]
    )
    assert live["spec"] == expected


def test_invalid_rljob_rejected_by_schema(
    control_plane: ControlPlane, rljob_crd: str, namespace: str
) -> None:
    bad = _example_in(namespace, "bad-replicas")
    bad["spec"]["rollout"]["replicas"] = 0  # schema: minimum 1
    proc = control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert proc.returncode != 0, proc.stdout
    assert "spec.rollout.replicas" in proc.stderr
    assert "greater than or equal to 1" in proc.stderr
    # Rejected by the server: the object does not exist.
    missing = control_plane.kubectl("-n", namespace, "get", "rljob", "bad-replicas", check=False)
    assert missing.returncode != 0
    assert "NotFound" in missing.stderr

    # An enum violation is rejected too, and server-side dry-run reports the same error.
    bad2 = _example_in(namespace, "bad-engine")
    bad2["spec"]["rollout"]["engine"] = "tensorrt"
    proc = control_plane.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(bad2), check=False
    )
    assert proc.returncode != 0
    assert "spec.rollout.engine" in proc.stderr
    assert "supported values" in proc.stderr.lower()


def test_printer_columns_and_status_subresource(
    control_plane: ControlPlane, rljob_crd: str, namespace: str
) -> None:
    from kubernetes import client

    manifest = _example_in(namespace)
    name = manifest["metadata"]["name"]
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))

    out = control_plane.kubectl("-n", namespace, "get", "rljobs").stdout.splitlines()
    assert out[0].split() == [
        "NAME",
        "PHASE",
        "STEP",
        "REWARD",
        "ACCEPT",
        "GPUS",
        "IDLE",
        "HARVESTED",
        "DRAFTER",
        "READY",
        "SPEC",
        "AGE",
    ]
    assert out[1].split()[0] == name

    before = _get_json(control_plane, "-n", namespace, "rljob", name)
    assert "status" not in before

    # Writing status through the main resource is ignored: status is a subresource.
    control_plane.kubectl(
        "-n",
        namespace,
        "patch",
        "rljob",
        name,
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Failed"}}),
    )
    assert "status" not in _get_json(control_plane, "-n", namespace, "rljob", name)

    # kubectl v1.20 has no --subresource flag: patch /status with the Python client, as the
    # operator will.
    api = client.CustomObjectsApi(control_plane.api_client())
    status = {
        "phase": "Running",
        "step": 3,
        "rewardMean": 0.42,
        "observedGeneration": before["metadata"]["generation"],
        "drafter": {"version": 2, "acceptanceLength": 3.5},
        "gpus": {"total": 4, "idle": 1, "harvested": 1},
    }
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": status}
    )
    after = _get_json(control_plane, "-n", namespace, "rljob", name)
    for key, value in status.items():
        if isinstance(value, dict):
            for k, v in value.items():
                assert after["status"][key][k] == v, (key, k)
        else:
            assert after["status"][key] == value, key
    # Status defaults are applied too, and a status write does not bump the spec generation.
    assert after["status"]["gpus"]["harvestedGpuSeconds"] == 0
    assert after["status"]["conditions"] == []
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"] == before["spec"]

    row = control_plane.kubectl("-n", namespace, "get", "rljobs", name, "--no-headers").stdout
    assert row.split()[:8] == [name, "Running", "3", "0.42", "3.5", "4", "1", "1"]

    # The status schema is enforced on the subresource as well.
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as err:
        api.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": {"phase": "Exploded"}}
        )
    assert err.value.status == 422
    assert "status.phase" in str(err.value.body)

    # An empty string is a string, not null: a condition with message "" is accepted and kept.
    # (Regression test for the validator patch in e2e/controlplane.sh: without it, the server
    # built with Go >= 1.19 rejects "" in non-nullable string fields.)
    condition = {
        "type": "Ready",
        "status": "False",
        "reason": "Initializing",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": {"conditions": [condition]}}
    )
    conditions = _get_json(control_plane, "-n", namespace, "rljob", name)["status"]["conditions"]
    assert conditions == [condition]


def test_rbac_denies_operator_until_bound(control_plane: ControlPlane, namespace: str) -> None:
    cp = control_plane

    def can_i(verb: str, resource: str) -> str:
        proc = cp.kubectl(
            "auth", "can-i", verb, resource, "-n", namespace, as_operator=True, check=False
        )
        return proc.stdout.strip()

    whoami = cp.kubectl("auth", "can-i", "--list", "-n", namespace, as_operator=True).stdout
    assert "pods" not in whoami
    assert can_i("list", "pods") == "no"
    denied = cp.kubectl("-n", namespace, "get", "pods", as_operator=True, check=False)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr
    assert 'User "longtail-operator" cannot list resource "pods"' in denied.stderr

    role = f"longtail-it-pod-reader-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "clusterrole", role, "--verb=get,list,watch", "--resource=pods")
    cp.kubectl(
        "-n",
        namespace,
        "create",
        "rolebinding",
        role,
        f"--clusterrole={role}",
        "--user=longtail-operator",
    )
    try:
        cp.wait_for(
            lambda: can_i("list", "pods") == "yes",
            timeout=30,
            what="RBAC to allow the operator to list pods",
        )
        allowed = cp.kubectl("-n", namespace, "get", "pods", as_operator=True)
        assert allowed.returncode == 0
        # The grant is exactly what was bound: namespaced, read-only.
        assert can_i("delete", "pods") == "no"
        other = cp.kubectl(
            "auth", "can-i", "list", "pods", "-n", "kube-system", as_operator=True, check=False
        )
        assert other.stdout.strip() == "no"
    finally:
        cp.kubectl("-n", namespace, "delete", "rolebinding", role, check=False)
        cp.kubectl("delete", "clusterrole", role, check=False)
    cp.wait_for(
        lambda: can_i("list", "pods") == "no",
        timeout=30,
        what="RBAC to deny again after the binding is deleted",
    )


def test_gpu_pod_scheduled_onto_fake_node(control_plane: ControlPlane, namespace: str) -> None:
    """A Node object advertising 8 GPUs (we play the kubelet) gets a 1-GPU pod from the real
    kube-scheduler; a 9-GPU pod stays Pending as Unschedulable for lack of GPUs."""
    from kubernetes import client

    cp = control_plane
    core = client.CoreV1Api(cp.api_client())
    node = f"fake-gpu-{uuid.uuid4().hex[:6]}"
    cp.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": node,
                    "labels": {"kubernetes.io/hostname": node, "longtail.dev/test-node": "true"},
                },
            }
        ),
    )
    try:
        resources = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"}
        core.patch_node_status(
            node,
            {
                "status": {
                    "capacity": resources,
                    "allocatable": resources,
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "fake kubelet (integration test)",
                        }
                    ],
                }
            },
        )
        live = _get_json(cp, "node", node)
        assert live["status"]["allocatable"]["nvidia.com/gpu"] == "8"

        def pod(name: str, gpus: int) -> str:
            return yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {
                        "nodeSelector": {"longtail.dev/test-node": "true"},
                        "containers": [
                            {
                                "name": "worker",
                                "image": "longtail-worker:integration-test",
                                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                            }
                        ],
                    },
                }
            )

        cp.kubectl("apply", "-f", "-", input=pod("gpu-1", 1))
        cp.kubectl("apply", "-f", "-", input=pod("gpu-9", 9))

        def node_name() -> str:
            return cp.kubectl(
                "-n", namespace, "get", "pod", "gpu-1", "-o", "jsonpath={.spec.nodeName}"
            ).stdout.strip()

        assert cp.wait_for(node_name, timeout=60, what="the scheduler to bind pod gpu-1") == node
        scheduled = _get_json(cp, "-n", namespace, "pod", "gpu-1")
        assert scheduled["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "1"

        def unschedulable() -> str:
            conds = _get_json(cp, "-n", namespace, "pod", "gpu-9")["status"].get("conditions", [])
            return next(
                (
                    c.get("message", "")
                    for c in conds
                    if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                ),
                "",
            )

        message = cp.wait_for(
            unschedulable, timeout=60, what="pod gpu-9 to be marked Unschedulable"
        )
        assert "Insufficient nvidia.com/gpu" in message
        assert not _get_json(cp, "-n", namespace, "pod", "gpu-9")["spec"].get("nodeName")
    finally:
        cp.kubectl(
            "-n",
            namespace,
            "delete",
            "pod",
            "--all",
            "--grace-period=0",
            "--force",
            "--wait=false",
            check=False,
        )
        cp.kubectl("delete", "node", node, "--wait=false", check=False)


def test_owner_reference_garbage_collection(
    control_plane: ControlPlane, rljob_crd: str, namespace: str
) -> None:
    """kube-controller-manager's garbage collector deletes a ConfigMap owned by an RLJob once
    the RLJob is deleted; an unowned ConfigMap beside it stays."""
    cp = control_plane
    job = _example_in(namespace, "gc-owner")
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    uid = _get_json(cp, "-n", namespace, "rljob", "gc-owner")["metadata"]["uid"]

    def configmap(name: str, owned: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if owned:
            meta["ownerReferences"] = [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "RLJob",
                    "name": "gc-owner",
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v"}}

    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(configmap("owned", True)))
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(configmap("bystander", False)))

    cp.kubectl("-n", namespace, "delete", "rljob", "gc-owner", "--wait=true", "--timeout=30s")

    def owned_gone() -> bool:
        proc = cp.kubectl("-n", namespace, "get", "configmap", "owned", check=False)
        return proc.returncode != 0 and "NotFound" in proc.stderr

    cp.wait_for(owned_gone, timeout=90, what="the garbage collector to delete the owned ConfigMap")
    assert cp.kubectl("-n", namespace, "get", "configmap", "bystander", check=False).returncode == 0


KOPF_HANDLERS = """
import kopf


@kopf.on.create("longtail.dev", "v1alpha1", "rljobs")
def created(patch, **_):
    patch.status["phase"] = "Initializing"
"""


def test_kopf_runs_as_the_operator_identity(
    control_plane: ControlPlane, rljob_crd: str, namespace: str, tmp_path: Path
) -> None:
    """`kopf run` with KUBECONFIG=operator.kubeconfig (no context flag needed) handles an RLJob
    and writes its status through the subresource, with only the RBAC granted here."""
    cp = control_plane
    role = f"longtail-it-operator-{uuid.uuid4().hex[:6]}"
    # Namespaced: what the handler needs. Cluster-wide, read-only: what kopf itself needs to
    # discover resources and namespaces; without it kopf 1.45 retries the forbidden requests
    # for ~55 s before starting its watches.
    roles = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [
                {
                    "apiGroups": [GROUP],
                    "resources": ["rljobs"],
                    "verbs": ["get", "list", "watch", "patch", "update"],
                },
                {"apiGroups": [GROUP], "resources": ["rljobs/status"], "verbs": ["get", "patch"]},
                {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{role}-discovery"},
            "rules": [
                {
                    "apiGroups": ["apiextensions.k8s.io"],
                    "resources": ["customresourcedefinitions"],
                    "verbs": ["list", "watch"],
                },
                {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
            ],
        },
    ]
    for manifest in roles:
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    cp.kubectl(
        "-n",
        namespace,
        "create",
        "rolebinding",
        role,
        f"--clusterrole={role}",
        "--user=longtail-operator",
    )
    cp.kubectl(
        "create",
        "clusterrolebinding",
        f"{role}-discovery",
        f"--clusterrole={role}-discovery",
        "--user=longtail-operator",
    )
    handlers = tmp_path / "handlers.py"
    handlers.write_text(KOPF_HANDLERS)
    log_path = tmp_path / "kopf.log"
    kopf_bin = Path(sys.executable).with_name("kopf")
    env = {**os.environ, "KUBECONFIG": str(cp.operator_kubeconfig)}
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [str(kopf_bin), "run", "--standalone", f"--namespace={namespace}", str(handlers)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    try:
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(_example_in(namespace)))

        def phase() -> str:
            if proc.poll() is not None:
                raise AssertionError(f"kopf exited {proc.returncode}:\n{log_path.read_text()}")
            return cp.kubectl(
                "-n", namespace, "get", "rljob", "tiny-arith", "-o", "jsonpath={.status.phase}"
            ).stdout

        try:
            cp.wait_for(lambda: phase() == "Initializing", timeout=90, what="kopf to set the phase")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nkopf log:\n{log_path.read_text()}") from None
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        cp.kubectl("-n", namespace, "delete", "rolebinding", role, check=False)
        cp.kubectl("delete", "clusterrolebinding", f"{role}-discovery", check=False)
        cp.kubectl("delete", "clusterrole", role, f"{role}-discovery", check=False)
    log_text = log_path.read_text()
    assert "Handler 'created' succeeded" in log_text
    assert "Not enough permissions" not in log_text, log_text
    assert "APIForbiddenError" not in log_text, log_text
