"""Trickled request bodies and too many connections on a worker's HTTP port (issue #48 item 9).

A real trainer HTTP service (``TrainerApp`` on the shared ``httpserver.py``) on loopback, with
short body deadlines and a small connection cap, driven by raw sockets: a body trickled into an
endpoint that reads it is answered 408 at its deadline; one the endpoint left unread is cut
once the answer is out and the deadline passed; a body over its route's cap is answered 413
before it is read (the server's memory does not grow by it); connections beyond the cap are
answered 503 and the request threads stay bounded; a read interrupted by the server's stop is
logged quietly (no "unexpected error", no ``CancelledError`` traceback).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from longtail_workers.headerdeadline import BODY_MIN_RATE, BODY_TIMEOUT_S, body_deadline_s
from longtail_workers.httpclient import request
from longtail_workers.trainer.service import TrainerApp

BODY_S = 1.0
"""The test servers' body deadline (a small body's; the rate below adds little)."""
CAP = 6
"""The test servers' connection cap."""
GIVE_UP_S = 15.0
"""The tests' own bound: far past the deadline (a loaded CI machine), far under "never"."""
REQUEST_THREAD = "trainer-http-request"


@pytest.fixture
def app() -> Iterator[TrainerApp]:
    server = TrainerApp("127.0.0.1", 0)
    server.body_timeout_s = BODY_S  # read by start()
    server.body_min_rate = 1e6
    server.max_connections = CAP
    server.start()
    yield server
    server.stop(grace_s=1.0)


def _open(app: TrainerApp, head: str, length: int) -> socket.socket:
    """A connection that sent ``head``'s request line, its headers and no body yet."""
    sock = socket.create_connection(("127.0.0.1", app.port), timeout=5)
    lines = f"{head} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{lines}Content-Length: {length}\r\n\r\n".encode())
    return sock


def _status_or_eof(sock: socket.socket, wait_s: float) -> int | None:
    """The status of an answer that began within ``wait_s``, read whole (0: EOF or reset,
    None: nothing came)."""
    readable, _, _ = select.select([sock], [], [], wait_s)
    if not readable:
        return None
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            piece = sock.recv(65536)
            if not piece:
                return int(data.split(b" ", 2)[1]) if data else 0
            data += piece
        head, _, body = data.partition(b"\r\n\r\n")
        length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:")]  # fmt: skip
        while length and len(body) < length[0]:
            piece = sock.recv(65536)
            if not piece:
                break
            body += piece
    except (ConnectionResetError, BrokenPipeError):
        return int(data.split(b" ", 2)[1]) if data else 0
    return int(head.split(b" ", 2)[1])


def _trickle_until_answered(sock: socket.socket) -> tuple[int, float]:
    """Send one body byte every 0.2 s until the server answers or closes; (status, seconds)."""
    start = time.monotonic()
    while time.monotonic() - start < GIVE_UP_S:
        status = _status_or_eof(sock, 0.2)
        if status is not None:
            return status, time.monotonic() - start
        try:
            sock.sendall(b" ")
        except (BrokenPipeError, ConnectionResetError):
            return 0, time.monotonic() - start
    raise AssertionError(f"no answer within {GIVE_UP_S:.0f}s to a trickled body")


def _request_threads(before: set[threading.Thread] | None = None) -> int:
    """Live request threads of the trainer's server (those not in ``before``)."""
    return sum(
        t.name.startswith(REQUEST_THREAD) and t not in (before or set())
        for t in threading.enumerate()
    )


def _healthz(app: TrainerApp) -> int:
    return request("GET", app.url + "/healthz", timeout_s=5.0, accept=(503,)).status


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_the_deadline_grows_with_the_body_and_is_generous_for_uploads() -> None:
    assert body_deadline_s(0, BODY_TIMEOUT_S, BODY_MIN_RATE) == BODY_TIMEOUT_S
    # A 4 GiB drafter upload (the candidate route's cap) has a quarter of an hour or more.
    assert body_deadline_s(4 << 30, BODY_TIMEOUT_S, BODY_MIN_RATE) >= 900
    assert TrainerApp("127.0.0.1", 0).body_deadline_s(64 << 10) < 60


