"""The operator's Prometheus metrics and its /metrics, /healthz and /readyz server.

Collectors are built from the shared :mod:`longtail_api.metrics` specs (``OPERATOR_METRICS``),
so names, help and labels are written once for the operator, dashboards and alerts.
``handlers.py`` creates one :class:`OperatorMetrics` and one :class:`HealthServer` at start-up;
the reconcile and harvest code record into it. ``/healthz`` answers 200 while the kopf event
loop's heartbeat is fresh, ``/readyz`` 200 once the operator has started and while the
Kubernetes API server answers it (:attr:`Health.api_probe`, asked on every ``/readyz``, so it
is true with no RLJob at all and turns 200 again as soon as the API server is back). The server
is the standard library's (the operator carries no web framework), routed by :data:`ROUTES`; a
client that hangs up before its answer is no error.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from longtail_api import metrics as names
from longtail_api.metrics import MetricSpec
from longtail_api.status import PHASES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
GPU_STATES: tuple[str, ...] = ("total", "idle", "harvested", "drafter")
"""Values of the ``state`` label of ``longtail_operator_job_gpus``."""


def _base(spec: MetricSpec) -> str:
    # prometheus_client appends _total to counters itself: give it the base name.
    return spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name


def _counter(spec: MetricSpec, registry: CollectorRegistry) -> Counter:
    assert spec.kind == "counter", spec.name
    return Counter(_base(spec), spec.help, spec.labels, registry=registry)


def _gauge(spec: MetricSpec, registry: CollectorRegistry) -> Gauge:
    assert spec.kind == "gauge", spec.name
    return Gauge(spec.name, spec.help, spec.labels, registry=registry)


def _histogram(spec: MetricSpec, registry: CollectorRegistry) -> Histogram:
    assert spec.kind == "histogram", spec.name
    if spec.buckets is None:
        return Histogram(spec.name, spec.help, spec.labels, registry=registry)
    return Histogram(spec.name, spec.help, spec.labels, buckets=spec.buckets, registry=registry)


class OperatorMetrics:
    """Every operator collector, on its own registry."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self._reconciles = _counter(names.OPERATOR_RECONCILE_TOTAL, r)
        self._durations = _histogram(names.OPERATOR_RECONCILE_DURATION_SECONDS, r)
        self._errors = _counter(names.OPERATOR_RECONCILE_ERRORS_TOTAL, r)
        self._jobs = _gauge(names.OPERATOR_JOBS, r)
        self._gpus = _gauge(names.OPERATOR_JOB_GPUS, r)
        self._harvested = _counter(names.OPERATOR_HARVESTED_GPU_SECONDS_TOTAL, r)
        self._switches = _counter(names.OPERATOR_ROLE_SWITCHES_TOTAL, r)
        self._switch_seconds = _histogram(names.OPERATOR_ROLE_SWITCH_SECONDS, r)
        self._polls = _counter(names.OPERATOR_STATUS_POLLS_TOTAL, r)
        self._unreachable = _gauge(names.OPERATOR_UNREACHABLE_WORKERS, r)
        self._source_up = _gauge(names.OPERATOR_IDLENESS_SOURCE_UP, r)
        for phase in PHASES:
            self._jobs.labels(phase=phase).set(0)

    def reconcile(self, result: str, seconds: float, reason: str | None = None) -> None:
        self._reconciles.labels(result=result).inc()
        self._durations.labels(result=result).observe(seconds)
        if reason is not None:
            self._errors.labels(reason=reason).inc()

    def jobs(self, by_phase: Mapping[str, int]) -> None:
        for phase in PHASES:
            self._jobs.labels(phase=phase).set(by_phase.get(phase, 0))

    def job_gpus(
        self, namespace: str, job: str, total: int, idle: int, harvested: int, drafter: int = 0
    ) -> None:
        """``state``: ``harvested`` idle GPUs training the drafter now, ``drafter`` the ready
        dedicated drafter pods' GPUs (``spec.drafter``), so the two capacities sum."""
        values = zip(GPU_STATES, (total, idle, harvested, drafter), strict=True)
        for state, value in values:
            self._gpus.labels(namespace=namespace, rljob=job, state=state).set(value)

    def forget_job(self, namespace: str, job: str) -> None:
        for state in GPU_STATES:
            with contextlib.suppress(KeyError):  # never reported: nothing to remove
                self._gpus.remove(namespace, job, state)
        with contextlib.suppress(KeyError):
            self._unreachable.remove(namespace, job)
        with contextlib.suppress(KeyError):
            self._source_up.remove(namespace, job)

    def unreachable_workers(self, namespace: str, job: str, count: int) -> None:
        self._unreachable.labels(namespace=namespace, rljob=job).set(count)

    def idleness_source_up(self, namespace: str, job: str, up: bool) -> None:
        self._source_up.labels(namespace=namespace, rljob=job).set(1 if up else 0)

    def harvested(self, namespace: str, job: str, gpu_seconds: float) -> None:
        self._harvested.labels(namespace=namespace, rljob=job).inc(gpu_seconds)

    def role_switch(self, role: str, result: str, seconds: float | None) -> None:
        self._switches.labels(role=role, result=result).inc()
        if seconds is not None:
            self._switch_seconds.labels(role=role).observe(seconds)

    def status_poll(self, target: str, ok: bool) -> None:
        self._polls.labels(target=target, result="ok" if ok else "error").inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class Health:
    """Liveness heartbeat and readiness flag shared by kopf handlers and the HTTP server."""

    def __init__(
        self,
        stale_after_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        api_probe: Callable[[], str | None] | None = None,
    ) -> None:
        self.stale_after_s, self.clock = stale_after_s, clock
        self.started = False
        self.api_probe = api_probe
        """None when the API server answers, else why not (``Kube.probe``; ``runtime.Operator``
        sets it). Asked on each ``/readyz``: a flag set by the job loops would stay true with
        no RLJob, and flap with one job's RBAC error against another's success."""
        self.last_beat = clock()

    def beat(self) -> None:
        self.last_beat = self.clock()

    def alive(self) -> tuple[bool, str]:
        age = self.clock() - self.last_beat
        if age > self.stale_after_s:
            return False, f"event loop heartbeat is {age:.0f} s old"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if not self.started:
            return False, "starting"
        problem = self.api_probe() if self.api_probe is not None else None
        if problem is not None:
            return False, f"the Kubernetes API server does not answer: {problem}"
        return True, "ready"


