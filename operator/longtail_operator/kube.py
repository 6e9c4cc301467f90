"""The Kubernetes API calls the operator makes, over the official client, as plain dicts.

Thin on purpose: ``reconcile.py`` decides, this module only talks to the API server. Answers
are read raw (``_preload_content=False`` + ``json.loads``) rather than deserialised into the
client's model classes: a 64-pod list costs milliseconds instead of tens of them. Every failure
becomes a :class:`KubeError` carrying the HTTP status and the server's message; "already exists"
on create and "not found" on delete are successes (reconciles are idempotent). A call that got
no answer (connection refused or reset, timeout, TLS failure: urllib3 raises ``MaxRetryError``
once its retries are spent, which is no ``OSError``) is a ``KubeError`` with status 0, so an
API-server outage is one more retryable error of the job loops (``runtime.py``), never a crash.
Every call has a timeout (``timeout_s``): a hung API server cannot stall a loop for good.
:meth:`Kube.refusal` asks, as a server-side dry run of the create (or the ConfigMap's replace),
whether the API server would take an object: ``reconcile.py`` creates nothing of a plan it
refuses for good.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import socket
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from longtail_api import GROUP, PLURAL, VERSION
from longtail_operator.builders import LABEL_JOB, JobRef
from longtail_operator.model import Event

COMPONENT = "longtail-operator"
"""Who reports the operator's Events (``reportingComponent``, ``source.component``)."""
BUILTIN_APIS = ("networking.k8s.io/v1",)
"""``group/version`` APIs :meth:`Kube.create` calls through the typed clients."""
_SEQ = itertools.count()  # unique Event names within one process
TIMEOUT_S = 30.0
"""Default limit of one API call (connect + read); the longest we make is a LIST of a job's pods."""
PROBE_TIMEOUT_S = 2.0
"""Limit of the readiness probe's call: under the chart's readinessProbe timeout (5 s)."""
PERMANENT = (400, 413, 422)
"""Answers to a create that no retry changes: a malformed (400), too large (413) or invalid
(422) object. 403 (RBAC, a quota) and 404 (an API not served) may change, and are retried."""
NO_PRIORITY_CLASS = "no PriorityClass with name"
"""The Priority admission plugin's 403 for a pod naming a class that does not exist
(``spec.scheduling.priorityClassName``): the user's to fix, so a refusal like a 422, shown
in the job's condition; the dry run asks again every pass, so the job starts once it exists."""
# Transport failures: urllib3's own (MaxRetryError, ProtocolError, ReadTimeoutError, ...), the
# socket's, and http.client's (a connection closed mid-answer).
_NO_ANSWER = (urllib3.exceptions.HTTPError, OSError, http.client.HTTPException)


def reporting_instance() -> str:
    """This operator process as its Events name it (``reportingInstance``, ``source.host``):
    its pod's name (``POD_NAME``, which the chart sets from the downward API), else the host
    name; with two replicas, which one acted. At most 128 characters (the API's limit)."""
    return (os.environ.get("POD_NAME", "").strip() or socket.gethostname())[:128]


