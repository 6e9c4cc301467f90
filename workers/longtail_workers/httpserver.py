"""The workers' HTTP servers: uvicorn + Starlette run from a background thread.

The verifier (``verifier/server.py``), the rollout worker's control surface (``rollout/http.py``),
the trainer (``trainer/service.py``), the drafter worker (``drafter_worker/service.py``) and the
trainer's weight server (``weights/http_sync.py``) each subclass :class:`BackgroundHTTPServer`
(bind IPv4 or IPv6, serve from a daemon thread, ``url``, ``port``, ``ready``, ``stopping``,
``stop(grace_s)`` letting in-flight requests finish, context manager) and declare their route
table in :meth:`~BackgroundHTTPServer.routes`: rows of :func:`route` (path and methods ->
endpoint function) on Starlette's router, which answers 404 (naming the endpoints) and 405
(``Allow``) itself, as JSON. :func:`probe_routes` gives every worker the same ``/healthz``,
``/readyz`` (503 with the reason while not ready; every server is not ready while stopping)
and ``/metrics``. ``ServiceRuntime`` (``runtime.py``) runs one until SIGTERM.

uvicorn serves HTTP/1.1 with keep-alive on its own event loop (h11: the header names go out
as the endpoints write them); each request's endpoint runs in a thread of its own (they may
block: torch, scoring, role switches) with a
:class:`~longtail_workers.httprequest.JSONRequestHandler`, then its
:class:`~longtail_workers.httprequest.Answer` is sent. Bodies an endpoint did not read are
discarded by uvicorn when the connection is kept; large bodies are sent in pieces, so a slow
reader holds no second copy of policy weights.

Every server runs uvicorn with :class:`~longtail_workers.headerdeadline.HeaderDeadlineProtocol`
(deadlines on a request's line and headers and on its whole body, which uvicorn lacks:
slow-loris bounds) and at most ``max_connections`` connections at once (uvicorn's
``limit_concurrency``): a request on a connection beyond them is answered 503 and the
connection closed (the workers' client retries a 5xx), so trickling clients can hold neither
unbounded request threads nor unbounded body memory (each route's body is capped by its
``read_body`` limit).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import json
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import ClassVar, Self

import uvicorn
from prometheus_client import CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from longtail_api.protocol import HEALTHZ_PATH, METRICS_PATH, READYZ_PATH
from longtail_workers.headerdeadline import (
    BODY_MIN_RATE,
    BODY_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    HeaderDeadlineProtocol,
    body_deadline_s,
)
from longtail_workers.httprequest import CLIENT_CLOSED, Answer, JSONRequestHandler

Endpoint = Callable[[JSONRequestHandler], object]
"""One row's endpoint: answers through the handler (``send_json``, ``fail``...)."""
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Prometheus' text exposition format, as ``generate_latest`` writes it."""

_PIECE = 1 << 20
"""Bodies over this go out in pieces of this size (uvicorn waits for each to drain)."""
_START_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 256
"""Connections a worker server serves at once by default (its clients open one per request)."""


def route(path: str, endpoint: Endpoint, *methods: str) -> Route:
    """One row of a route table: ``endpoint`` answers ``methods`` on ``path`` (GET brings HEAD,
    Starlette's rule; ``{name:int}`` parts land in ``handler.params``)."""
    return Route(path, functools.partial(_serve, endpoint), methods=methods)


def probe_routes(unready: Callable[[], str | None], registry: CollectorRegistry) -> list[Route]:
    """Every worker's probes: ``/healthz`` 200 while the process serves, ``/readyz`` 503 with
    ``unready()``'s reason (None: 200 ``ready``), ``/metrics`` the exposition of ``registry``."""

    def readyz(handler: JSONRequestHandler) -> None:
        why = unready()
        if why is None:
            handler.send_text(HTTPStatus.OK, "ready\n")
        else:
            handler.send_text(HTTPStatus.SERVICE_UNAVAILABLE, why + "\n")

    def metrics(handler: JSONRequestHandler) -> None:
        handler.send_body(HTTPStatus.OK, generate_latest(registry), METRICS_CONTENT_TYPE)

    return [
        route(HEALTHZ_PATH, lambda handler: handler.send_text(HTTPStatus.OK, "ok\n"), "GET"),
        route(READYZ_PATH, readyz, "GET"),
        route(METRICS_PATH, metrics, "GET"),
    ]


