"""HTTP control surface of a rollout worker: status, role, health, readiness and metrics.

A thin adapter over :class:`~longtail_workers.rollout.control.RolloutWorker`, built like the
verifier's server on :mod:`longtail_workers.httpserver`: uvicorn + Starlette in a daemon
thread, size-capped bodies, JSON ``{"error": ...}`` answers that name the problem, and a logged
500 for anything unexpected. Endpoints:

- ``GET /v1/status``  the worker's state (generating / idle since / training, role, versions,
  buffer, trainer, acceptance): :meth:`RolloutWorker.status`;
- ``PUT /v1/role``    ``{"role": "rollout" | "drafter-train"}`` -> 200 with the acknowledged
  role (``desired``, ``observed``, ``since``), 202 when the switch is still completing, 409
  when the role cannot be taken now (message says why), 400 for malformed input;
- ``GET /healthz``, ``GET /readyz``, ``GET /metrics``.

The operator's harvest loop and the local coordinator are the clients; ``rollout/service.py``
adds ``POST /v1/generate``. The role body and answers are the ones every harvested worker
gives (``spot/cycle.py``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from http import HTTPStatus

from prometheus_client import generate_latest

from longtail_api.protocol import HEALTHZ_PATH, METRICS_PATH, READYZ_PATH
from longtail_api.workerapi import ROLE_PATH, STATUS_PATH
from longtail_workers.httprequest import JSONRequestHandler, RequestError, check_route
from longtail_workers.httpserver import BackgroundHTTPServer
from longtail_workers.rollout.control import RolloutWorker
from longtail_workers.rollout.metrics import control_requests_counter
from longtail_workers.spot.cycle import STATUS_ROUTES, answer_put_role

log = logging.getLogger(__name__)

ROUTES: dict[str, tuple[str, ...]] = {**STATUS_ROUTES, ROLE_PATH: ("PUT",)}
CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class ControlConfig:
    host: str = "127.0.0.1"
    port: int = 8200
    """TCP port; 0 picks a free one (read it back from :attr:`ControlServer.port`)."""
    max_body_bytes: int = 64 * 1024
    request_timeout_s: float = 30.0


class ControlHandler(JSONRequestHandler):
    """One request (see the module text)."""

    app: ControlServer
    dispatch_methods = ("GET", "HEAD", "PUT", "POST", "DELETE")

    def _dispatch(self, method: str) -> None:
        path = self.path
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
        return answer_put_role(self, worker.name, worker.set_role, self.app.config.max_body_bytes)

    def must_close(self) -> bool:
        # Unread request body (error answered early): close rather than read it for nothing.
        return self.app.stopping or self.unread_body() != 0


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
