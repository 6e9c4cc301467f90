"""Shared plumbing of the workers' small standard-library HTTP servers.

The verifier (``verifier/server.py``, ``verifier/handler.py``), the rollout worker's control
surface (``rollout/http.py``) and the trainer's weight server (``weights/http_sync.py``) each
subclass :class:`BackgroundHTTPServer` (bind, serve from a daemon thread, ``url``, ``port``,
``stop(grace_s)``, context manager) and :class:`JSONRequestHandler` (socket timeout, request
logging through :mod:`logging`, ``Content-Length``-capped body reading that answers 411/413/400
through :class:`RequestError`, JSON and plain answers), and check paths with
:func:`check_route`. Endpoints, error texts, metrics and readiness stay with each server; this
module only holds the mechanism they share.

Authentication lives here, once for every server: with :attr:`BackgroundHTTPServer.auth_token`
set (the job's token, ``longtail_api.auth``), every request other than GET and HEAD must carry
``Authorization: Bearer <token>`` (compared in constant time) or is answered 401 with a JSON
``{"error": ...}`` before the server's own handler sees it. Reads stay open (probes,
Prometheus, status). The worker entry points set the token (:mod:`longtail_workers.auth`).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, NoReturn, Self

from longtail_api.auth import TOKEN_ENV, is_write, token_matches


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


class BackgroundHTTPServer:
    """A ``ThreadingHTTPServer`` served from a daemon thread; subclasses set the class attributes.

    The handler reaches the instance as ``self.server.app`` (:attr:`JSONRequestHandler.app`).
    Stopping refuses new connections, calls :meth:`_wait_idle`, closes the socket and joins the
    thread; a stopped server cannot be started again unless a subclass resets it.
    """

    handler_class: ClassVar[type[BaseHTTPRequestHandler]]
    thread_name: ClassVar[str] = "http"
    """Thread name prefix; the bound port is appended."""
    request_queue_size: ClassVar[int] = 128
    started_log: ClassVar[str] = "listening on %s"
    """Logged at info level (with the URL) through the subclass module's logger."""
    stopped_log: ClassVar[str | None] = None

    def __init__(self, host: str, port: int, *, request_timeout_s: float) -> None:
        self._address = (host, port)
        self.request_timeout_s = request_timeout_s
        """Socket timeout per connection, so a stalled client cannot hold a thread forever."""
        self.auth_token: str | None = None
        """The job's token: required on every write (non-GET/HEAD) request; None: open."""
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = False
        self._stopping = False

    def start(self) -> Self:
        """Bind the socket and serve in a daemon thread. Raises ``OSError`` if binding fails."""
        if self._httpd is not None:
            raise RuntimeError(
                f"{type(self).__name__}.start(): already started (create a new server)"
            )
        host = self._address[0]
        server_cls = _Server6 if ":" in host else _Server
        self._httpd = server_cls(self._address, self.handler_class, self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},  # also the latency of stop()
            name=f"{self.thread_name}-{self.port}",
            daemon=True,
        )
        self._thread.start()
        self._ready = True
        self._log.info(self.started_log, self.url)
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, wait for in-flight work (see :meth:`_wait_idle`), close the socket."""
        httpd = self._httpd
        if httpd is None or self._stopping:
            return
        self._ready = False
        self._stopping = True
        httpd.shutdown()  # returns once serve_forever has left its loop
        self._wait_idle(grace_s)
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=grace_s)
        if self.stopped_log is not None:
            self._log.info(self.stopped_log)

    def _wait_idle(self, grace_s: float) -> None:
        """Hook between refusing new connections and closing the socket; default: no wait."""

    def __enter__(self) -> Self:
        return self.start() if self._httpd is None else self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (the real one when port 0 was asked for)."""
        if self._httpd is None:
            raise RuntimeError(f"{type(self).__name__}.port: not started yet (call start() first)")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8100``."""
        host = self._address[0]
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"  # reachable from this host; the bind address itself is not
        elif ":" in host:
            host = "[::1]" if host == "::" else f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def ready(self) -> bool:
        """True from start() until stop() begins."""
        return self._ready

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def _log(self) -> logging.Logger:
        return logging.getLogger(type(self).__module__)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections must not block shutdown

    def __init__(
        self,
        address: tuple[str, int],
        handler_class: type[BaseHTTPRequestHandler],
        app: BackgroundHTTPServer,
    ) -> None:
        self.app = app  # the handler reaches config, readiness and metrics through this
        self.request_queue_size = app.request_queue_size  # read by listen() in __init__
        super().__init__(address, handler_class)


class _Server6(_Server):
    address_family = socket.AF_INET6


class JSONRequestHandler(BaseHTTPRequestHandler):
    """Request handler base: timeout, logging, body reading and answers.

    Each method in ``dispatch_methods`` gets a ``do_<METHOD>`` that resets the per-request
    state and calls ``self._dispatch(method)``; methods not listed keep the standard library's
    501 answer. Subclasses override :meth:`must_close` to close the connection after an answer.
    """

    protocol_version = "HTTP/1.1"
    dispatch_methods: ClassVar[tuple[str, ...]] = ()
    json_separators: ClassVar[tuple[str, str] | None] = (",", ":")
    """``json.dumps`` separators of JSON answers; None for its default (with spaces)."""

    _body_read = False
    _responded = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for method in cls.dispatch_methods:
            if f"do_{method}" not in cls.__dict__:
                setattr(cls, f"do_{method}", _dispatcher(method))

    @property
    def app(self) -> BackgroundHTTPServer:
        return self.server.app  # type: ignore[attr-defined, no-any-return]

    def setup(self) -> None:
        super().setup()
        # Per-server socket timeout, so a stalled client cannot hold this thread forever.
        self.connection.settimeout(self.app.request_timeout_s)

    def log_message(self, format: str, *args: Any) -> None:
        # The base class writes every request to stderr; route it to logging at debug level.
        logging.getLogger(type(self).__module__).debug(
            "%s %s", self.address_string(), format % args
        )

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
        path = self.path.split("?", 1)[0]
        problem = "carries no token" if not sent else "carries a token that is not this job's"
        logging.getLogger(type(self).__module__).warning(
            "401 %s %s from %s: the request %s", method, path, self.address_string(), problem
        )
        message = (
            f"{method} {path}: unauthorized, the request {problem}; send 'Authorization: Bearer "
            f"<token>' with the job's token ({TOKEN_ENV}; on a cluster the RLJob's Secret "
            "<job>-auth, key token)"
        )
        headers = {"WWW-Authenticate": 'Bearer realm="longtail"'}
        if not self.must_close():  # close after every refusal (else send_body says so itself)
            headers["Connection"] = "close"
            self.close_connection = True
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
        body = self.rfile.read(length)
        if len(body) < length:
            fail(HTTPStatus.BAD_REQUEST, f"body ended after {len(body)} of {length} bytes")
        self._body_read = True
        return body

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
        body: bytes,
        content_type: str,
        headers: dict[str, str] | None = None,
    ) -> int:
        """Answer with ``body`` (not sent for HEAD); returns the status as an int."""
        self._responded = True
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.must_close():
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        return int(status)

    def must_close(self) -> bool:
        """Whether to close the connection after the answer being sent; default: keep it."""
        return False

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's own errors as JSON like every other answer (it would send an
        HTML page): an unsupported method is 405 naming the allowed ones, not 501."""
        self.close_connection = True  # the request may not have been read: never reuse it
        allowed = ", ".join(sorted(name[3:] for name in dir(self) if name.startswith("do_")))
        if code == HTTPStatus.NOT_IMPLEMENTED and self.command:
            text = f"{self.command} {self.path}: method not allowed here; use {allowed}"
            headers = {"Allow": allowed, "Connection": "close"}
            self.send_json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": text}, headers)
            return
        status = HTTPStatus(code)
        self.send_json(status, {"error": message or status.phrase}, {"Connection": "close"})


def _dispatcher(method: str) -> Any:
    def do(self: JSONRequestHandler) -> None:
        self._body_read, self._responded = False, False
        if self.authorized(method):
            self._dispatch(method)

    do.__name__ = f"do_{method}"
    return do