def _probe(result: tuple[bool, str]) -> tuple[HTTPStatus, bytes, str]:
    code = HTTPStatus.OK if result[0] else HTTPStatus.SERVICE_UNAVAILABLE
    return code, (result[1] + "\n").encode(), "text/plain; charset=utf-8"


ROUTES: dict[str, Callable[[HealthServer], tuple[HTTPStatus, bytes, str]]] = {
    "/metrics": lambda app: (HTTPStatus.OK, app.metrics.exposition(), CONTENT_TYPE),
    "/healthz": lambda app: _probe(app.health.alive()),
    "/readyz": lambda app: _probe(app.health.ready()),
}
"""The health server's route table (GET: path -> status, body, content type); 404 otherwise."""


class _Handler(BaseHTTPRequestHandler):
    server_version = "longtail-operator"

    def handle(self) -> None:
        # A client that hung up first (a probe past its timeout) has nobody left to answer:
        # no error, no traceback on stderr.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super().handle()

    def do_GET(self) -> None:
        endpoint = ROUTES.get(self.path.split("?", 1)[0])
        if endpoint is None:
            text = f"not found: try {', '.join(ROUTES)}\n"
            code, body, ctype = HTTPStatus.NOT_FOUND, text.encode(), "text/plain"
        else:
            code, body, ctype = endpoint(self.server.app)  # type: ignore[attr-defined]
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # scrapes every few seconds: do not flood the operator log


class HealthServer:
    """Serves /metrics, /healthz, /readyz from a daemon thread."""

    def __init__(self, metrics: OperatorMetrics, health: Health, host: str, port: int) -> None:
        self.metrics: OperatorMetrics = metrics
        self.health: Health = health
        self._server = ThreadingHTTPServer((host, port), _Handler)
        self._server.daemon_threads = True
        self._server.app = self  # type: ignore[attr-defined]
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="operator-metrics", daemon=True
        )

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)
