"""A tiny stand-in for the Kubernetes API server, for the leader-election unit tests
(``test_leader_restarts.py``): the ``coordination.k8s.io/v1`` Lease calls ``leader.py`` makes
(get, create, replace with the ``resourceVersion`` check: 409 on a stale one), plus what the
operator's start-up reads (``GET /version``, the token key Secret, the namespace list).

It starts *down*: its loopback port is bound but not listening, so calls are refused as by a
stopped kube-apiserver (a real urllib3 ``MaxRetryError``, no mock) until :meth:`FakeApi.up`.
The real Kubernetes client talks to it over plain HTTP (:meth:`FakeApi.kubeconfig`).
"""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

LEASES = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases(?:/([^/?]+))?")
SECRET = re.compile(r"^/api/v1/namespaces/([^/]+)/secrets/([^/?]+)")


class FakeApi:
    """The Leases (by namespace/name) and every write to them, as ``(verb, holder)``."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str | None]] = []
        self.forbidden = 0
        """Answer this many more Lease reads 403, as a restarted kube-apiserver does until its
        RBAC caches are filled."""
        self.lock = threading.Lock()
        self._rv = 0
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                api._get(self)

            def do_POST(self) -> None:
                api._write(self, "create")

            def do_PUT(self) -> None:
                api._write(self, "update")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
        self.server.daemon_threads = True
        self.server.server_bind()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.serving = False

    def up(self) -> None:
        """The API server answers from now on (same port)."""
        self.server.server_activate()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.serving = True

    def close(self) -> None:
        if self.serving:
            self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "op", "user": {"token": "t"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "op"}}],
                    "current-context": "fake",
                }
            )
        )
        return path

    def put_lease(self, namespace: str, name: str, holder: str | None) -> None:
        """Store a Lease as another process would have written it just now."""
        with self.lock:
            self._store(namespace, name, {"holderIdentity": holder, "leaseDurationSeconds": 15})

    def holder(self, namespace: str, name: str) -> str | None:
        with self.lock:
            lease = self.leases.get((namespace, name))
            return None if lease is None else lease["spec"].get("holderIdentity")

    def _store(self, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        self._rv += 1
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(self._rv)},
            "spec": spec,
        }
        self.leases[(namespace, name)] = lease
        return lease

    def _get(self, req: BaseHTTPRequestHandler) -> None:
        if req.path.startswith("/version"):
            return _answer(req, 200, {"major": "1", "minor": "20", "gitVersion": "v1.20.2"})
        if req.path.startswith("/api/v1/namespaces?"):
            return _answer(req, 200, {"kind": "NamespaceList", "items": []})
        if m := SECRET.match(req.path):
            key = base64.b64encode(b"k" * 32).decode()
            meta = {"name": m[2], "namespace": m[1]}
            return _answer(req, 200, {"kind": "Secret", "metadata": meta, "data": {"key": key}})
        m = LEASES.match(req.path)
        with self.lock:
            lease = self.leases.get((m[1], m[2])) if m else None
            if self.forbidden > 0:
                self.forbidden -= 1
                return _answer(req, 403, {"kind": "Status", "code": 403, "message": "forbidden"})
        if lease is None:
            return _answer(req, 404, {"kind": "Status", "code": 404, "message": "not found"})
        return _answer(req, 200, lease)

    def _write(self, req: BaseHTTPRequestHandler, verb: str) -> None:
        body = json.loads(req.rfile.read(int(req.headers["Content-Length"])))
        meta, spec = body["metadata"], body["spec"]
        key = (meta["namespace"], meta["name"])
        with self.lock:
            held = self.leases.get(key)
            if verb == "create" and held is not None:
                return _answer(req, 409, {"kind": "Status", "code": 409, "message": "exists"})
            if verb == "update" and (
                held is None or held["metadata"]["resourceVersion"] != meta["resourceVersion"]
            ):
                return _answer(req, 409, {"kind": "Status", "code": 409, "message": "conflict"})
            lease = self._store(*key, spec)
            self.writes.append((verb, spec.get("holderIdentity")))
        _answer(req, 201 if verb == "create" else 200, lease)


def _answer(req: BaseHTTPRequestHandler, code: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    req.send_response(code)
    req.send_header("Content-Type", "application/json")
    req.send_header("Content-Length", str(len(data)))
    req.end_headers()
    req.wfile.write(data)
