"""Deadlines on a request's headers and body for uvicorn's HTTP/1.1 protocol (slow clients).

uvicorn times out only an idle kept-alive connection, never one that is still sending its
request line and headers or its body, so a client trickling bytes held a connection (and, for
a body an endpoint reads, a request thread) forever. :class:`HeaderDeadlineProtocol` (uvicorn's
h11 protocol plus two timers) bounds both:

* the request line and headers must be complete ``header_timeout_s`` (default
  :data:`HEADER_TIMEOUT_S`) after the connection opened, or after the first byte of a later
  request on it; else the connection is closed;
* the body must be complete within :func:`body_deadline_s` of the headers: ``body_timeout_s``
  plus one second per ``body_min_rate`` bytes of its ``Content-Length`` (a short bound for the
  small control bodies, a generous one for a large upload). A body an endpoint reads
  (``httprequest.JSONRequestHandler.read_body``) is answered 408 at that deadline there; a body
  the endpoint did not read, which uvicorn drains after the answer to keep the connection, is
  cut here: the connection is closed once the answer is out and the deadline has passed.

Used by every worker HTTP server (``httpserver.py``, which passes
:meth:`HeaderDeadlineProtocol.bound` to uvicorn).
"""

from __future__ import annotations

import asyncio
import logging
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 15.0
"""Seconds a client may take to send a request's line and headers (slow-loris bound); the
workers' clients send theirs in one write, so only a stalled or hostile client meets it."""
BODY_TIMEOUT_S = 30.0
"""Seconds every request body gets, whatever its size (the fixed part of the body deadline)."""
BODY_MIN_RATE = float(4 << 20)
"""Bytes per second a body must average beyond that: a slow cluster link carries far more, so
only a stalled or trickling client meets it (a 4 GiB drafter upload gets about 17 minutes)."""


def body_deadline_s(length: int, timeout_s: float, min_rate: float) -> float:
    """Seconds a body of ``length`` bytes may take in all: ``timeout_s + length / min_rate``."""
    return timeout_s + max(0, length) / min_rate


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines on the request headers and body (module text)."""

    header_timeout_s: ClassVar[float] = HEADER_TIMEOUT_S
    body_timeout_s: ClassVar[float] = BODY_TIMEOUT_S
    body_min_rate: ClassVar[float] = BODY_MIN_RATE
    log: ClassVar[logging.Logger] = logging.getLogger(__name__)
    _deadline: asyncio.TimerHandle | None = None
    _body_deadline: asyncio.TimerHandle | None = None
    _body_cycle: object = None
    """The request (uvicorn's cycle) whose body the body deadline is for."""
    _body_late = False
    """The body of the current request is past its deadline and still not complete."""
    _body_seconds = 0.0

    @classmethod
    def bound(
        cls,
        header_timeout_s: float,
        log: logging.Logger,
        *,
        body_timeout_s: float = BODY_TIMEOUT_S,
        body_min_rate: float = BODY_MIN_RATE,
    ) -> type[H11Protocol]:
        """This protocol with the server's timeouts and logger (uvicorn takes a class)."""
        attrs = {
            "header_timeout_s": header_timeout_s,
            "body_timeout_s": body_timeout_s,
            "body_min_rate": body_min_rate,
            "log": log,
        }
        return type("HeaderDeadlineProtocol", (cls,), attrs)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # a later request's first byte (the idle wait is keep-alive's)
        super().data_received(data)
        state = self.conn.their_state
        if state is not h11.IDLE:  # the request line and headers are in
            self._disarm()
        if state is not h11.SEND_BODY:  # no body, or all of it is in
            self._end_body_deadline()
        elif self._body_cycle is not self.cycle:
            self._arm_body()  # this request's headers just completed

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._body_late:  # answered; what is left is draining a body past its deadline
            self._cut_body()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._end_body_deadline()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.log.info(
                "closed a connection from %s: no complete request headers within %gs",
                self._peer(),
                self.header_timeout_s,
            )
            self.transport.close()

    def _arm_body(self) -> None:
        """Start the current request's body deadline (its headers just completed)."""
        length = 0
        for name, value in self.headers:  # uvicorn lowercased the names
            if name == b"content-length" and value.strip().isdigit():
                length = int(value)
        seconds = body_deadline_s(length, self.body_timeout_s, self.body_min_rate)
        self._end_body_deadline()
        self._body_cycle = self.cycle
        self._body_seconds = seconds
        self._body_deadline = self.loop.call_later(seconds, self._body_expired)

    def _end_body_deadline(self) -> None:
        if self._body_deadline is not None:
            self._body_deadline.cancel()
            self._body_deadline = None
        self._body_late = False

    def _body_expired(self) -> None:
        self._body_deadline = None
        if self.conn.their_state is not h11.SEND_BODY or self.cycle is not self._body_cycle:
            return  # the body is complete (or the connection is done with)
        self._body_late = True
        cycle = self.cycle
        if cycle is not None and cycle.response_complete:
            self._cut_body()
        # else the endpoint is still running: if it reads the body, read_body answers 408 at
        # its own deadline; the connection is closed once an answer is out (above)

    def _cut_body(self) -> None:
        if self.transport.is_closing():
            return
        self.log.info(
            "closed a connection from %s: its request body was not complete within %.0fs",
            self._peer(),
            self._body_seconds,
        )
        self.transport.close()

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "?"
