"""HTTP control surface of a rollout worker: status, role, health, readiness and metrics.

A thin adapter over :class:`~longtail_workers.rollout.control.RolloutWorker`, a route table
on :mod:`longtail_workers.httpserver` like every worker's: uvicorn + Starlette in a daemon
thread, size-capped bodies, JSON ``{"error": ...}`` answers that name the problem, and a logged
500 for anything unexpected. Endpoints:

- ``GET /v1/status``  the worker's state (generating / idle since / training, role, versions,
  buffer, trainer, acceptance): :meth:`RolloutWorker.status`;
- ``PUT /v1/role``    ``{"role": "rollout" | "drafter-train"}`` -> 200 with the acknowledged
  role (``desired``, ``observed``, ``since``), 202 when the switch is still completing, 409
  when the role cannot be taken now (message says why), 400 for malformed input;
- ``GET /healthz``, ``GET /readyz`` (503 while stopping), ``GET /metrics``
  (``httpserver.probe_routes``).

The operator's harvest loop and the local coordinator are the clients; ``rollout/service.py``
adds ``POST /v1/generate``. The role body and answers are the ones every harvested worker
gives (``spot/cycle.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus

from starlette.routing import Route

from longtail_api.wirecodec import to_wire
from longtail_api.workerapi import ROLE_PATH, STATUS_PATH
from longtail_workers.httprequest import JSONRequestHandler
from longtail_workers.httpserver import BackgroundHTTPServer, probe_routes, route
from longtail_workers.rollout.control import RolloutWorker
from longtail_workers.rollout.metrics import control_requests_counter
from longtail_workers.spot.cycle import answer_put_role


@dataclass(frozen=True)
class ControlConfig:
    host: str = "127.0.0.1"
    port: int = 8200
    """TCP port; 0 picks a free one (read it back from :attr:`ControlServer.port`)."""
    max_body_bytes: int = 64 * 1024
    request_timeout_s: float = 30.0


class ControlServer(BackgroundHTTPServer):
    """The control surface of one worker, served from a background thread."""

    service = "rollout worker"
    thread_name = "rollout-control"
    started_log = "rollout control surface listening on %s"

    def __init__(self, worker: RolloutWorker, config: ControlConfig | None = None) -> None:
        self.worker = worker
        self.config = config or ControlConfig()
        super().__init__(
            self.config.host, self.config.port, request_timeout_s=self.config.request_timeout_s
        )
        self.requests = control_requests_counter(worker.metrics_registry)

    def routes(self) -> list[Route]:
        worker = self.worker
        return [
            *probe_routes(self.unready, worker.metrics_registry),
            route(
                STATUS_PATH, lambda h: h.send_json(HTTPStatus.OK, to_wire(worker.status())), "GET"
            ),
            route(ROLE_PATH, self._put_role, "PUT"),
        ]

    def _put_role(self, handler: JSONRequestHandler) -> None:
        worker = self.worker
        answer_put_role(handler, worker.name, worker.role.set_role, self.config.max_body_bytes)

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint=endpoint, code=str(status)).inc()
