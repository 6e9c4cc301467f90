"""An in-memory stand-in for ``longtail_operator.kube.Kube``, for running whole reconciles in
unit tests (``test_background_checkpoint.py``, ``test_refused_children.py``).

It keeps one RLJob and its children as the API server would return them, plays the kubelet
(a created pod is Running and Ready at once, on ``ip``), applies status merge patches, records
events, creates and deletes, and answers the dry runs of ``Kube.refusal`` through ``refuse``
(a function of the object: the API's refusal message, or None; a real create of a refused
object fails with 422, as on the API server). The real API server's side
of the same is tested in ``tests/integration/test_operator_truth.py``.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any

from longtail_operator.builders import JobRef
from longtail_operator.kube import KubeError
from longtail_operator.model import Event

UID = "uid-1"
_UIDS = (f"uid-{i}" for i in itertools.count(1000))


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: ``patch`` applied to ``target``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class FakeApi:
    """See the module text; ``job`` is the RLJob manifest (metadata.name/namespace set)."""

    def __init__(self, job: dict[str, Any], ip: str = "127.0.0.1") -> None:
        self.job: dict[str, Any] | None = copy.deepcopy(job)
        meta = self.job["metadata"]
        meta.setdefault("uid", UID)
        meta.setdefault("generation", 1)
        self.ip = ip
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.created: list[str] = []
        """``Kind/name`` of every object made (dry runs not counted)."""
        self.dry_runs: list[str] = []
        self.deleted: list[str] = []
        self.events: list[Event] = []
        self.status_patches = 0
        self.refuse: Callable[[dict[str, Any]], str | None] = lambda obj: None

    def probe(self) -> str | None:
        return None  # the API server answers

    # What the reconciler reads.
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.job)

    def list_children(
        self, namespace: str, job: str
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        kinds: dict[str, list[dict[str, Any]]] = {"Pod": [], "Service": [], "ConfigMap": []}
        for (kind, _), obj in self.objects.items():
            if kind in kinds:
                kinds[kind].append(copy.deepcopy(obj))
        return kinds["Pod"], kinds["Service"], kinds["ConfigMap"]

    def pods(self) -> dict[str, dict[str, Any]]:
        return {n: o for (k, n), o in self.objects.items() if k == "Pod"}

    # What it writes.
    def create(self, obj: dict[str, Any], *, dry_run: bool = False) -> None:
        assert not dry_run, "dry runs go through refusal()"
        refused = self.refuse(obj)
        if refused is not None:  # as the API server refuses the real create
            raise KubeError(f"create {obj['kind']} {obj['metadata']['name']}", 422, refused)
        key = (obj["kind"], obj["metadata"]["name"])
        if key in self.objects:
            return  # 409: it exists
        made = copy.deepcopy(obj)
        made["metadata"]["uid"] = next(_UIDS)
        if obj["kind"] == "Pod":
            made["status"] = {
                "phase": "Running",
                "podIP": self.ip,
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        self.objects[key] = made
        self.created.append("/".join(key))

    def refusal(self, obj: dict[str, Any], *, replace: bool = False) -> str | None:
        self.dry_runs.append(f"{obj['kind']}/{obj['metadata']['name']}")
        return self.refuse(obj)

    def replace_configmap(self, obj: dict[str, Any], *, dry_run: bool = False) -> None:
        assert not dry_run, "dry runs go through refusal()"
        self.objects[("ConfigMap", obj["metadata"]["name"])] = copy.deepcopy(obj)

    def delete(self, kind: str, namespace: str, name: str) -> None:
        if self.objects.pop((kind, name), None) is not None:
            self.deleted.append(f"{kind}/{name}")

    def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        assert self.job is not None
        self.status_patches += 1
        self.job = merge_patch(self.job, {"status": patch})

    def patch_custom(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"no custom object is patched here: {args}")

    def post_event(self, job: JobRef, event: Event) -> None:
        self.events.append(event)

    # Tests' helpers.
    def fail_pod(self, name: str, message: str) -> None:
        """The kubelet: the pod's container crashed."""
        pod = self.objects[("Pod", name)]
        pod["status"] = {
            "phase": "Failed",
            "podIP": self.ip,
            "containerStatuses": [
                {"name": "worker", "state": {"terminated": {"exitCode": 1, "message": message}}}
            ],
        }

    def status(self) -> dict[str, Any]:
        assert self.job is not None
        return self.job.get("status") or {}

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]