def test_a_trickled_body_is_answered_408_at_its_deadline(app: TrainerApp) -> None:
    sock = _open(app, "PUT /v1/role", 100)  # read by the role endpoint (cap 64 KiB)
    try:
        sock.sendall(b"{")
        status, waited = _trickle_until_answered(sock)
    finally:
        sock.close()
    print(f"trickled body answered {status} after {waited:.2f}s (deadline {BODY_S:g}s)")
    assert status == 408
    assert waited >= BODY_S * 0.9  # at the deadline, not at once
    assert request("GET", app.url + "/healthz", timeout_s=5.0).status == 200


def test_an_unread_trickled_body_is_cut_after_the_answer(app: TrainerApp) -> None:
    # The checkpoint endpoint answers 503 at once while the trainer starts, body unread;
    # uvicorn then drains it to keep the connection: the drain ends at the deadline.
    sock = _open(app, "POST /v1/checkpoint", 1000)
    try:
        assert _status_or_eof(sock, GIVE_UP_S) == 503
        status, waited = _trickle_until_answered(sock)
    finally:
        sock.close()
    print(f"unread trickled body cut after {waited:.2f}s more")
    assert status == 0  # closed by the server


def test_a_body_over_the_route_cap_is_413_without_being_read(app: TrainerApp) -> None:
    claimed = 512 << 20
    payload = b"x" * (64 << 20)  # allocated before the baseline
    before = _rss_bytes()
    sock = _open(app, "PUT /v1/role", claimed)
    try:

        def push() -> None:
            with contextlib.suppress(OSError):  # the server closed it: the rest is refused
                sock.sendall(payload)

        pusher = threading.Thread(target=push, daemon=True)
        pusher.start()
        assert _status_or_eof(sock, GIVE_UP_S) == 413
        pusher.join(timeout=GIVE_UP_S)
    finally:
        sock.close()
    grew = _rss_bytes() - before
    print(f"RSS grew {grew / 2**20:.1f} MiB while {len(payload) >> 20} MiB were pushed")
    assert grew < len(payload) // 4


def test_connections_beyond_the_cap_get_503_and_threads_stay_bounded(app: TrainerApp) -> None:
    app.body_timeout_s = 30.0  # the next requests read no deadline from it (start did)
    before = set(threading.enumerate())  # an earlier test's threads may still be ending
    held = [_open(app, "PUT /v1/role", 100) for _ in range(CAP)]
    extra: list[socket.socket] = []
    try:
        for sock in held:
            sock.sendall(b"{")
        deadline = time.monotonic() + GIVE_UP_S
        while _request_threads(before) < CAP and time.monotonic() < deadline:
            time.sleep(0.05)  # every held connection's endpoint waits for its body
        assert _request_threads(before) == CAP
        extra = [_open(app, "PUT /v1/role", 100) for _ in range(3 * CAP)]
        refused = [_status_or_eof(sock, GIVE_UP_S) for sock in extra]
        assert refused == [503] * len(extra)
        assert _request_threads(before) == CAP  # the refused ones got no thread
        assert _healthz(app) == 503  # the probes too: the cap is on connections
    finally:
        for sock in held + extra:
            sock.close()
    deadline = time.monotonic() + GIVE_UP_S
    while _healthz(app) != 200 and time.monotonic() < deadline:
        time.sleep(0.1)  # the held connections' ends reach the server
    assert _healthz(app) == 200


def test_a_body_read_cut_by_the_stop_is_logged_quietly(caplog: pytest.LogCaptureFixture) -> None:
    server = TrainerApp("127.0.0.1", 0)
    server.start()
    before = set(threading.enumerate())
    sock = _open(server, "PUT /v1/role", 100)
    try:
        sock.sendall(b"{")
        deadline = time.monotonic() + GIVE_UP_S
        while _request_threads(before) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # its endpoint is now waiting in read_body
        with caplog.at_level(logging.INFO):
            server.stop(grace_s=0.5)  # the body never completes: its read is cut
            for t in threading.enumerate():
                if t.name.startswith(REQUEST_THREAD):
                    t.join(timeout=GIVE_UP_S)
    finally:
        sock.close()
    loud = [r for r in caplog.records if "unexpected error" in r.getMessage() or r.exc_info]
    assert not loud, [r.getMessage() for r in loud]
    assert any("stopped while the body was being read" in r.getMessage() for r in caplog.records)
