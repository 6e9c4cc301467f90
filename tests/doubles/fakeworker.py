"""Loopback stand-ins for a rollout worker and the trainer, speaking the exact wire types.

A test double (it lives under ``tests/``, not in the operator package): used by the operator's
unit tests (``tests/unit/operator/``), the control-plane tests (``tests/integration/opharness.py``,
``test_operator.py``) and ``bench/operator.py``, which import it by name with this directory on
``sys.path`` (``tests/conftest.py`` puts it there). Handy too for trying the operator by hand on a
control plane without a kubelet: serve one :class:`FakeWorker` per pod IP (``127.0.0.N``) and
patch the pods' ``status.podIP`` to it. Bodies are built with :mod:`longtail_api.workerapi`
``to_wire`` (the same types the operator parses), so they cannot drift from what the operator
reads; the real rollout worker's answers are checked against the same types in
``tests/unit/operator/test_workerapi.py``. With :attr:`token` set, writes without
``Authorization: Bearer <token>`` get 401 like the real workers' (``unauthorized`` counts them).
Standard library only.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from longtail_api.auth import token_matches
from longtail_api.harvest import Activity
from longtail_api.protocol import ProtocolError
from longtail_api.wirecodec import from_wire, to_wire
from longtail_api.workerapi import (
    CHECKPOINT_PATH,
    ROLE_PATH,
    STATUS_PATH,
    TRAINER_ACTIVITIES,
    CheckpointAnswer,
    RoleAck,
    RoleAnswer,
    RoleRequest,
    RoleState,
    RolloutWorkerStatus,
    TrainerStatus,
    WorkerVersions,
)


class _Handler(BaseHTTPRequestHandler):
    def _reply(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw.strip() else {}

    def do_GET(self) -> None:
        app: _Served = self.server.app  # type: ignore[attr-defined]
        if self.path == STATUS_PATH:
            self._reply(200, app.status_body())
        elif self.path in ("/healthz", "/readyz"):
            self._reply(200, "ok")
        else:
            self._reply(404, {"error": f"no route {self.path}"})

    def do_PUT(self) -> None:
        self._write("PUT")

    def do_POST(self) -> None:
        self._write("POST")

    def _write(self, method: str) -> None:
        app: _Served = self.server.app  # type: ignore[attr-defined]
        body = self._body()
        sent = self.headers.get("Authorization")
        if app.token is not None and not token_matches(sent, app.token):
            with app.lock:
                app.unauthorized += 1
            self._reply(401, {"error": f"{method} {self.path}: unauthorized (no or wrong token)"})
            return
        code, answer = app.handle(method, self.path, body)
        self._reply(code, answer)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Served:
    """A ThreadingHTTPServer in a daemon thread, bound to (host, port)."""

    def __init__(self, host: str, port: int) -> None:
        self.lock = threading.Lock()
        self.role_requests: list[str] = []
        """Every role a PUT /v1/role asked for, in order (refused ones too)."""
        self.role_times: list[float] = []
        """The wall time of each of :attr:`role_requests`."""
        self.token: str | None = None
        """The job's token its writes require (None: open)."""
        self.unauthorized = 0
        """Writes refused with 401."""
        self._server = ThreadingHTTPServer((host, port), _Handler)
        self._server.daemon_threads = True
        self._server.app = self  # type: ignore[attr-defined]
        self.host, self.port = host, int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def status_body(self) -> Any:
        raise NotImplementedError

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if (method, path) == ("PUT", ROLE_PATH):
            try:
                role = from_wire(RoleRequest, body, "request").role
            except ProtocolError as exc:
                return int(HTTPStatus.BAD_REQUEST), {"error": str(exc)}
            with self.lock:
                self.role_requests.append(role)
                self.role_times.append(time.time())
                return self.switch_role(role)
        return 404, {"error": f"no route {method} {path}"}

    def switch_role(self, role: Activity) -> tuple[int, Any]:
        """Answer a parsed PUT /v1/role (called with :attr:`lock` held)."""
        return 404, {"error": f"no route PUT {ROLE_PATH}"}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)