class BackgroundHTTPServer(abc.ABC):
    """A uvicorn server on its own event loop in a daemon thread; subclasses give ``routes``.

    A stopped server cannot be started again unless a subclass resets it (``WeightServer``).
    """

    service: ClassVar[str] = "worker"
    """What it is, for the 500 answers (``internal error in the trainer ...``)."""
    thread_name: ClassVar[str] = "http"
    """Thread name prefix; the bound port is appended."""
    request_queue_size: ClassVar[int] = 128
    """Listen backlog: connections the kernel queues before they are accepted."""
    started_log: ClassVar[str] = "listening on %s"
    """Logged at info level (with the URL) through the subclass module's logger."""
    stopped_log: ClassVar[str | None] = None
    max_connections: int = MAX_CONNECTIONS
    """Connections served at once (read by ``start``): each holds at most one request thread;
    a request on one more is answered 503 and its connection closed."""
    body_timeout_s: float = BODY_TIMEOUT_S
    """The fixed part of every request body's deadline (read by ``start``; module text of
    ``headerdeadline``)."""
    body_min_rate: float = BODY_MIN_RATE
    """Bytes per second a body must average beyond ``body_timeout_s`` (read by ``start``)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        request_timeout_s: float,
        header_timeout_s: float = HEADER_TIMEOUT_S,
    ) -> None:
        if not header_timeout_s > 0:
            raise ValueError(
                f"{type(self).__name__}: header_timeout_s={header_timeout_s!r}; must be > 0 "
                f"seconds (default {HEADER_TIMEOUT_S:g})"
            )
        self._address = (host, port)
        self.request_timeout_s = request_timeout_s
        """Idle timeout of a connection and of each wait for request body bytes, so a stalled
        client cannot hold a thread forever."""
        self.header_timeout_s = header_timeout_s
        """Seconds from a connection's start (or a later request's first byte) to its complete
        request headers; then the connection is closed (slow loris)."""
        self.auth_token: str | None = None
        """The job's token: required on every write (non-GET/HEAD) request; None: open."""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None
        self._ready = False
        self._stopping = False

    def start(self) -> Self:
        """Bind the socket and serve in a daemon thread. Raises ``OSError`` if binding fails."""
        if self._server is not None:
            raise RuntimeError(
                f"{type(self).__name__}.start(): already started (create a new server)"
            )
        if self.max_connections < 1:
            raise ValueError(
                f"{type(self).__name__}: max_connections={self.max_connections!r}; must be >= 1 "
                f"(default {MAX_CONNECTIONS})"
            )
        sock = self._bind()
        self._port = int(sock.getsockname()[1])
        refused = {404: self._refused, 405: self._refused}
        app = Starlette(routes=self.routes(), exception_handlers=refused)
        app.router.redirect_slashes = False  # /healthz/ is no endpoint: 404, not a redirect
        app.state.server = self
        config = uvicorn.Config(
            app,
            # h11 keeps header names' case (httptools lowercases them); plus a header deadline
            http=HeaderDeadlineProtocol.bound(
                self.header_timeout_s,
                self.log,
                body_timeout_s=self.body_timeout_s,
                body_min_rate=self.body_min_rate,
            ),
            loop="asyncio",
            ws="none",
            lifespan="off",
            log_config=None,  # the process configured logging already
            log_level="warning",  # uvicorn's own start/stop lines repeat ours
            access_log=False,
            server_header=False,
            proxy_headers=False,
            backlog=self.request_queue_size,
            # uvicorn refuses at len(connections) >= limit, the new connection counted
            limit_concurrency=self.max_connections + 1,
            timeout_keep_alive=max(1, math.ceil(self.request_timeout_s)),
        )
        server = self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=server.run,
            kwargs={"sockets": [sock]},
            name=f"{self.thread_name}-{self._port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                sock.close()
                self._server = None
                raise RuntimeError(
                    f"{type(self).__name__}: the HTTP server on port {self._port} did not start "
                    f"within {_START_TIMEOUT_S:.0f}s (see the log for uvicorn's error)"
                )
            time.sleep(0.005)
        self._ready = True
        self.log.info(self.started_log, self.url)
        return self

    @abc.abstractmethod
    def routes(self) -> list[Route]:
        """The server's route table (rows of :func:`route`); read once, by ``start``."""

    def unready(self) -> str | None:
        """Why ``/readyz`` answers 503, None when ready; subclasses add their own reasons."""
        return None if self._ready else "stopping"

    def body_deadline_s(self, length: int) -> float:
        """Seconds a request body of ``length`` bytes may take in all before its 408."""
        return body_deadline_s(length, self.body_timeout_s, self.body_min_rate)

    def observe(self, endpoint: str, status: int, seconds: float) -> None:  # noqa: B027 (optional hook)
        """Count one answered request (``endpoint``: its route's path, ``other`` for a 404);
        servers with request metrics override it."""

    def _bind(self) -> socket.socket:
        host, port = self._address
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(self.request_queue_size)
        except OSError:
            sock.close()
            raise
        return sock

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish (up to ``grace_s``), close the socket."""
        server = self._server
        if server is None or self._stopping:
            return
        self._ready = False
        self._stopping = True
        server.config.timeout_graceful_shutdown = max(1, math.ceil(grace_s))
        server.should_exit = True
        if self._thread is not None:
            # uvicorn notices should_exit within 0.1 s; allow for its shutdown steps too
            self._thread.join(timeout=grace_s + 2.0)
        if self.stopped_log is not None:
            self.log.info(self.stopped_log)

    def __enter__(self) -> Self:
        return self.start() if self._server is None else self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (the real one when port 0 was asked for)."""
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__}.port: not started yet (call start() first)")
        return self._port

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
    def log(self) -> logging.Logger:
        """The subclass module's logger."""
        return logging.getLogger(type(self).__module__)

    async def _refused(self, request: Request, exc: Exception) -> Response:
        """404 and 405 from the route table, as JSON naming the endpoints or the methods."""
        handler = self._handler(request)
        row = request.scope.get("route")  # set for a path matched with another method
        if isinstance(row, Route) and row.methods:
            allowed = sorted(row.methods)
            text = f"{handler.method} {handler.path}: method not allowed here; use "
            text += " or ".join(allowed)
            headers = {"Allow": ", ".join(allowed)}
            handler.send_json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": text}, headers)
        else:
            paths = ", ".join(r.path_format for r in request.app.routes if isinstance(r, Route))
            text = f"no endpoint {handler.path!r}; endpoints: {paths}"
            handler.send_json(HTTPStatus.NOT_FOUND, {"error": text})
        assert handler.answer is not None
        return self._answered(request, handler.answer, handler.answer.status, time.perf_counter())

    def _handler(self, request: Request) -> JSONRequestHandler:
        loop = asyncio.get_running_loop()
        return JSONRequestHandler(self, request, loop=loop, timeout_s=self.request_timeout_s)

    def _answered(self, request: Request, answer: Answer, status: int, started: float) -> Response:
        """Count and log the answer, then send it."""
        row = request.scope.get("route")
        seconds = time.perf_counter() - started
        self.observe(row.path_format if isinstance(row, Route) else "other", status, seconds)
        self.log.debug("%s %s %s -> %d in %.4fs", request.client, request.method,
                       request.url.path, answer.status, seconds)  # fmt: skip
        return _AnswerResponse(answer, head=request.method == "HEAD")


