"""The per-request half of the workers' HTTP servers: one request, its body and its answer.

:class:`~longtail_workers.httpserver.BackgroundHTTPServer` (uvicorn + Starlette) creates one
:class:`JSONRequestHandler` per request and runs :meth:`JSONRequestHandler.respond` in a
thread of its own, so the handlers (verifier scoring, torch weight packing, role switches) may
block. The servers' handler subclasses (``verifier/handler.py``, ``rollout/http.py``,
``trainer/service.py``, ``drafter_worker/service.py``, ``weights/http_sync.py``) implement
``_dispatch(method)``; the drafter exchange (``drafter/exchange.py``) and the role endpoint
(``spot/cycle.py``) take a handler. What a handler offers: ``method``, ``path`` (without the
query), ``query`` (raw), ``headers``, :meth:`~JSONRequestHandler.read_body` (``Content-Length``
checked before anything is read: 411/413/400 through :class:`RequestError`),
``send_json``/``send_text``/``send_body`` (the answer goes out when the handler returns) and
:func:`fail`.

Authentication lives here, once for every server: with :attr:`BackgroundHTTPServer.auth_token`
set (the job's token, ``longtail_api.auth``), every request other than GET and HEAD must carry
``Authorization: Bearer <token>`` (compared in constant time) or is answered 401 with a JSON
``{"error": ...}`` before the server's own handler sees it. Reads stay open (probes,
Prometheus, status). The worker entry points set the token (:mod:`longtail_workers.auth`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from starlette.requests import Request

from longtail_api.auth import TOKEN_ENV, is_write, token_matches

if TYPE_CHECKING:
    from longtail_workers.httpserver import BackgroundHTTPServer


class RequestError(Exception):
    """An error answer decided while handling a request: status, message, extra headers."""

    def __init__(
        self, status: HTTPStatus, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def fail(status: HTTPStatus, message: str, headers: dict[str, str] | None = None) -> NoReturn:
    """Abandon the request with an error answer (raises :class:`RequestError`)."""
    raise RequestError(status, message, headers)


def check_route(routes: Mapping[str, tuple[str, ...]], method: str, path: str) -> None:
    """Fail with 404 for a path not in ``routes``, 405 (and ``Allow``) for a method not allowed."""
    allowed = routes.get(path)
    if allowed is None:
        fail(HTTPStatus.NOT_FOUND, f"no endpoint {path!r}; endpoints: {', '.join(routes)}")
    if method not in allowed:
        fail(
            HTTPStatus.METHOD_NOT_ALLOWED,
            f"{method} is not allowed on {path}; use {' or '.join(allowed)}",
            {"Allow": ", ".join(allowed)},
        )


def error_text(body: bytes) -> str:
    """The ``error`` of a JSON error answer from these servers, else the body's first 300 chars.

    Used by the HTTP clients (weight sync, drafter exchange) to put the server's reason into
    their own error messages.
    """
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", errors="replace")[:300] or "(empty body)"


@dataclass(frozen=True)
class BodyErrors:
    """A server's messages for :meth:`JSONRequestHandler.read_body` failures.

    ``invalid`` is formatted with ``raw`` (the first 40 characters of the header), ``too_large``
    with ``length`` and ``limit``.
    """

    chunked: str
    """411: the body came with ``Transfer-Encoding`` (chunked) instead of ``Content-Length``."""
    missing: str
    """411: no ``Content-Length`` header (or a blank one, when ``blank_is_missing``)."""
    invalid: str
    """400: ``Content-Length`` is not a non-negative integer."""
    too_large: str
    """413: ``Content-Length`` is over the server's cap; nothing was read."""
    blank_is_missing: bool = False


@dataclass(frozen=True)
class Answer:
    """What a handler answered; :class:`~longtail_workers.httpserver.BackgroundHTTPServer`
    sends it once the handler returned."""

    status: int
    headers: dict[str, str]
    """Header names as written here (clients may read them case-sensitively)."""
    body: bytes | memoryview
    """A memoryview (e.g. one piece of a published policy version) is sent without a copy."""


