"""The operator's plumbing under load and misuse (issue #48, item 6 c-e), against loopback
servers: Events name the operator instance that posted them; a ``/readyz`` client hanging up
prints no traceback; the API client's connection pool holds every job loop's connection (a
burst of calls logs no "Connection pool is full")."""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from kubernetes import client

from longtail_operator import handlers
from longtail_operator.builders import JobRef
from longtail_operator.kube import COMPONENT, Kube
from longtail_operator.metrics import Health, HealthServer, OperatorMetrics
from longtail_operator.model import Event

CALLS = 32
"""Concurrent API calls of the burst: more than the client's default pool (five per CPU) on the
2-CPU machines the tests run on, fewer than the job loops a burst of jobs runs."""


class _Api(BaseHTTPRequestHandler):
    """``GET /version/`` (each call waits at :attr:`barrier`, so all are in flight at once) and
    ``POST .../events`` (bodies kept in :attr:`events`)."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the API server: connections go back to the pool
    barrier: ClassVar[threading.Barrier | None] = None
    events: ClassVar[list[dict[str, Any]]] = []

    def _answer(self, code: int, answer: dict[str, Any]) -> None:
        data = json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.barrier is not None:
            self.barrier.wait(timeout=30)
        self._answer(200, {"major": "1", "minor": "20"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Api.events.append(body)
        self._answer(201, body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Api.events.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _Api.barrier = None
    server.shutdown()
    server.server_close()


def test_events_name_the_reporting_instance(api: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two replicas, or a restarted pod: each Event says which operator posted it."""
    monkeypatch.setenv("POD_NAME", "longtail-operator-7d9f-abcde")
    cfg = client.Configuration()
    cfg.host = api
    kube = Kube(client.ApiClient(cfg))
    job = JobRef(name="tiny", namespace="ns", uid="uid-1", generation=1)
    kube.post_event(job, Event("Normal", "Started", "all roles ready"))
    [body] = _Api.events
    assert body["reportingComponent"] == COMPONENT
    assert body["reportingInstance"] == "longtail-operator-7d9f-abcde"
    assert body["source"] == {"component": COMPONENT, "host": "longtail-operator-7d9f-abcde"}
    monkeypatch.delenv("POD_NAME")  # outside a pod: the host name
    Kube(client.ApiClient(cfg)).post_event(job, Event("Normal", "Started", "again"))
    assert _Api.events[-1]["reportingInstance"] == socket.gethostname()[:128]


def test_a_burst_of_api_calls_fits_the_connection_pool(
    api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The operator's own client (``handlers.api_client``, from a kubeconfig here): many job
    loops calling at once each keep their connection (a full pool drops it and warns)."""
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": api}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    made = handlers.api_client()
    kube = Kube(made)
    _Api.barrier = threading.Barrier(CALLS)
    problems: list[str | None] = []
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        threads = [
            threading.Thread(target=lambda: problems.append(kube.probe())) for _ in range(CALLS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert problems == [None] * CALLS
    full = [r.getMessage() for r in caplog.records if "pool is full" in r.getMessage()]
    assert not full, full[:3]
    assert made.configuration.connection_pool_maxsize >= handlers.JOB_LOOP_THREADS


def test_a_readyz_client_hanging_up_prints_no_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    """A probe gives up (its timeout) while the operator still asks the API server: answering
    a closed connection is no error."""
    asked, hung_up = threading.Event(), threading.Event()

    def slow_probe() -> str | None:
        asked.set()
        hung_up.wait(timeout=10)
        return None

    health = Health(api_probe=slow_probe)
    health.started = True
    server = HealthServer(OperatorMetrics(), health, "127.0.0.1", 0).start()
    handled = threading.Event()
    inner = server._server.shutdown_request

    def shutdown_request(request: Any) -> None:  # the last step of a request's thread
        inner(request)
        handled.set()

    server._server.shutdown_request = shutdown_request  # type: ignore[method-assign]
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
            conn.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert asked.wait(timeout=10)
            # Reset, not a polite close: the answer's write fails at once (broken pipe).
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        hung_up.set()
        assert handled.wait(timeout=10)
    finally:
        server.stop()
    err = capsys.readouterr().err
    assert "Traceback" not in err and "ConnectionReset" not in err, err
    assert "BrokenPipe" not in err, err