async def _serve(endpoint: Endpoint, request: Request) -> Response:
    """Every routed request: its endpoint runs in a thread of its own, then its answer goes out."""
    server: BackgroundHTTPServer = request.app.state.server
    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    handler = server._handler(request)
    done: asyncio.Future[int] = loop.create_future()
    worker = threading.Thread(
        target=_respond, args=(handler, endpoint, loop, done), name=f"{server.thread_name}-request"
    )
    # A daemon thread, as the standard library's servers used: an endpoint still running when
    # the process exits (past stop's grace) must not hold the exit up.
    worker.daemon = True
    worker.start()
    try:
        status = await done
    except asyncio.CancelledError:  # stop() ran past its grace: the thread is abandoned
        server.log.warning(
            "stopping: %s %s still running, answered 503", request.method, handler.path
        )
        return _AnswerResponse(_error_answer(503, "the server is stopping; retry"), head=False)
    answer = handler.answer
    if answer is None and status == CLIENT_CLOSED:  # it gave up on a client that stalled or left
        answer = _error_answer(408, "the request body did not arrive in time")
    elif answer is None:  # the thread died past run()'s own boundary (logged by threading)
        answer = _error_answer(500, "internal error; see the worker's logs")
    elif handler.close_connection:
        answer.headers["Connection"] = "close"
    return server._answered(request, answer, status, started)


def _error_answer(status: int, text: str) -> Answer:
    """A JSON ``{"error": text}`` answer that closes the connection (the body may be unread)."""
    body = json.dumps({"error": text}, separators=(",", ":")).encode("utf-8")
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    return Answer(status, {**headers, "Connection": "close"}, body)


def _respond(
    handler: JSONRequestHandler,
    endpoint: Endpoint,
    loop: asyncio.AbstractEventLoop,
    done: asyncio.Future[int],
) -> None:
    """A request's thread: run the endpoint, hand the status to count back to the event loop."""
    status = int(HTTPStatus.INTERNAL_SERVER_ERROR)
    try:
        status = handler.run(endpoint)
    finally:
        with contextlib.suppress(RuntimeError):  # the loop is gone (stopped past its grace)
            loop.call_soon_threadsafe(_settle, done, status)


def _settle(done: asyncio.Future[int], status: int) -> None:
    if not done.done():  # cancelled when the server stopped past its grace
        done.set_result(status)


class _AnswerResponse(Response):
    """Sends an :class:`Answer` as written: header names unchanged, large bodies in pieces."""

    def __init__(self, answer: Answer, *, head: bool) -> None:  # no Response state: own __call__
        self.answer, self.head = answer, head

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        a = self.answer
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in a.headers.items()]
        await send({"type": "http.response.start", "status": a.status, "headers": raw})
        body = b"" if self.head else a.body
        if len(body) <= _PIECE:
            await send({"type": "http.response.body", "body": body})
            return
        view = memoryview(body)
        for start in range(0, len(body), _PIECE):
            more = start + _PIECE < len(body)
            piece = view[start : start + _PIECE]  # a view: the body is never copied
            await send({"type": "http.response.body", "body": piece, "more_body": more})
