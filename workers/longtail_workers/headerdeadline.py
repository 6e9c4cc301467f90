"""A deadline on a request's line and headers for uvicorn's HTTP/1.1 protocol (slow loris).

uvicorn times out only an idle kept-alive connection, never one that is still sending its
request line and headers, so a client trickling header bytes held a connection forever.
:class:`HeaderDeadlineProtocol` (uvicorn's h11 protocol plus one timer) closes a connection
whose request headers are not complete ``header_timeout_s`` (default :data:`HEADER_TIMEOUT_S`)
after it opened, or after the first byte of a later request on it. Used by every worker HTTP
server (``httpserver.py``, which passes :meth:`HeaderDeadlineProtocol.bound` to uvicorn).
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


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on the request line and headers (module text)."""

    header_timeout_s: ClassVar[float] = HEADER_TIMEOUT_S
    log: ClassVar[logging.Logger] = logging.getLogger(__name__)
    _deadline: asyncio.TimerHandle | None = None

    @classmethod
    def bound(cls, header_timeout_s: float, log: logging.Logger) -> type[H11Protocol]:
        """This protocol with the server's timeout and logger (uvicorn takes a class)."""
        attrs = {"header_timeout_s": header_timeout_s, "log": log}
        return type("HeaderDeadlineProtocol", (cls,), attrs)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # a later request's first byte (the idle wait is keep-alive's)
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the request line and headers are in
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
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
                f"{self.client[0]}:{self.client[1]}" if self.client else "?",
                self.header_timeout_s,
            )
            self.transport.close()
