"""The workers' one HTTP client (``longtail_workers.httpclient``) against a real local server.

A standard-library ``ThreadingHTTPServer`` on loopback answers scripted statuses, so retries,
backoff, timeouts, checksums and the job token are checked over real sockets (no mocks of
httpx): transient failures (5xx, refused connections, timeouts) are retried a bounded number of
times with growing waits, a 4xx is not retried, a 409 is ``WorkerBusy``, a body that does not
hash to its advertised sha256 is refused, and writes carry the token.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from longtail_workers.httpclient import (
    ChecksumMismatch,
    Retry,
    WorkerBusy,
    WorkerHTTPError,
    WorkerUnreachable,
    http_json,
    request,
)


class Script:
    """What the server answers: per path, the statuses of successive requests (then 200)."""

    def __init__(self) -> None:
        self.statuses: dict[str, list[int]] = {}
        self.hits: dict[str, list[float]] = {}
        self.auth: list[str | None] = []
        self.lock = threading.Lock()


def make_handler(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self) -> None:
            path = self.path
            with script.lock:
                script.hits.setdefault(path, []).append(time.monotonic())
                script.auth.append(self.headers.get("Authorization"))
                queued = script.statuses.get(path, [])
                status = queued.pop(0) if queued else 200
            length = int(self.headers.get("Content-Length") or 0)
            sent = self.rfile.read(length) if length else b""
            if path == "/slow":
                time.sleep(1.0)
            if path.startswith("/sum"):
                body = b"payload bytes"
                digest = hashlib.sha256(body if path == "/sum/ok" else b"other").hexdigest()
                self._send(200, body, {"X-Sum": digest})
                return
            if status == 200:
                self._send(200, json.dumps({"ok": True, "echo": sent.decode()}).encode())
            else:
                self._send(status, json.dumps({"error": f"scripted {status}"}).encode())

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _answer

    return Handler


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(script))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", script
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_transient_5xx_is_retried_with_growing_backoff_until_it_succeeds(server) -> None:
    url, script = server
    script.statuses["/flaky"] = [503, 502, 500]
    answer = request("GET", url + "/flaky", timeout_s=5.0, retry=Retry(3, 0.1, 10.0))
    assert answer.status == 200 and answer.json()["ok"] is True
    hits = script.hits["/flaky"]
    gaps = [b - a for a, b in itertools.pairwise(hits)]
    assert len(hits) == 4
    # waits are backoff * 2**n with jitter in [0.5, 1]: 0.05-0.1, 0.1-0.2, 0.2-0.4 seconds
    for n, gap in enumerate(gaps):
        assert 0.1 * 2**n * 0.5 - 0.01 <= gap <= 0.1 * 2**n + 0.3, gaps


def test_retries_are_bounded_and_the_error_names_the_last_failure(server) -> None:
    url, script = server
    script.statuses["/down"] = [503] * 10
    with pytest.raises(WorkerHTTPError, match=r"failed after 3 attempt\(s\).*HTTP 503") as info:
        request("GET", url + "/down", timeout_s=5.0, retry=Retry(2, 0.01, 0.02))
    assert info.value.code == 503 and info.value.attempts == 3
    assert info.value.text == "scripted 503"
    assert len(script.hits["/down"]) == 3


def test_a_4xx_is_not_retried_and_carries_the_server_text(server) -> None:
    url, script = server
    script.statuses["/bad"] = [400, 400]
    with pytest.raises(WorkerHTTPError, match="HTTP 400: scripted 400") as info:
        request("POST", url + "/bad", timeout_s=5.0, body=b"{}", retry=Retry(3, 0.01))
    assert info.value.code == 400 and info.value.attempts == 1
    assert len(script.hits["/bad"]) == 1


def test_409_is_worker_busy_and_accepted_statuses_are_returned(server) -> None:
    url, script = server
    script.statuses["/busy"] = [409]
    with pytest.raises(WorkerBusy, match="scripted 409"):
        http_json(url + "/busy", {"role": "rollout"}, 5.0, "PUT", "t")
    script.statuses["/gone"] = [404]
    answer = request("GET", url + "/gone", timeout_s=5.0, accept=(404,))
    assert answer.status == 404 and answer.json() == {"error": "scripted 404"}


def test_a_refused_connection_is_retried_a_bounded_number_of_times() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(WorkerUnreachable, match=r"failed after 4 attempt.*refused") as info:
        request("GET", f"http://127.0.0.1:{port}/x", timeout_s=5.0, retry=Retry(3, 0.05, 0.05))
    assert info.value.attempts == 4 and isinstance(info.value, OSError)
    assert time.monotonic() - started < 2.0  # three waits of at most max_backoff_s


def test_the_timeout_is_honoured(server) -> None:
    url, _ = server
    started = time.monotonic()
    with pytest.raises(WorkerUnreachable, match=r"failed after 2 attempt\(s\).*timed out"):
        request("GET", url + "/slow", timeout_s=0.2, retry=Retry(1, 0.01))
    assert time.monotonic() - started < 0.9  # two attempts of 0.2 s, not the 1 s answer


def test_a_body_that_does_not_match_its_checksum_is_refused(server) -> None:
    url, _ = server
    good = request("GET", url + "/sum/ok", timeout_s=5.0)
    assert good.check_sha256("X-Sum") == hashlib.sha256(b"payload bytes").hexdigest()
    with pytest.raises(ChecksumMismatch, match="X-Sum says"):
        good.check_sha256("X-Sum", expected="0" * 64)  # a manifest that disagrees
    bad = request("GET", url + "/sum/bad", timeout_s=5.0)
    with pytest.raises(ChecksumMismatch, match="a corrupted transfer") as info:
        bad.check_sha256("X-Sum")
    assert info.value.actual == hashlib.sha256(b"payload bytes").hexdigest()


def test_writes_carry_the_token_and_reads_do_not(server) -> None:
    url, script = server
    assert http_json(url + "/w", {"a": 1}, 5.0, "POST", "secret")["echo"] == '{"a": 1}'
    http_json(url + "/r", None, 5.0, "GET", "secret")
    assert script.auth == ["Bearer secret", None]
