"""Issue #32, item 1, in unit scope: the operator's API client against a loopback port where no
API server listens (a real urllib3 ``MaxRetryError`` from the real client, no mock of it), and
then a tiny HTTP server on that port playing the API server's return.

Every failure of a call is a ``KubeError`` with status 0; the job loop survives it, counts it
(``longtail_operator_reconcile_errors_total{reason="ApiError"}``), retries within
``NO_ANSWER_BACKOFF_S``; ``/readyz`` says 503 while the API server does not answer and 200 once
it does. The same against the real kube-apiserver: ``tests/integration/test_operator_outage.py``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kopf
import pytest
import urllib3
from httpcall import http
from kubernetes import client

from longtail_api import metrics as names
from longtail_operator.kube import Kube, KubeError
from longtail_operator.metrics import Health, HealthServer, OperatorMetrics
from longtail_operator.runtime import MAX_BACKOFF_S, NO_ANSWER_BACKOFF_S, Operator, next_backoff
from longtail_operator.settings import Settings


class _Version(BaseHTTPRequestHandler):
    """Answers ``GET /version`` as an API server does."""

    def do_GET(self) -> None:
        body = json.dumps({"major": "1", "minor": "20", "gitVersion": "v1.20.2"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class ApiPort:
    """A loopback port bound but not listening (connections are refused: the API server is
    down) until :meth:`back` starts a server answering on it; the port stays ours throughout."""

    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Version, bind_and_activate=False)
        self.server.server_bind()
        self.serving = False

    def back(self) -> None:
        self.server.server_activate()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.serving = True

    def close(self) -> None:
        if self.serving:  # shutdown() waits for serve_forever: only when it runs
            self.server.shutdown()
        self.server.server_close()

    def kube(self) -> Kube:
        cfg = client.Configuration()
        cfg.host = f"http://127.0.0.1:{self.server.server_address[1]}"
        return Kube(client.ApiClient(cfg))


@pytest.fixture
def api_port() -> Iterator[ApiPort]:
    port = ApiPort()
    yield port
    port.close()


class Flag:
    """kopf's ``stopped`` flag as the loops read it (truthy once set)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def __bool__(self) -> bool:
        return self.event.is_set()


def test_no_answer_is_a_kube_error_with_status_0(api_port: ApiPort) -> None:
    kube = api_port.kube()
    with pytest.raises(KubeError, match="get rljob ns/tiny: no answer from the API server") as ei:
        kube.get_job("ns", "tiny")
    assert ei.value.status == 0
    assert isinstance(ei.value.__cause__, urllib3.exceptions.MaxRetryError)  # no OSError
    with pytest.raises(KubeError) as ei:
        kube.create({"kind": "Pod", "metadata": {"namespace": "ns", "name": "p"}})
    assert ei.value.status == 0
    assert "no answer from the API server" in (kube.probe() or "")
    api_port.back()
    assert kube.probe() is None


def test_backoff_is_capped_while_the_api_server_does_not_answer() -> None:
    def failed(status: int) -> kopf.TemporaryError:
        exc = kopf.TemporaryError("reconcile failed", delay=1.0)
        exc.__cause__ = KubeError("get rljob ns/tiny", status, "why")
        return exc

    waits = {0: [0.0], 403: [0.0]}
    for status, seq in waits.items():
        for _ in range(8):
            seq.append(next_backoff(seq[-1], failed(status)))
    assert waits[0][1:] == [1.0] + [NO_ANSWER_BACKOFF_S] * 7
    assert waits[403][1:] == [1.0, 2.0, 4.0, 8.0, 16.0] + [MAX_BACKOFF_S] * 3


def test_the_job_loop_survives_the_outage_counts_it_and_readiness_follows_the_api(
    api_port: ApiPort,
) -> None:
    metrics, health = OperatorMetrics(), Health()
    op = Operator(api_port.kube(), Settings(metrics_port=0), metrics, health)
    health.started = True
    server = HealthServer(metrics, health, "127.0.0.1", 0).start()
    stopped = Flag()
    loop = threading.Thread(target=op.run_job, args=(stopped, "ns", "tiny"), daemon=True)
    loop.start()
    errors = names.OPERATOR_RECONCILE_ERRORS_TOTAL.name

    def counted() -> float:
        return metrics.registry.get_sample_value(errors, {"reason": "ApiError"}) or 0.0

    try:
        code, _, text = http(f"http://127.0.0.1:{server.port}/readyz")
        assert code == 503 and b"the Kubernetes API server does not answer" in text, text
        for _ in range(100):  # up to 10 s for two failed reconciles (1 s apart)
            if counted() >= 2 or not loop.is_alive():
                break
            time.sleep(0.1)
        assert loop.is_alive(), "the job loop died on an API error"
        assert counted() >= 2
        api_port.back()
        assert http(f"http://127.0.0.1:{server.port}/readyz")[::2] == (200, b"ready\n")
    finally:
        stopped.event.set()
        loop.join(timeout=10)
        server.stop()
        op.reconciler.pool.shutdown(wait=False)
    assert not loop.is_alive()
