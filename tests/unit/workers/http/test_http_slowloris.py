"""Slow-loris connections to a worker's HTTP port are closed (issue #32 item 8).

A real trainer HTTP service (``TrainerApp``, on the shared ``httpserver.py`` every worker uses)
on loopback with a 1 s header deadline: sockets that trickle header bytes are closed by the
server, while normal requests keep working, and a kept-alive connection that waits longer than
the deadline between two requests is not cut (its idle wait is the keep-alive timeout's).
"""

from __future__ import annotations

import http.client
import select
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from longtail_workers.headerdeadline import HEADER_TIMEOUT_S
from longtail_workers.httpclient import request
from longtail_workers.httpserver import BackgroundHTTPServer
from longtail_workers.trainer.service import TrainerApp

DEADLINE_S = 1.0
SLOW = 20
"""Sockets trickling header bytes at once."""
GIVE_UP_S = 20.0
"""The test's own bound: far past the deadline (a loaded CI machine), far under "never"."""


@pytest.fixture
def app() -> Iterator[TrainerApp]:
    server = TrainerApp("127.0.0.1", 0)
    server.header_timeout_s = DEADLINE_S  # read by start()
    server.start()
    yield server
    server.stop(grace_s=1.0)


def _closed_by_peer(sock: socket.socket) -> bool:
    """True once the server closed it (EOF or reset); never blocks."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(4096) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def test_sockets_trickling_header_bytes_are_closed_while_requests_work(app: TrainerApp) -> None:
    socks = [socket.create_connection(("127.0.0.1", app.port), timeout=5) for _ in range(SLOW)]
    try:
        for s in socks:
            s.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n")
        open_ = set(range(SLOW))
        start = time.monotonic()
        while open_ and time.monotonic() - start < GIVE_UP_S:
            for i in sorted(open_):
                if _closed_by_peer(socks[i]):
                    open_.discard(i)
                    continue
                try:
                    socks[i].sendall(b"X")  # one more header byte, never the blank line
                except (BrokenPipeError, ConnectionResetError):
                    open_.discard(i)
            # The service answers others meanwhile.
            assert request("GET", app.url + "/healthz", timeout_s=5.0).status == 200
            time.sleep(0.2)
        waited = time.monotonic() - start
        assert not open_, f"{len(open_)} of {SLOW} slow sockets still open after {waited:.0f}s"
        assert waited >= DEADLINE_S * 0.9  # closed by the deadline, not at once
    finally:
        for s in socks:
            s.close()
    assert request("GET", app.url + "/healthz", timeout_s=5.0).status == 200


def test_a_kept_alive_connection_idle_past_the_deadline_still_serves(app: TrainerApp) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", app.port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        first = conn.getresponse()
        assert first.read() and first.status == 200 and not first.will_close
        sock = conn.sock
        time.sleep(DEADLINE_S * 2)  # idle: keep-alive's wait (60 s here), not the deadline's
        conn.request("GET", "/healthz")  # RemoteDisconnected if the server had closed it
        second = conn.getresponse()
        assert second.read() and second.status == 200 and conn.sock is sock
    finally:
        conn.close()


class NoRoutes(BackgroundHTTPServer):
    def routes(self) -> list[Any]:
        return []


def test_the_default_deadline_and_a_bad_one() -> None:
    assert 5.0 <= TrainerApp("127.0.0.1", 0).header_timeout_s == HEADER_TIMEOUT_S <= 30.0
    with pytest.raises(ValueError, match=r"header_timeout_s=0.*must be > 0"):
        NoRoutes("127.0.0.1", 0, request_timeout_s=1.0, header_timeout_s=0)
