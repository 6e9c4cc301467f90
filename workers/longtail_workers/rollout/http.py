"""HTTP control surface of a rollout worker: status, role, health, readiness and metrics.

A thin adapter over :class:`~longtail_workers.rollout.control.RolloutWorker`, built like the
verifier's server (``verifier/server.py``, ``verifier/handler.py``): the standard library's
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
import socket
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn
from urllib.parse import urlsplit

from prometheus_client import generate_latest

from longtail_api.protocol import HEALTHZ_PATH, METRICS_PATH, READYZ_PATH
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


@dataclass(frozen=True)
class ControlConfig:
    host: str = "127.0.0.1"
    port: int = 8200
    """TCP port; 0 picks a free one (read it back from :attr:`ControlServer.port`)."""
    max_body_bytes: int = 64 * 1024
    request_timeout_s: float = 30.0


class RequestError(Exception):
    def __init__(self, status: HTTPStatus, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def _fail(status: HTTPStatus, message: str, headers: dict[str, str] | None = None) -> NoReturn:
    raise RequestError(status, message, headers)


class ControlServer:
    """The control surface of one worker, served from a background thread."""

    def __init__(self, worker: RolloutWorker, config: ControlConfig | None = None) -> None:
        self.worker = worker
        self.config = config or ControlConfig()
        self.requests = control_requests_counter(worker.metrics_registry)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.ready, self.stopping = False, False

    def start(self) -> ControlServer:
        if self._httpd is not None:
            raise RuntimeError("ControlServer.start(): already started (create a new server)")
        cls = _HTTPServer6 if ":" in self.config.host else _HTTPServer
        self._httpd = cls((self.config.host, self.config.port), app=self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"rollout-control-{self.port}",
            daemon=True,
        )
        self._thread.start()
        self.ready = True
        log.info("rollout control surface listening on %s", self.url)
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        httpd = self._httpd
        if httpd is None or self.stopping:
            return
        self.ready, self.stopping = False, True
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=grace_s)

    def __enter__(self) -> ControlServer:
        return self.start() if self._httpd is None else self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("ControlServer.port: not started yet (call start() first)")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = self.config.host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif ":" in host:
            host = "[::1]" if host == "::" else f"[{host}]"
        return f"http://{host}:{self.port}"


class ControlHandler(BaseHTTPRequestHandler):
    """One connection's requests (see the module text)."""

    protocol_version = "HTTP/1.1"
    server_version = "longtail-rollout"
    sys_version = ""
    _method, _body_read = "GET", False

    @property
    def app(self) -> ControlServer:
        return self.server.app  # type: ignore[attr-defined, no-any-return]

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.app.config.request_timeout_s)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        self._method, self._body_read = method, False
        path = urlsplit(self.path).path
        status = int(HTTPStatus.INTERNAL_SERVER_ERROR)
        started = time.perf_counter()
        try:
            try:
                status = self._route(method, path)
            except RequestError as exc:
                status = self._send_json(exc.status, {"error": exc.message}, exc.headers)
        except (ConnectionError, TimeoutError) as exc:
            log.info("rollout control: %s %s: client connection lost: %s", method, path, exc)
            self.close_connection = True
            status = 499
        except Exception:  # HTTP boundary: log it, answer 500, keep serving
            log.exception("rollout control: unexpected error handling %s %s", method, path)
            body = {"error": "internal error in the rollout worker; see its logs"}
            status = self._send_json(HTTPStatus.INTERNAL_SERVER_ERROR, body)
        finally:
            endpoint = path if path in ROUTES else "other"
            self.app.requests.labels(endpoint=endpoint, code=str(status)).inc()
            log.debug("%s %s -> %d in %.4fs", method, path, status, time.perf_counter() - started)

    def _route(self, method: str, path: str) -> int:
        allowed = ROUTES.get(path)
        if allowed is None:
            _fail(HTTPStatus.NOT_FOUND, f"no endpoint {path!r}; endpoints: {', '.join(ROUTES)}")
        if method not in allowed:
            _fail(
                HTTPStatus.METHOD_NOT_ALLOWED,
                f"{method} is not allowed on {path}; use {' or '.join(allowed)}",
                {"Allow": ", ".join(allowed)},
            )
        worker = self.app.worker
        if path == HEALTHZ_PATH:
            return self._send(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
        if path == READYZ_PATH:
            ok = self.app.ready
            text = b"ready\n" if ok else b"not ready: shutting down\n"
            code = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
            return self._send(code, text, "text/plain; charset=utf-8")
        if path == METRICS_PATH:
            body = generate_latest(worker.metrics_registry)
            return self._send(HTTPStatus.OK, body, CONTENT_TYPE_METRICS)
        if path == STATUS_PATH:
            return self._send_json(HTTPStatus.OK, worker.status())
        return self._put_role(worker)

    def _put_role(self, worker: RolloutWorker) -> int:
        data = _parse_json(self._read_body())
        if not isinstance(data, dict):
            _fail(HTTPStatus.BAD_REQUEST, f"body must be a JSON object like {_EXAMPLE}")
        unknown = sorted(set(data) - {"role"})
        if unknown:
            _fail(HTTPStatus.BAD_REQUEST, f"{unknown[0]}: is not a known field (send {_EXAMPLE})")
        if "role" not in data:
            _fail(HTTPStatus.BAD_REQUEST, f"role: is required (send {_EXAMPLE})")
        try:
            ack = worker.set_role(data["role"])
        except InvalidRoleError as exc:
            _fail(HTTPStatus.BAD_REQUEST, str(exc))
        except RoleConflictError as exc:
            _fail(HTTPStatus.CONFLICT, f"role {data['role']!r} refused: {exc}")
        code = HTTPStatus.ACCEPTED if ack.pending else HTTPStatus.OK
        return self._send_json(code, {"worker": worker.name, "role": ack.to_dict()})

    def _read_body(self) -> bytes:
        raw = (self.headers.get("Content-Length") or "").strip()
        if "Transfer-Encoding" in self.headers or not raw:
            _fail(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length header")
        if not (raw.isascii() and raw.isdigit()):
            _fail(HTTPStatus.BAD_REQUEST, f"Content-Length: must be an integer, got {raw[:40]!r}")
        length, limit = int(raw), self.app.config.max_body_bytes
        if length > limit:
            _fail(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body is {length} bytes, over {limit}")
        body = self.rfile.read(length)
        self._body_read = True
        if len(body) < length:
            _fail(HTTPStatus.BAD_REQUEST, f"body ended after {len(body)} of {length} bytes")
        return body

    def _send_json(
        self, status: HTTPStatus, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> int:
        body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        return self._send(status, body, "application/json", headers)

    def _send(
        self, status: HTTPStatus, body: bytes, ctype: str, headers: dict[str, str] | None = None
    ) -> int:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.app.stopping or (not self._body_read and self._has_body()):
            # Unread request body (error answered early): close instead of misreading it.
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self._method != "HEAD":
            self.wfile.write(body)
        return int(status)

    def _has_body(self) -> bool:
        raw = (self.headers.get("Content-Length") or "0").strip()
        return "Transfer-Encoding" in self.headers or raw not in ("", "0")


def _parse_json(body: bytes) -> object:
    if not body.strip():
        _fail(HTTPStatus.BAD_REQUEST, f"request body is empty; send {_EXAMPLE}")
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        _fail(HTTPStatus.BAD_REQUEST, f"malformed JSON ({exc}); send {_EXAMPLE}")


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], *, app: ControlServer) -> None:
        self.app = app
        super().__init__(address, ControlHandler)


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6