class FakeWorker(_Served):
    """A rollout worker: generating or idle; PUT /v1/role switches at once (or refuses)."""

    def __init__(self, name: str, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.name = name
        self.generating = False
        self.idle_since: float | None = time.time()
        self.desired: Activity = "rollout"
        self.observed: Activity = "rollout"
        self.since = time.time()
        self.refuse: str | None = None
        """When set, PUT /v1/role answers 409 with this reason."""

    def set_generating(self, generating: bool) -> None:
        with self.lock:
            self.generating = generating
            self.idle_since = None if generating else time.time()

    def status_body(self) -> Any:
        with self.lock:
            now = time.time()
            idle = None if self.idle_since is None else max(0.0, now - self.idle_since)
            status = RolloutWorkerStatus(
                worker=self.name,
                state="generating" if self.generating else "idle",
                role=RoleState(self.desired, self.observed, self.since),
                generating=self.generating,
                running=1 if self.generating else 0,
                waiting=0,
                idle_since=self.idle_since,
                idle_seconds=idle,
                versions=WorkerVersions(policy=0, drafter=-1, step=0),
            )
        return to_wire(status)

    def switch_role(self, role: Activity) -> tuple[int, Any]:
        if self.refuse is not None:
            return int(HTTPStatus.CONFLICT), {"error": f"role {role!r} refused: {self.refuse}"}
        if role != self.observed:
            self.since = time.time()
        self.desired = self.observed = role
        ack = RoleAck(role, role, self.since, pending=False, switch_seconds=0.0)
        return 200, to_wire(RoleAnswer(self.name, ack))


CHECKPOINT_HOLD_S = 120.0
"""Longest a held checkpoint (:attr:`FakeTrainer.checkpoint_release`) waits before it fails."""


class FakeTrainer(_Served):
    """The trainer: a settable :class:`TrainerStatus`; POST /v1/checkpoint records the call
    (with :attr:`checkpoint_release` set, it is being written until that event is set: a slow
    checkpoint); PUT /v1/role switches between ``train`` and ``drafter-train`` at once, refusing
    ``drafter-train`` (409) outside a rollout as the real trainer does."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, total_steps: int = 20) -> None:
        super().__init__(host, port)
        self.status = TrainerStatus(
            step=0, total_steps=total_steps, phase="running", policy_version=0, drafter_version=-1
        )
        self.checkpoints: list[int] = []
        """The step of each checkpoint written (answered 200)."""
        self.checkpoint_asks = 0
        """POST /v1/checkpoint requests received (written or not yet)."""
        self.checkpoint_release: threading.Event | None = None
        """When set to an event, a checkpoint is written (and answered) only once it is set."""
        self.role = RoleState("train", "train", time.time())
        self.rollout_since: float | None = None

    def set_rollout(self, active: bool) -> None:
        """A step's rollout starts (the trainer waits from now on) or ends (back to train)."""
        with self.lock:
            self.rollout_since = time.time() if active else None
            if not active:
                self.role = RoleState("train", "train", time.time())

    def status_body(self) -> Any:
        with self.lock:
            since = self.rollout_since
            idle = None if since is None else max(0.0, time.time() - since)
            return to_wire(
                dataclasses.replace(
                    self.status,
                    rollout_active=self.status.rollout_active or since is not None,
                    role=self.role,
                    idle_since=since,
                    idle_seconds=idle,
                )
            )

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if (method, path) != ("POST", CHECKPOINT_PATH):
            return super().handle(method, path, body)
        with self.lock:
            self.checkpoint_asks += 1
            release = self.checkpoint_release
        if release is not None and not release.wait(CHECKPOINT_HOLD_S):
            return int(HTTPStatus.SERVICE_UNAVAILABLE), {"error": "checkpoint held too long"}
        with self.lock:
            self.checkpoints.append(self.status.step)
            answer = CheckpointAnswer(self.status.step, f"/checkpoints/step-{self.status.step}")
        return 200, to_wire(answer)

    def switch_role(self, role: Activity) -> tuple[int, Any]:
        outside_rollout = role == "drafter-train" and self.rollout_since is None
        if role not in TRAINER_ACTIVITIES or outside_rollout:
            return int(HTTPStatus.CONFLICT), {"error": f"role {role!r} refused now"}
        if role != self.role.observed:
            self.role = RoleState(role, role, time.time())
        ack = RoleAck(role, role, self.role.since, pending=False, switch_seconds=0.0)
        return 200, to_wire(RoleAnswer("trainer", ack))