class JSONRequestHandler:
    """One request: routing hook, token check, body reading and answers (see the module text).

    Methods not in ``dispatch_methods`` get 405 naming the allowed ones; subclasses override
    :meth:`_dispatch` and, to close the connection after an answer, :meth:`must_close`; they
    declare ``app`` with their server's type.
    """

    dispatch_methods: ClassVar[tuple[str, ...]] = ()
    json_separators: ClassVar[tuple[str, str] | None] = (",", ":")
    """``json.dumps`` separators of JSON answers; None for its default (with spaces)."""

    def __init__(
        self,
        app: BackgroundHTTPServer,
        request: Request,
        *,
        loop: asyncio.AbstractEventLoop,
        timeout_s: float,
    ) -> None:
        self.app = app
        """The server: config, readiness and metrics."""
        self.method = request.method
        self.path: str = request.scope["path"]
        self.query = bytes(request.scope.get("query_string", b"")).decode("latin-1")
        self.headers = request.headers
        self.client = request.client.host if request.client is not None else "-"
        self.close_connection = False
        """Set to close the connection after the answer (e.g. the client is gone)."""
        self.answer: Answer | None = None
        self._receive = request.receive
        self._loop = loop
        """The server's event loop: the body is read there (``read_body``)."""
        self._timeout_s = timeout_s
        self._body_read = False

    def respond(self) -> None:
        """Answer the request (in its own thread): method check, token, ``_dispatch``."""
        if self.method not in self.dispatch_methods:
            allowed = ", ".join(sorted(self.dispatch_methods))
            text = f"{self.method} {self.path}: method not allowed here; use {allowed}"
            self.close_connection = True  # the body was not read: never reuse the connection
            self.send_json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": text}, {"Allow": allowed})
        elif self.authorized(self.method):
            self._dispatch(self.method)

    def _dispatch(self, method: str) -> None:
        """Route one request; every server's handler subclass overrides this."""
        raise NotImplementedError(f"{type(self).__name__} must override _dispatch")

    def authorized(self, method: str) -> bool:
        """Check the job's token on a write request; answer 401 and return False without it."""
        token = self.app.auth_token
        if token is None or not is_write(method):
            return True
        sent = self.headers.get("Authorization")
        if token_matches(sent, token):
            return True
        problem = "carries no token" if not sent else "carries a token that is not this job's"
        logging.getLogger(type(self).__module__).warning(
            "401 %s %s from %s: the request %s", method, self.path, self.client, problem
        )
        message = (
            f"{method} {self.path}: unauthorized, the request {problem}; send 'Authorization: "
            f"Bearer <token>' with the job's token ({TOKEN_ENV}; on a cluster the RLJob's Secret "
            "<job>-auth, key token)"
        )
        self.close_connection = True  # close after every refusal
        headers = {"WWW-Authenticate": 'Bearer realm="longtail"'}
        self.send_json(HTTPStatus.UNAUTHORIZED, {"error": message}, headers)
        return False

    def read_body(self, max_bytes: int, errors: BodyErrors) -> bytes:
        """Read the request body after checking ``Content-Length`` against ``max_bytes``."""
        if "Transfer-Encoding" in self.headers:
            fail(HTTPStatus.LENGTH_REQUIRED, errors.chunked)
        raw = self.headers.get("Content-Length")
        if raw is None or (errors.blank_is_missing and not raw.strip()):
            fail(HTTPStatus.LENGTH_REQUIRED, errors.missing)
        raw = raw.strip()
        if not (raw.isascii() and raw.isdigit()):
            fail(HTTPStatus.BAD_REQUEST, errors.invalid.format(raw=raw[:40]))
        length = int(raw)
        if length > max_bytes:
            fail(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                errors.too_large.format(length=length, limit=max_bytes),
            )
        reading = _receive_body(self._receive, length, self._timeout_s)
        # No overall timeout (a large upload may take long): every wait for a piece is bounded
        # there, and stopping the loop cancels the reading, which ends this wait too.
        body = asyncio.run_coroutine_threadsafe(reading, self._loop).result()
        if len(body) < length:
            fail(HTTPStatus.BAD_REQUEST, f"body ended after {len(body)} of {length} bytes")
        self._body_read = True
        return body

    def unread_body(self) -> int | None:
        """Bytes of request body announced and not read yet; None when chunked or unparsable."""
        if self._body_read:
            return 0
        if "Transfer-Encoding" in self.headers:
            return None
        raw = (self.headers.get("Content-Length") or "0").strip() or "0"
        return int(raw) if raw.isascii() and raw.isdigit() else None

    def send_text(self, status: HTTPStatus, text: str) -> int:
        return self.send_body(status, text.encode("utf-8"), "text/plain; charset=utf-8")

    def send_json(
        self, status: HTTPStatus, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> int:
        body = json.dumps(payload, separators=self.json_separators).encode("utf-8")
        return self.send_body(status, body, "application/json", headers)

    def send_body(
        self,
        status: HTTPStatus,
        body: bytes | memoryview,
        content_type: str,
        headers: dict[str, str] | None = None,
    ) -> int:
        """Set the answer (sent when the handler returns; not its body for HEAD); returns the
        status as an int. A later call replaces an earlier one: nothing has gone out yet."""
        names = {"Content-Type": content_type, "Content-Length": str(len(body)), **(headers or {})}
        if self.close_connection or self.must_close():
            names["Connection"] = "close"
        self.answer = Answer(int(status), names, body)
        return int(status)

    def must_close(self) -> bool:
        """Whether to close the connection after the answer being sent; default: keep it."""
        return False


async def _receive_body(
    receive: Callable[[], Awaitable[Mapping[str, Any]]], length: int, timeout_s: float
) -> bytes:
    """Up to ``length`` body bytes from the ASGI ``receive``; each wait bounded by ``timeout_s``.

    Runs on the server's event loop (each wait there is bounded, so the handler thread waiting
    for it is too). The pieces are joined once (the one copy a contiguous body needs); a
    disconnect raises ``ConnectionError``, a stalled client ``TimeoutError``.
    """
    pieces: list[bytes] = []
    got = 0
    while got < length:
        message = await asyncio.wait_for(receive(), timeout_s)
        if message["type"] == "http.disconnect":
            raise ConnectionError(f"client disconnected after {got} of {length} body bytes")
        piece = bytes(message.get("body", b""))
        pieces.append(piece)
        got += len(piece)
        if not message.get("more_body", False):
            break
    return b"".join(pieces)  # a single piece is returned as is, not copied
