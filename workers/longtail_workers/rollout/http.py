"""HTTP control surface of a rollout worker: status, role, health, readiness and metrics.

A thin adapter over :class:`~longtail_workers.rollout.control.RolloutWorker`, built like the
verifier's server on :mod:`longtail_workers.httpserver`: the standard library's
``ThreadingHTTPServer`` in a daemon thread, size-capped bodies, JSON ``{"error": ...}`` answers
that name the problem, and a logged 500 for anything unexpected. Endpoints:

- ``GET /v1/status``  the worker's state (generating / idle since / training, role, versions,
  buffer, trainer, acceptance): :meth:`RolloutWorker.status`;
- ``PUT /v1/role``    ``{"role": "rollout" | "drafter-train"}`` -> 200 with the acknowledged
  role (``desired``, ``observed``, ``since``), 202 when the switch is still completing, 409
  when the role cannot be taken now (message says why), 400 for malformed input;
- ``GET /healthz``, ``GET /readyz``, ``GET /metrics``.

The operator's harvest loop and the local coordinator are the clients. The generation endpoint
will be one more entry in :data:`ROUTES` calling ``RolloutWorker.generate``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlsplit

from prometheus_client import generate_latest

from longtail_api.protocol import HEALTHZ_PATH, METRICS_PATH, READYZ_PATH
from longtail_workers.httpserver import (
    BackgroundHTTPServer,
    BodyErrors,
    JSONRequestHandler,
    RequestError,
    check_route,
    fail,
)
from longtail_workers.rollout.control import InvalidRoleError, RoleConflictError, RolloutWorker
from longtail_workers.rollout.metrics import control_requests_counter

log = logging.getLogger(__name__)

STATUS_PATH = "/v1/status"
ROLE_PATH = "/v1/role"
ROUTES: dict[str, tuple[str, ...]] = {
    HEALTHZ_PATH: ("GET", "HEAD"),
    READYZ_PATH: ("GET", "HEAD"),
    METRICS_PATH: ("GET", "HEAD"),
    STATUS_PATH: ("GET",),
    ROLE_PATH: ("PUT",),
}
CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"
_EXAMPLE = '{"role": "drafter-train"}'
ROLE_BODY_ERRORS = BodyErrors(
    chunked="send the body with a Content-Length header",
    missing="send the body with a Content-Length header",
    invalid="Content-Length: must be an integer, got {raw!r}",
    too_large="body is {length} bytes, over {limit}",
    blank_is_missing=True,
)


@dataclass(frozen=True)
class ControlConfig:
    host: str = "127.0.0.1"
    port: int = 8200
    """TCP port; 0 picks a free one (read it back from :attr:`ControlServer.port`)."""
    max_body_bytes: int = 64 * 1024
    request_timeout_s: float = 30.0


class ControlHandler(JSONRequestHandler):
    """One connection's requests (see the module text)."""

    server_version = "longtail-rollout"
    sys_version = ""
    dispatch_methods = ("GET", "HEAD", "PUT", "POST", "DELETE")

    @property
    def app(self) -> ControlServer:
        return self.server.app  # type: ignore[attr-defined, no-any-return]

    def _dispatch(self, method: str) -> None:
        path = urlsplit(self.path).path
        status = int(HTTPStatus.INTERNAL_SERVER_ERROR)
        started = time.perf_counter()
        try:
            try:
                status = self._route(method, path)
            except RequestError as exc:
                status = self.send_json(exc.status, {"error": exc.message}, exc.headers)
        except (ConnectionError, TimeoutError) as exc:
            log.info("rollout control: %s %s: client connection lost: %s", method, path, exc)
            self.close_connection = True
            status = 499
        except Exception:  # HTTP boundary: log it, answer 500, keep serving
            log.exception("rollout control: unexpected error handling %s %s", method, path)
            body = {"error": "internal error in the rollout worker; see its logs"}
            status = self.send_json(HTTPStatus.INTERNAL_SERVER_ERROR, body)
        finally:
            endpoint = path if path in ROUTES else "other"
            self.app.requests.labels(endpoint=endpoint, code=str(status)).inc()
            log.debug("%s %s -> %d in %.4fs", method, path, status, time.perf_counter() - started)

    def _route(self, method: str, path: str) -> int:
        check_route(ROUTES, method, path)
        worker = self.app.worker
        if path == HEALTHZ_PATH:
            return self.send_body(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
        if path == READYZ_PATH:
            ok = self.app.ready
            text = b"ready\n" if ok else b"not ready: shutting down\n"
            code = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
            return self.send_body(code, text, "text/plain; charset=utf-8")
        if path == METRICS_PATH:
            body = generate_latest(worker.metrics_registry)
            return self.send_body(HTTPStatus.OK, body, CONTENT_TYPE_METRICS)
        if path == STATUS_PATH:
            return self.send_json(HTTPStatus.OK, worker.status())
        return self._put_role(worker)

    def _put_role(self, worker: RolloutWorker) -> int:
        role = role_from_body(self.read_body(self.app.config.max_body_bytes, ROLE_BODY_ERRORS))
        try:
            ack = worker.set_role(role)
        except InvalidRoleError as exc:
            fail(HTTPStatus.BAD_REQUEST, str(exc))
        except RoleConflictError as exc:
            fail(HTTPStatus.CONFLICT, f"role {role!r} refused: {exc}")
        code = HTTPStatus.ACCEPTED if ack.pending else HTTPStatus.OK
        return self.send_json(code, {"worker": worker.name, "role": ack.to_dict()})

    def must_close(self) -> bool:
        # Unread request body (error answered early): close instead of misreading it.
        return self.app.stopping or (not self._body_read and self._has_body())

    def _has_body(self) -> bool:
        raw = (self.headers.get("Content-Length") or "0").strip()
        return "Transfer-Encoding" in self.headers or raw not in ("", "0")


def role_from_body(body: bytes) -> object:
    """The ``role`` of a ``PUT /v1/role`` body (unchecked value); 400 for anything else.

    Shared with the trainer's role endpoint (``trainer/service.py``)."""
    data = _parse_json(body)
    if not isinstance(data, dict):
        fail(HTTPStatus.BAD_REQUEST, f"body must be a JSON object like {_EXAMPLE}")
    unknown = sorted(set(data) - {"role"})
    if unknown:
        fail(HTTPStatus.BAD_REQUEST, f"{unknown[0]}: is not a known field (send {_EXAMPLE})")
    if "role" not in data:
        fail(HTTPStatus.BAD_REQUEST, f"role: is required (send {_EXAMPLE})")
    return data["role"]


def _parse_json(body: bytes) -> object:
    if not body.strip():
        fail(HTTPStatus.BAD_REQUEST, f"request body is empty; send {_EXAMPLE}")
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        fail(HTTPStatus.BAD_REQUEST, f"malformed JSON ({exc}); send {_EXAMPLE}")


class ControlServer(BackgroundHTTPServer):
    """The control surface of one worker, served from a background thread."""

    handler_class = ControlHandler
    thread_name = "rollout-control"
    started_log = "rollout control surface listening on %s"

    def __init__(self, worker: RolloutWorker, config: ControlConfig | None = None) -> None:
        self.worker = worker
        self.config = config or ControlConfig()
        super().__init__(
            self.config.host, self.config.port, request_timeout_s=self.config.request_timeout_s
        )
        self.requests = control_requests_counter(worker.metrics_registry)