class KubeError(RuntimeError):
    """An API call failed; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, what: str, status: int, message: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {message}" if status else f"{what}: {message}")
        self.status = status


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "").get("message", exc.reason))
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


class Kube:
    """API calls on behalf of one operator identity (the ApiClient's credentials);
    ``instance`` names this process in its Events (default :func:`reporting_instance`)."""

    def __init__(
        self, api_client: client.ApiClient, timeout_s: float = TIMEOUT_S, instance: str = ""
    ) -> None:
        self.api_client, self.timeout_s = api_client, timeout_s
        self.instance = instance or reporting_instance()
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.version = client.VersionApi(api_client)

    def _call(
        self,
        what: str,
        fn: Any,
        *args: Any,
        ok: tuple[int, ...] = (),
        timeout: float | None = None,
        **kw: Any,
    ) -> Any:
        """``fn(*args, **kw)``'s JSON answer; ``None`` for a status in ``ok``; else KubeError."""
        limit = self.timeout_s if timeout is None else timeout
        try:
            resp = fn(*args, _preload_content=False, _request_timeout=limit, **kw)
            data: bytes = resp.data  # read here: the body can fail mid-way too
        except ApiException as exc:
            if exc.status in ok:
                return None
            if not exc.status:  # the client's own: a TLS failure
                raise KubeError(what, 0, f"no answer from the API server: {exc.reason}") from exc
            raise KubeError(what, exc.status, _message(exc)) from exc
        except _NO_ANSWER as exc:
            raise KubeError(what, 0, f"no answer from the API server: {exc!r}") from exc
        try:
            return json.loads(data) if data else None
        except ValueError as exc:  # a proxy's error page, or a body cut short
            raise KubeError(what, 0, f"no JSON in the answer ({exc}): {data[:200]!r}") from exc

    def probe(self) -> str | None:
        """None when the API server answers this identity (``GET /version``, readable by every
        authenticated user), else why not: the operator's readiness (``metrics.Health``)."""
        try:
            self._call("GET /version", self.version.get_code, timeout=PROBE_TIMEOUT_S)
        except KubeError as exc:
            return str(exc)
        return None

    def served_apis(self) -> set[str]:
        """Every ``group/version`` the API server serves (discovery: ``GET /apis``, readable by
        every authenticated identity)."""
        body = self._call("GET /apis", client.ApisApi(self.api_client).get_api_versions) or {}
        return {v["groupVersion"] for g in body.get("groups", []) for v in g.get("versions", [])}

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call(  # type: ignore[no-any-return]
            f"get rljob {namespace}/{name}",
            self.custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            ok=(404,),
        )

    def list_children(
        self, namespace: str, job: str
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        """Pods, Services and ConfigMaps labelled with the job's name."""
        sel = f"{LABEL_JOB}={job}"
        out = []
        for kind, fn in (
            ("pods", self.core.list_namespaced_pod),
            ("services", self.core.list_namespaced_service),
            ("configmaps", self.core.list_namespaced_config_map),
        ):
            body = self._call(f"list {kind} in {namespace}", fn, namespace, label_selector=sel)
            out.append(body.get("items", []) if body else [])
        return out[0], out[1], out[2]

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret (None when absent); callers never log its data."""
        what = f"get Secret {namespace}/{name}"
        return self._call(  # type: ignore[no-any-return]
            what, self.core.read_namespaced_secret, name, namespace, ok=(404,)
        )

    def get_network_policy(self, namespace: str, name: str) -> dict[str, Any] | None:
        what = f"get NetworkPolicy {namespace}/{name}"
        fn = self.networking.read_namespaced_network_policy
        return self._call(what, fn, name, namespace, ok=(404,))  # type: ignore[no-any-return]

    def read_custom(
        self, api_version: str, plural: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        """A custom object (namespaced, or cluster-scoped with ``namespace`` None); None when
        absent."""
        group, version = api_version.split("/")
        fn: Any
        if namespace is None:
            fn = self.custom.get_cluster_custom_object
            args: tuple[Any, ...] = (group, version, plural, name)
        else:
            fn = self.custom.get_namespaced_custom_object
            args = (group, version, namespace, plural, name)
        what = f"get {plural}.{group} {namespace or ''}/{name}"
        return self._call(what, fn, *args, ok=(404,))  # type: ignore[no-any-return]

    def patch_custom(
        self,
        api_version: str,
        plural: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        status: bool = False,
    ) -> None:
        """A JSON merge patch of a namespaced custom object (of its status subresource)."""
        group, version = api_version.split("/")
        fn = (
            self.custom.patch_namespaced_custom_object_status
            if status
            else self.custom.patch_namespaced_custom_object
        )
        what = f"patch {plural}.{group} {namespace}/{name}{' status' if status else ''}"
        self._call(what, fn, group, version, namespace, plural, name, patch, ok=(404,))

    def _create_custom(self, obj: dict[str, Any], dry: str | None) -> None:
        group, version = obj["apiVersion"].split("/")
        meta, plural = obj["metadata"], obj["kind"].lower() + "s"
        what = f"create {obj['kind']} {obj['apiVersion']} {meta['namespace']}/{meta['name']}"
        what += " (dry run)" if dry else ""
        fn = self.custom.create_namespaced_custom_object
        try:
            ns = meta["namespace"]
            self._call(what, fn, group, version, ns, plural, obj, ok=(409,), dry_run=dry)
        except KubeError as exc:
            if exc.status != 404:
                raise
            why = (
                f"the API {obj['apiVersion']} ({plural}) is not served on this cluster: install "
                "it (its scheduler, or Kueue), or change the job (spec.scheduling.gang.backend, "
                "or its queue label)"
            )
            raise KubeError(what, 404, why) from exc

    def create(self, obj: dict[str, Any], *, dry_run: bool = False) -> None:
        """Create ``obj`` (409, it exists: done); ``dry_run``: only ask whether the API server
        would (server-side ``dryRun=All``: every admission and validation step, nothing
        stored)."""
        kind, meta = obj["kind"], obj["metadata"]
        dry = "All" if dry_run else None
        if "/" in obj.get("apiVersion", "") and obj["apiVersion"] not in BUILTIN_APIS:
            return self._create_custom(obj, dry)
        fns = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "ConfigMap": self.core.create_namespaced_config_map,
            "Secret": self.core.create_namespaced_secret,
            "NetworkPolicy": self.networking.create_namespaced_network_policy,
        }
        what = f"create {kind} {meta['namespace']}/{meta['name']}{' (dry run)' if dry else ''}"
        self._call(what, fns[kind], meta["namespace"], obj, ok=(409,), dry_run=dry)

    def replace_configmap(self, obj: dict[str, Any], *, dry_run: bool = False) -> None:
        meta = obj["metadata"]
        dry = "All" if dry_run else None
        what = f"replace ConfigMap {meta['namespace']}/{meta['name']}"
        what += " (dry run)" if dry else ""
        fn = self.core.replace_namespaced_config_map
        self._call(what, fn, meta["name"], meta["namespace"], obj, dry_run=dry)

    def refusal(self, obj: dict[str, Any], *, replace: bool = False) -> str | None:
        """Why the API server refuses to create ``obj`` (``replace``: to replace the ConfigMap
        ``obj``) for good, asked as a server-side dry run; None when it would take it. Only a
        refusal no retry can change (:data:`PERMANENT`: the object is invalid, too long, or
        too large) is returned, as the API's message naming the object; any other failure
        raises the ``KubeError`` the real call would."""
        try:
            if replace:
                self.replace_configmap(obj, dry_run=True)
            else:
                self.create(obj, dry_run=True)
        except KubeError as exc:
            if exc.status not in PERMANENT and not (
                exc.status == 403 and NO_PRIORITY_CLASS in str(exc)
            ):
                raise
            meta = obj["metadata"]
            answer = str(exc).partition(": ")[2]  # "HTTP 422: <the API's message>"
            return (
                f"the API server refuses {obj['kind']} {meta['namespace']}/{meta['name']}: {answer}"
            )
        return None

    def delete(self, kind: str, namespace: str, name: str) -> None:
        """``kind``: a core or networking kind, or ``group/version/Kind`` of a custom object."""
        if kind.count("/") == 2:
            group, version, custom = kind.split("/")
            what = f"delete {custom} {group}/{version} {namespace}/{name}"
            fn = self.custom.delete_namespaced_custom_object
            plural = custom.lower() + "s"
            self._call(what, fn, group, version, namespace, plural, name, ok=(404,))
            return
        fns = {
            "Pod": self.core.delete_namespaced_pod,
            "Service": self.core.delete_namespaced_service,
            "ConfigMap": self.core.delete_namespaced_config_map,
            "NetworkPolicy": self.networking.delete_namespaced_network_policy,
        }
        body = {"propagationPolicy": "Background"}
        what = f"delete {kind} {namespace}/{name}"
        self._call(what, fns[kind], name, namespace, body=body, ok=(404,))

    def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self._call(
            f"patch rljob {namespace}/{name} status",
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": patch},
            ok=(404,),
        )

    def post_event(self, job: JobRef, event: Event) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        stamp = datetime.now(UTC).strftime("%Y%m%d%H%M%S%f")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{job.name}.{stamp}{next(_SEQ)}", "namespace": job.namespace},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "RLJob",
                "name": job.name,
                "namespace": job.namespace,
                "uid": job.uid,
            },
            "reason": event.reason,
            "message": event.message[:1024],
            "type": event.type,
            "source": {"component": COMPONENT, "host": self.instance},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        what = f"post event {event.reason} for {job.namespace}/{job.name}"
        self._call(what, self.core.create_namespaced_event, job.namespace, body, ok=(409,))
