"""Issue #48, item 4: a spec the API server stores but cannot turn into objects is shown, and
starts nothing.

A plan that creates or replaces objects first asks the API server for each (a server-side dry
run, ``Kube.refusal``); a refusal for good (400, 413, 422: an annotation too long, a ConfigMap
over 1 MiB) creates none of them and is handled as a validation error of the spec
(``specgate.py``): ``ValidationFailed`` True/``ChildRejected`` with the API's message, a Warning
event, the phase written; a new job starts nothing, a running job keeps running under its last
accepted spec with nothing deleted. Here with an in-memory API (``fakeapi.py``) refusing as the
real one does, and ``Kube.refusal`` against a loopback server answering as the API server; on
the real v1.20 control plane: ``tests/integration/test_operator_truth.py``.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from fakeapi import FakeApi
from kubernetes import client
from optest import JOB, example, observed, pod, spec_of

from longtail_operator import derive, specgate
from longtail_operator.execute import REFUSAL_CHARS, shown_refusals
from longtail_operator.kube import Kube, KubeError
from longtail_operator.reconcile import JobRuntime, Reconciler
from longtail_operator.settings import Settings

SETTINGS = Settings(metrics_port=0, network_policy=False, kueue=False, token_key=bytes(32))
ANNOTATIONS_MAX = 262144
CONFIGMAP_MAX = 1048576


def refuse_like_the_api_server(obj: dict[str, Any]) -> str | None:
    """The two refusals of the issue, worded as kube-apiserver v1.20 words them."""
    meta, kind = obj["metadata"], obj["kind"]
    where = f"{kind} {meta['namespace']}/{meta['name']}"
    annotations = sum(len(k) + len(v) for k, v in (meta.get("annotations") or {}).items())
    if annotations > ANNOTATIONS_MAX:
        why = f"metadata.annotations: Too long: must have at most {ANNOTATIONS_MAX} bytes"
        return (
            f"the API server refuses {where}: HTTP 422: {kind} {meta['name']!r} is invalid: {why}"
        )
    data = sum(len(k) + len(v) for k, v in (obj.get("data") or {}).items())
    if kind == "ConfigMap" and data > CONFIGMAP_MAX:
        why = f"[]: Too long: must have at most {CONFIGMAP_MAX} bytes"
        name = meta["name"]
        return f"the API server refuses {where}: HTTP 422: ConfigMap {name!r} is invalid: {why}"
    return None


def big_annotation(**spec: Any) -> dict[str, Any]:
    m = example(**spec)
    m["metadata"]["namespace"] = "ns"
    m["spec"]["rollout"]["template"] = {"metadata": {"annotations": {"x": "a" * 300_000}}}
    return m


def manifest(**spec: Any) -> dict[str, Any]:
    m = example(**spec)
    m["metadata"]["namespace"] = "ns"
    return m


def cond(api: FakeApi, ctype: str) -> tuple[str, str, str] | None:
    for c in api.status().get("conditions", []):
        if c["type"] == ctype:
            return c["status"], c["reason"], c["message"]
    return None


def reconciled(job: dict[str, Any], times: int = 3) -> tuple[FakeApi, Reconciler, JobRuntime]:
    api = FakeApi(job)
    api.refuse = refuse_like_the_api_server
    reconciler = Reconciler(api, SETTINGS)  # type: ignore[arg-type]
    rt = JobRuntime("ns", "tiny")
    for _ in range(times):
        reconciler.reconcile(rt)
    return api, reconciler, rt


def test_a_new_job_whose_rollout_pods_are_refused_starts_nothing_and_says_why() -> None:
    api, reconciler, rt = reconciled(big_annotation())
    # No pod of any role (trainer and verifier pods were made and held GPUs before), no
    # Service, no ConfigMap: only the job's token Secret, made before anything is planned.
    assert api.created == ["Secret/tiny-auth"]
    assert "Pod/tiny-rollout-0" in api.dry_runs and "Pod/tiny-trainer-0" in api.dry_runs
    status = api.status()
    assert status["phase"] == "Pending"  # the status is written
    failed = cond(api, "ValidationFailed")
    assert failed is not None and failed[:2] == ("True", "ChildRejected")
    assert "the API server refuses Pod ns/tiny-rollout-0: HTTP 422" in failed[2]
    assert f"metadata.annotations: Too long: must have at most {ANNOTATIONS_MAX} bytes" in failed[2]
    accepted = cond(api, "SpecAccepted")
    assert accepted is not None and accepted[:2] == ("False", "ChildRejected")
    warned = [e for e in api.events if e.reason == "ChildRejected"]
    assert len(warned) == 1 and warned[0].type == "Warning"  # once, not every pass
    assert "Too long" in warned[0].message
    assert rt.invalid
    # Fixed: the job starts, and says the spec is valid again.
    fixed = manifest()
    fixed["metadata"] = api.job["metadata"]  # type: ignore[index]
    api.job = {**fixed, "status": api.status()}
    api.job["metadata"]["generation"] += 1
    reconciler.reconcile(rt)
    assert {"Pod/tiny-trainer-0", "Pod/tiny-rollout-0", "ConfigMap/tiny-config"} <= set(api.created)
    assert cond(api, "ValidationFailed")[:2] == ("False", "SpecValid")  # type: ignore[index]


def test_a_new_job_whose_configmap_is_refused_starts_nothing() -> None:
    m = manifest()
    m["spec"]["trainer"]["template"] = {
        "spec": {
            "containers": [{"name": "worker", "env": [{"name": "BIG", "value": "v" * 1_100_000}]}]
        }
    }
    api, _, _ = reconciled(m)
    assert api.created == ["Secret/tiny-auth"]
    failed = cond(api, "ValidationFailed")
    assert failed is not None and failed[:2] == ("True", "ChildRejected")
    assert "the API server refuses ConfigMap ns/tiny-config: HTTP 422" in failed[2]
    assert api.status()["phase"] == "Pending"


def test_a_running_jobs_refused_edit_keeps_it_running_under_the_accepted_spec() -> None:
    api, reconciler, rt = reconciled(manifest(), times=3)
    assert api.status()["phase"] == "Running"
    pods = set(api.pods())
    config = copy.deepcopy(api.objects[("ConfigMap", "tiny-config")])
    # A live field (read by the operator alone, so applied at once) too big for the ConfigMap.
    api.job["spec"]["harvest"]["prometheus"] = {"query": "q" * 1_100_000}  # type: ignore[index]
    api.job["spec"]["rollout"]["replicas"] = 3  # type: ignore[index]
    api.job["metadata"]["generation"] += 1  # type: ignore[index]
    api.fail_pod("tiny-rollout-0", "segfault")  # failed pods are still replaced meanwhile
    for _ in range(3):
        reconciler.reconcile(rt)
    failed = cond(api, "ValidationFailed")
    assert failed is not None and failed[:2] == ("True", "ChildRejected")
    assert "ConfigMap ns/tiny-config: HTTP 422" in failed[2]
    assert api.objects[("ConfigMap", "tiny-config")] == config  # the accepted spec stays
    assert set(api.pods()) == pods  # nothing deleted, no pod of the refused edit added
    assert api.deleted == ["Pod/tiny-rollout-0"] and api.created.count("Pod/tiny-rollout-0") == 2
    assert api.status()["phase"] == "Running" and api.status()["roles"]["rollout"]["total"] == 2
    accepted = cond(api, "SpecAccepted")
    assert accepted is not None and accepted[:2] == ("False", "ChildRejected")
    assert "still running the last accepted spec" in accepted[2]


def test_a_refused_template_applied_while_suspended_keeps_the_job_suspended() -> None:
    """A template the API server refuses, applied while the job was suspended (a frozen field
    changes then, the ConfigMap fits), then resumed: its pods are refused, so the resume (a live
    field of the same edit) is not applied either, and the job stays suspended, saying why."""
    api, reconciler, rt = reconciled(manifest(suspend=True), times=2)
    assert api.status()["phase"] == "Suspended" and not api.pods()
    template = big_annotation()["spec"]["rollout"]["template"]
    api.job["spec"]["rollout"]["template"] = template  # type: ignore[index]
    api.job["metadata"]["generation"] += 1  # type: ignore[index]
    reconciler.reconcile(rt)  # suspended, no pods: the edit is accepted
    api.job["spec"]["suspend"] = False  # type: ignore[index]
    api.job["metadata"]["generation"] += 1  # type: ignore[index]
    before = list(api.created)
    reconciler.reconcile(rt)
    reconciler.reconcile(rt)
    assert api.created == before and not api.pods() and not api.deleted
    assert api.status()["phase"] == "Suspended"
    failed = cond(api, "ValidationFailed")
    assert failed is not None and failed[:2] == ("True", "ChildRejected")
    assert "Pod ns/tiny-rollout-0: HTTP 422" in failed[2]
    accepted = cond(api, "SpecAccepted")
    assert accepted is not None and "still running the last accepted spec" in accepted[2]


def test_objects_of_the_accepted_spec_itself_refused_create_and_delete_nothing() -> None:
    """A refusal that is not the edit's (an admission webhook turning the job's pods down):
    there is no spec to fall back on, so nothing is created or deleted, and the status says
    why."""
    api, reconciler, rt = reconciled(manifest(), times=3)
    assert api.status()["phase"] == "Running"

    def webhook(obj: dict[str, Any]) -> str | None:
        if obj["kind"] != "Pod":
            return None
        name = obj["metadata"]["name"]
        return f'the API server refuses Pod ns/{name}: HTTP 400: admission webhook "x" denied'

    api.refuse = webhook
    api.fail_pod("tiny-rollout-0", "segfault")
    reconciler.reconcile(rt)  # the failed pod goes (nothing is created in this pass)
    assert api.deleted == ["Pod/tiny-rollout-0"]
    before = list(api.created)
    reconciler.reconcile(rt)
    reconciler.reconcile(rt)
    assert api.created == before and api.deleted == ["Pod/tiny-rollout-0"]
    failed = cond(api, "ValidationFailed")
    assert failed is not None and failed[:2] == ("True", "ChildRejected")
    assert 'admission webhook "x" denied' in failed[2]
    accepted = cond(api, "SpecAccepted")
    assert accepted is not None and accepted[:2] == ("False", "ChildRejected")
    assert "nothing is created until the API server takes the job's objects" in accepted[2]
    api.refuse = refuse_like_the_api_server  # the webhook lets it through again
    reconciler.reconcile(rt)
    assert "tiny-rollout-0" in api.pods()
    assert cond(api, "ValidationFailed")[:2] == ("False", "SpecValid")  # type: ignore[index]


def test_the_refusals_shown_are_few_and_short() -> None:
    huge = "the API server refuses Pod ns/p: HTTP 422: " + "x" * 50_000 + " the end"
    shown = shown_refusals([huge, "b", "c", "d", "e"])
    assert len(shown) == 4 and shown[3] == "and 2 more object(s) refused"
    assert len(shown[0]) < REFUSAL_CHARS + 100
    assert shown[0].startswith("the API server refuses Pod ns/p: HTTP 422: xxx")
    assert shown[0].endswith("x the end") and "characters cut" in shown[0]
    assert shown_refusals(["a"]) == ("a",)


def test_the_gate_and_the_planner_treat_refusals_as_validation_errors() -> None:
    raw = manifest()["spec"]
    gate = specgate.decide(spec_of(manifest()), raw, (), None, [], rejected=("refused: x",))
    assert gate.spec is None and gate.reason == specgate.REJECTED
    assert gate.message == "nothing runs until it is fixed: refused: x"
    obs = observed(manifest(), [], rejected=("refused: x",))
    obs.spec, obs.gate = None, gate
    plan = derive.plan(obs, SETTINGS)
    assert not plan.create and not plan.delete_pods
    conds = {c.type: (c.status, c.reason, c.message) for c in plan.status.conditions}
    assert conds["ValidationFailed"] == ("True", "ChildRejected", "refused: x")
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "ChildRejected")]
    # An invalid spec refused too: the spec's own errors come first, reason InvalidSpec.
    both = observed(manifest(), [pod("trainer", 0)], errors=("spec.x: bad",), rejected=("r",))
    both.spec = None
    conds = {c.type: c for c in derive.plan(both, SETTINGS).status.conditions}
    assert conds["ValidationFailed"].reason == "InvalidSpec"
    assert conds["ValidationFailed"].message == "spec.x: bad; r"
    assert JOB.name == "tiny"


class _Api(BaseHTTPRequestHandler):
    """Answers creates as kube-apiserver does: 422 for the dry run of a too-long pod, 403 for
    a namespace being deleted, 201 otherwise; records each request's path."""

    paths: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).paths.append(self.path)
        name = body["metadata"]["name"]
        if name == "long":
            code, answer = (
                422,
                {
                    "kind": "Status",
                    "message": f'Pod "{name}" is invalid: metadata.annotations: Too long: must '
                    "have at most 262144 bytes",
                    "reason": "Invalid",
                    "code": 422,
                },
            )
        elif name == "closing":
            code, answer = 403, {"kind": "Status", "message": "namespace ns is being terminated"}
        else:
            code, answer = 201, body
        data = json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def kube() -> Iterator[Kube]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
    yield Kube(client.ApiClient(cfg))
    server.shutdown()
    server.server_close()


def test_kube_refusal_is_a_server_side_dry_run_returning_permanent_refusals(kube: Kube) -> None:
    _Api.paths.clear()

    def pod_of(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "ns", "name": name}}

    assert kube.refusal(pod_of("fine")) is None
    why = kube.refusal(pod_of("long"))
    assert why == (
        'the API server refuses Pod ns/long: HTTP 422: Pod "long" is invalid: '
        "metadata.annotations: Too long: must have at most 262144 bytes"
    )
    with pytest.raises(KubeError) as raised:  # may change: retried as the real create would be
        kube.refusal(pod_of("closing"))
    assert raised.value.status == 403
    assert all("dryRun=All" in p for p in _Api.paths) and len(_Api.paths) == 3
    kube.create(pod_of("fine"))
    assert "dryRun" not in _Api.paths[-1]
