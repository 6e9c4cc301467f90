"""The verifier's per-request HTTP handler: routing, body limits, JSON errors, metrics.

``server.py`` hands every connection to :class:`VerifierHandler` (one thread per connection).
The handler reaches its :class:`~longtail_workers.verifier.server.VerifierServer` through
``self.server.app`` for the config, readiness and metrics. Error answers are JSON
``{"error": "..."}`` whose message names what is wrong and how to fix it:

- 400 malformed JSON, protocol errors (``items[3].gold: must be a string, got 5``), unknown
  reward names (the message lists the known ones);
- 404 unknown path, 405 wrong method (with an ``Allow`` header), 411 missing Content-Length;
- 413 body over ``max_body_bytes``, batch over ``max_batch``, answer over ``max_answer_chars``;
- 500 a reward function bug or any unexpected exception (logged with its traceback).

When an error is answered before the request body was read, a small body is drained first and
the connection kept; a large one is not read and the connection is closed, so unread bytes can
never be mistaken for the next keep-alive request.
"""

from __future__ import annotations

import json
import logging
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit

from longtail_api.protocol import (
    HEALTHZ_PATH,
    METRICS_PATH,
    READYZ_PATH,
    VERIFY_PATH,
    ErrorResponse,
    ProtocolError,
    ProtocolLimitError,
    VerifyRequest,
)
from longtail_workers.rewards import UnknownRewardError
from longtail_workers.verifier.metrics import CONTENT_TYPE
from longtail_workers.verifier.scoring import RewardFailedError, score_request

if TYPE_CHECKING:
    from longtail_workers.verifier.server import VerifierServer

log = logging.getLogger(__name__)

ROUTES: dict[str, tuple[str, ...]] = {
    HEALTHZ_PATH: ("GET", "HEAD"),
    READYZ_PATH: ("GET", "HEAD"),
    METRICS_PATH: ("GET", "HEAD"),
    VERIFY_PATH: ("POST",),
}
"""Path -> allowed methods. Other paths get 404 and are counted as endpoint ``other``."""

CLIENT_CLOSED = 499
"""Status recorded in metrics when the client disconnected or stalled (nginx's convention)."""

DRAIN_LIMIT_BYTES = 1 << 20
"""Unread request bodies up to this size are drained before an error answer (see handler)."""

_EXAMPLE = '{"items": [{"answer": "... \\\\boxed{42}", "gold": "42"}]}'


