"""HTTP clients for the workers' and the trainer's endpoints, as the operator calls them.

httpx (the workers' client library too): one short-lived connection per call with a timeout,
JSON bodies parsed with the shared wire types in :mod:`longtail_api.workerapi`. Nothing here
raises on a worker being down or answering badly: every call returns a result carrying either
the parsed body or a message that says what went wrong (connection refused, HTTP 409 and the
worker's reason, malformed body), because the callers (harvest loop, reconcile) record that
message in the RLJob status and retry with backoff. Writes (PUT, POST) carry the job's token
(``Authorization: Bearer``, ``longtail_api.auth``) that ``reconcile.py`` read from its Secret.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from longtail_api.auth import bearer_headers, is_write
from longtail_api.harvest import Activity
from longtail_api.protocol import ProtocolError
from longtail_api.wirecodec import from_wire, to_wire
from longtail_api.workerapi import (
    CHECKPOINT_PATH,
    ROLE_PATH,
    STATUS_PATH,
    CheckpointAnswer,
    RoleAck,
    RoleAnswer,
    RoleRequest,
    RolloutWorkerStatus,
    TrainerStatus,
)

HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), trust_env=False)
"""The operator's client of the job's pods (thread-safe): each call its own connection, as a
worker's server gives a thread to each open connection; straight to the pod, never through an
``HTTP_PROXY`` of the environment."""


@dataclass(frozen=True)
class HttpResult:
    code: int | None
    """HTTP status, or None when no answer came (connection error, timeout)."""
    body: Any
    error: str | None


@dataclass(frozen=True)
class RoleResult:
    code: int | None
    ack: RoleAck | None
    message: str | None


def _error_text(body: Any, code: int) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return f"HTTP {code}: {body['error']}"
    return f"HTTP {code}: {str(body)[:200]}"


def call(
    host: str,
    port: int,
    method: str,
    path: str,
    body: Any = None,
    *,
    timeout: float,
    token: str | None = None,
) -> HttpResult:
    """One JSON call; never raises for network or HTTP errors (see the module text). A write
    carries ``token``."""
    where = f"{method} http://{host}:{port}{path}"
    headers = bearer_headers(token) if is_write(method) else {}
    try:  # a PUT or POST without a body gets Content-Length: 0 from httpx
        resp = HTTP.request(method, f"http://{host}:{port}{path}", json=body, headers=headers,
                            timeout=timeout)  # fmt: skip
    except (httpx.HTTPError, OSError) as exc:
        cause = no_answer_cause(exc)
        return HttpResult(None, None, f"{where}: {type(cause).__name__}: {cause}")
    try:
        parsed = json.loads(resp.content) if resp.content.strip() else None
    except ValueError:
        parsed = resp.content.decode("utf-8", "replace")
    code = resp.status_code
    error = None if 200 <= code < 300 else f"{where}: {_error_text(parsed, code)}"
    return HttpResult(code, parsed, error)


def no_answer_cause(exc: BaseException) -> BaseException:
    """The socket's own error under httpx's (``ConnectionRefusedError``, ``TimeoutError``): what
    the RLJob status and the unreachable-worker lines name."""
    while (inner := exc.__cause__ or exc.__context__) is not None:
        exc = inner
    return exc


@dataclass(frozen=True)
class WorkerClient:
    """Calls a rollout worker's control surface."""

    timeout: float = 2.0

    def status(self, host: str, port: int) -> RolloutWorkerStatus | str:
        """The parsed status, or a message saying why there is none."""
        res = call(host, port, "GET", STATUS_PATH, timeout=self.timeout)
        if res.error is not None:
            return res.error
        try:
            return from_wire(RolloutWorkerStatus, res.body, "status")
        except ProtocolError as exc:
            return f"GET http://{host}:{port}{STATUS_PATH}: malformed status: {exc}"

    def put_role(
        self, host: str | None, port: int, activity: Activity, token: str | None = None
    ) -> RoleResult:
        if not host:
            return RoleResult(None, None, "the pod has no IP yet")
        body = to_wire(RoleRequest(activity))
        res = call(host, port, "PUT", ROLE_PATH, body, timeout=self.timeout, token=token)
        if res.error is not None:
            return RoleResult(res.code, None, res.error)
        try:
            return RoleResult(res.code, from_wire(RoleAnswer, res.body, "response").role, None)
        except ProtocolError as exc:
            return RoleResult(res.code, None, f"PUT {ROLE_PATH}: malformed answer: {exc}")


@dataclass(frozen=True)
class TrainerClient:
    """Calls the trainer's status and checkpoint endpoints."""

    timeout: float = 2.0

    def status(self, host: str, port: int) -> TrainerStatus | str:
        res = call(host, port, "GET", STATUS_PATH, timeout=self.timeout)
        if res.error is not None:
            return res.error
        try:
            return from_wire(TrainerStatus, res.body, "status")
        except ProtocolError as exc:
            return f"GET http://{host}:{port}{STATUS_PATH}: malformed trainer status: {exc}"

    def checkpoint(
        self, host: str, port: int, *, reason: str, timeout: float, token: str | None = None
    ) -> CheckpointAnswer | str:
        """Ask for a checkpoint now; blocks until it is written (or ``timeout``)."""
        body = {"reason": reason}
        res = call(host, port, "POST", CHECKPOINT_PATH, body, timeout=timeout, token=token)
        if res.error is not None:
            return res.error
        try:
            return from_wire(CheckpointAnswer, res.body, "response")
        except ProtocolError as exc:
            return f"POST {CHECKPOINT_PATH}: malformed answer: {exc}"
