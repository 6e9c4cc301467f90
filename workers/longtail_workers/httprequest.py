"""The per-request half of the workers' HTTP servers: one request, its body and its answer.

:class:`~longtail_workers.httpserver.BackgroundHTTPServer` (uvicorn + Starlette) matches each
request against its server's route table (``httpserver.route``) and hands the row's endpoint
function a :class:`JSONRequestHandler` in a thread of its own (:meth:`JSONRequestHandler.run`),
so the endpoints (verifier scoring, torch weight packing, role switches) may block. What an
endpoint gets: ``method``, ``path`` (without the query), ``params`` (the route's path
parameters), ``query`` (raw), ``headers``, :meth:`~JSONRequestHandler.read_body`
(``Content-Length`` checked against the route's cap before anything is read: 411/413/400
through :class:`RequestError`; the whole body due within the server's body deadline, else 408),
``send_json``/``send_text``/``send_body`` (the answer goes out when the endpoint returns) and
:func:`fail`. What every endpoint gets answered the same way: a :class:`RequestError` as JSON
``{"error": ...}`` with its status, a client that went away or stalled as 499 in the metrics
(408 on the wire), a read the server's stop cut short as 499 too (logged at info, no
traceback), anything unexpected as a logged 500 naming the exception.

Authentication lives here, once for every server: with :attr:`BackgroundHTTPServer.auth_token`
set (the job's token, ``longtail_api.auth``), every request other than GET and HEAD must carry
``Authorization: Bearer <token>`` (compared in constant time) or is answered 401 with a JSON
``{"error": ...}`` before the endpoint runs. Reads stay open (probes, Prometheus, status). The
worker entry points set the token (:mod:`longtail_workers.auth`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, NoReturn

from starlette.requests import Request

from longtail_api.auth import TOKEN_ENV, is_write, token_matches

if TYPE_CHECKING:
    from longtail_workers.httpserver import BackgroundHTTPServer

CLIENT_CLOSED = 499
"""Status counted when the client went away or stalled mid-request (nginx's convention)."""
DRAIN_LIMIT_BYTES = 1 << 20
"""An unread request body up to this size is discarded and the connection kept (must_close)."""


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


class ClientGone(Exception):
    """The client went away or stalled while sending the request body: nothing to answer."""


class JSONRequestHandler:
    """One request: token check, body reading and answers (see the module text)."""

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
        self.params: dict[str, Any] = request.path_params
        """The route's path parameters, converted (``{version:int}`` gives an int)."""
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

    def run(self, endpoint: Callable[[JSONRequestHandler], object]) -> int:
        """Answer the request with ``endpoint`` after the token check (in the request's own
        thread); returns the status to count, :data:`CLIENT_CLOSED` when nothing was answered."""
        log = self.app.log
        try:
            if self.authorized():
                endpoint(self)
                if self.answer is None:
                    raise RuntimeError(f"the endpoint of {self.path} answered nothing")
        except RequestError as exc:
            self.send_json(exc.status, {"error": exc.message}, exc.headers)
        except ClientGone as exc:
            log.info("%s %s: client connection lost: %s", self.method, self.path, exc)
            self.close_connection = True
            return CLIENT_CLOSED
        except Exception as exc:  # HTTP boundary: logged, answered 500, serving on
            log.exception("unexpected error handling %s %s", self.method, self.path)
            problem = f"{type(exc).__name__}: {exc}"
            text = f"internal error in the {self.app.service} ({problem}); see its logs"
            self.send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": text})
        assert self.answer is not None  # every branch above answered
        return self.answer.status

    def authorized(self) -> bool:
        """Check the job's token on a write request; answer 401 and return False without it."""
        token, method = self.app.auth_token, self.method
        if token is None or not is_write(method):
            return True
        sent = self.headers.get("Authorization")
        if token_matches(sent, token):
            return True
        problem = "carries no token" if not sent else "carries a token that is not this job's"
        self.app.log.warning(
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

    def read_body(
        self, max_bytes: int, errors: BodyErrors, *, deadline_s: float | None = None
    ) -> bytes:
        """Read the request body after checking ``Content-Length`` against ``max_bytes`` (413
        before a byte is read: a route's cap is never buffered past), all of it within
        ``deadline_s`` (None: the server's :meth:`body_deadline_s` for its length) or 408."""
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
        allowed_s = self.app.body_deadline_s(length) if deadline_s is None else deadline_s
        reading = _receive_body(self._receive, length, self._timeout_s, allowed_s)
        try:
            future = asyncio.run_coroutine_threadsafe(reading, self._loop)
        except RuntimeError as exc:  # the server's loop is closed: it stopped meanwhile
            reading.close()
            raise ClientGone("the server stopped before the body was read") from exc
        try:
            # The reading ends itself at allowed_s (or at a stall, or when the loop stops and
            # cancels it); this wait's own bound is only a backstop past that.
            body = future.result(timeout=allowed_s + self._timeout_s + 5.0)
        except BodyTooSlow as exc:
            self.close_connection = True  # the rest of the body is not waited for
            self.app.log.info(
                "408 %s %s from %s: %s", self.method, self.path, self.client, exc.message
            )
            fail(HTTPStatus.REQUEST_TIMEOUT, exc.message)
        except concurrent.futures.CancelledError as exc:  # the server stopped past its grace
            raise ClientGone("the server stopped while the body was being read") from exc
        except (ConnectionError, TimeoutError) as exc:  # gone, or stalled (or the backstop)
            future.cancel()
            raise ClientGone(str(exc) or type(exc).__name__) from exc
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
        body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
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
        """Close after this answer while the server stops, or when a large, chunked or
        unparsable request body is left unread.

        Answering an error without reading the body and then closing makes the kernel reset the
        connection, and the client may see the reset instead of the answer. Bodies up to
        :data:`DRAIN_LIMIT_BYTES` are therefore left to uvicorn to read and drop; larger ones
        are not worth the bandwidth, and the connection is closed instead.
        """
        unread = self.unread_body()
        return self.app.stopping or unread is None or unread > DRAIN_LIMIT_BYTES


class BodyTooSlow(Exception):
    """The whole request body did not arrive within its deadline (answered 408)."""

    def __init__(self, got: int, length: int, allowed_s: float) -> None:
        self.message = (
            f"the request body did not arrive within {allowed_s:.0f}s ({got} of {length} bytes "
            "came); send it faster or in one go"
        )
        super().__init__(self.message)


async def _receive_body(
    receive: Callable[[], Awaitable[Mapping[str, Any]]],
    length: int,
    timeout_s: float,
    allowed_s: float,
) -> bytes:
    """Up to ``length`` body bytes from the ASGI ``receive``: each wait bounded by
    ``timeout_s``, the whole body by ``allowed_s``.

    Runs on the server's event loop (each wait there is bounded, so the handler thread waiting
    for it is too). The pieces are joined once (the one copy a contiguous body needs); a
    disconnect raises ``ConnectionError``, a stalled client ``TimeoutError``, a body still
    incomplete at ``allowed_s`` :class:`BodyTooSlow`. h11 never passes more than
    ``Content-Length`` bytes, so what is held stays within the cap checked before.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + allowed_s
    pieces: list[bytes] = []
    got = 0
    while got < length:
        left = deadline - loop.time()
        if left <= 0:
            raise BodyTooSlow(got, length, allowed_s)
        try:
            message = await asyncio.wait_for(receive(), min(timeout_s, left))
        except TimeoutError:
            if loop.time() >= deadline:
                raise BodyTooSlow(got, length, allowed_s) from None
            raise  # stalled: no byte for timeout_s
        if message["type"] == "http.disconnect":
            raise ConnectionError(f"client disconnected after {got} of {length} body bytes")
        piece = bytes(message.get("body", b""))
        pieces.append(piece)
        got += len(piece)
        if not message.get("more_body", False):
            break
    return b"".join(pieces)  # a single piece is returned as is, not copied