class RequestError(Exception):
    """An error answer decided while handling a request."""

    def __init__(
        self, status: HTTPStatus, message: str, *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def _fail(status: HTTPStatus, message: str, **kwargs: Any) -> NoReturn:
    raise RequestError(status, message, **kwargs)


class VerifierHandler(BaseHTTPRequestHandler):
    """Handles the requests of one connection."""

    protocol_version = "HTTP/1.1"
    server_version = "longtail-verifier"
    sys_version = ""

    _method = "GET"
    _body_read = False
    _responded = False

    @property
    def app(self) -> VerifierServer:
        return self.server.app  # type: ignore[attr-defined, no-any-return]

    def setup(self) -> None:
        super().setup()
        # Per-server socket timeout, so a stalled client cannot hold this thread forever.
        self.connection.settimeout(self.app.config.request_timeout_s)

    def log_message(self, format: str, *args: Any) -> None:
        # The base class writes every request to stderr; route it to logging at debug level.
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_OPTIONS(self) -> None:
        self._dispatch("OPTIONS")

    # --- dispatch ---------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        started = time.perf_counter()
        self._method, self._body_read, self._responded = method, False, False
        path = urlsplit(self.path).path
        endpoint = path if path in ROUTES else "other"
        status = int(HTTPStatus.INTERNAL_SERVER_ERROR)
        self.app.request_started()
        try:
            try:
                status = self._route(method, path)
            except RequestError as exc:
                body = ErrorResponse(exc.message).to_dict()
                status = self._send_json(exc.status, body, exc.headers)
        except (ConnectionError, TimeoutError) as exc:
            # The client hung up or stalled mid-request: nothing to answer, drop the connection.
            log.info("verifier: %s %s: client connection lost: %s", method, path, exc)
            self.close_connection = True
            status = CLIENT_CLOSED
        except Exception:  # HTTP boundary: log it, answer 500, keep serving
            log.exception("verifier: unexpected error handling %s %s", method, path)
            status = self._internal_error()
        finally:
            self.app.request_finished()
            self.app.metrics.observe_request(endpoint, status, time.perf_counter() - started)

    def _internal_error(self) -> int:
        if self._responded:  # headers already went out: the only safe thing is to hang up
            self.close_connection = True
            return int(HTTPStatus.INTERNAL_SERVER_ERROR)
        body = ErrorResponse("internal error in the verifier; see its logs for the traceback")
        try:
            return self._send_json(HTTPStatus.INTERNAL_SERVER_ERROR, body.to_dict())
        except OSError:
            self.close_connection = True
            return int(HTTPStatus.INTERNAL_SERVER_ERROR)

    def _route(self, method: str, path: str) -> int:
        allowed = ROUTES.get(path)
        if allowed is None:
            _fail(HTTPStatus.NOT_FOUND, f"no endpoint {path!r}; endpoints: {', '.join(ROUTES)}")
        if method not in allowed:
            _fail(
                HTTPStatus.METHOD_NOT_ALLOWED,
                f"{method} is not allowed on {path}; use {' or '.join(allowed)}",
                headers={"Allow": ", ".join(allowed)},
            )
        if path == HEALTHZ_PATH:
            return self._send_text(HTTPStatus.OK, "ok\n")
        if path == READYZ_PATH:
            if self.app.ready:
                return self._send_text(HTTPStatus.OK, "ready\n")
            return self._send_text(HTTPStatus.SERVICE_UNAVAILABLE, "not ready: shutting down\n")
        if path == METRICS_PATH:
            return self._send(HTTPStatus.OK, self.app.metrics.render(), CONTENT_TYPE)
        return self._verify()

    # --- POST /v1/verify --------------------------------------------------------------------

    def _verify(self) -> int:
        config = self.app.config
        data = _parse_json(self._read_body())
        try:
            request = VerifyRequest.from_dict(
                data, max_items=config.max_batch, max_answer_chars=config.max_answer_chars
            )
        except ProtocolLimitError as exc:
            _fail(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(exc))
        except ProtocolError as exc:
            _fail(HTTPStatus.BAD_REQUEST, str(exc))
        try:
            batch = score_request(request, default_reward=config.default_reward)
        except UnknownRewardError as exc:
            _fail(HTTPStatus.BAD_REQUEST, f"reward: {exc}")
        except RewardFailedError as exc:
            log.error("verifier: %s", exc, exc_info=exc.__cause__)
            _fail(HTTPStatus.INTERNAL_SERVER_ERROR, str(exc))
        self.app.metrics.observe_batch(batch.reward, batch.results)
        return self._send_json(HTTPStatus.OK, batch.to_response().to_dict())

    def _read_body(self) -> bytes:
        """Read the request body after checking Content-Length against the server's cap."""
        if "Transfer-Encoding" in self.headers:
            _fail(
                HTTPStatus.LENGTH_REQUIRED,
                "chunked Transfer-Encoding is not supported; send the body with Content-Length",
            )
        raw = self.headers.get("Content-Length")
        if raw is None:
            _fail(HTTPStatus.LENGTH_REQUIRED, "Content-Length header is required for POST")
        raw = raw.strip()
        if not (raw.isascii() and raw.isdigit()):
            _fail(
                HTTPStatus.BAD_REQUEST,
                f"Content-Length: must be a non-negative integer, got {raw[:40]!r}",
            )
        length, limit = int(raw), self.app.config.max_body_bytes
        if length > limit:
            _fail(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"body is {length} bytes, over the limit of {limit} bytes "
                f"(split the batch, or start the verifier with a larger --max-body-bytes)",
            )
        body = self.rfile.read(length)
        if len(body) < length:
            _fail(HTTPStatus.BAD_REQUEST, f"body ended after {len(body)} of {length} bytes")
        self._body_read = True
        return body

    # --- responses --------------------------------------------------------------------------

    def _send_text(self, status: HTTPStatus, text: str) -> int:
        return self._send(status, text.encode("utf-8"), "text/plain; charset=utf-8")

    def _send_json(
        self, status: HTTPStatus, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> int:
        body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        return self._send(status, body, "application/json", headers)

    def _send(
        self,
        status: HTTPStatus,
        body: bytes,
        content_type: str,
        headers: dict[str, str] | None = None,
    ) -> int:
        self._responded = True
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self._must_close():
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self._method != "HEAD":
            self.wfile.write(body)
        return int(status)

    def _must_close(self) -> bool:
        """Close after this answer if the server is stopping or an unread body is left over."""
        return self.app.stopping or not self._drain_unread_body()

    def _drain_unread_body(self) -> bool:
        """Discard a small unread request body; False if the connection cannot be reused.

        Answering an error without reading the body and then closing makes the kernel reset the
        connection, and the client may see the reset instead of our answer. Bodies up to
        DRAIN_LIMIT_BYTES are therefore read and dropped; larger, chunked or unparsable ones
        are not worth the bandwidth, and the connection is closed instead.
        """
        if self._body_read:
            return True
        if "Transfer-Encoding" in self.headers:
            return False
        raw = (self.headers.get("Content-Length") or "0").strip()
        if not (raw.isascii() and raw.isdigit()) or int(raw) > DRAIN_LIMIT_BYTES:
            return False
        remaining = int(raw)
        while remaining > 0:
            chunk = self.rfile.read(min(remaining, 65536))
            if not chunk:  # the client sent less than it announced
                return False
            remaining -= len(chunk)
        self._body_read = True
        return True


def _parse_json(body: bytes) -> object:
    """Decode a JSON body; any problem becomes a 400 naming it."""
    if not body.strip():
        _fail(HTTPStatus.BAD_REQUEST, f"request body is empty; send a JSON object like {_EXAMPLE}")
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        _fail(
            HTTPStatus.BAD_REQUEST,
            f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
            f"(send a JSON object like {_EXAMPLE})",
        )
    except UnicodeDecodeError as exc:
        _fail(HTTPStatus.BAD_REQUEST, f"request body is not valid UTF-8 JSON: {exc.reason}")
    except RecursionError:
        _fail(HTTPStatus.BAD_REQUEST, "malformed JSON: nested too deeply")
    except ValueError as exc:  # NaN/Infinity constants, integers over Python's digit limit
        _fail(HTTPStatus.BAD_REQUEST, f"malformed JSON: {exc}")


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON (send a finite number)")
