"""The verifier's per-request HTTP handler: routing, body limits, JSON errors, metrics.

``server.py`` hands every request to a :class:`VerifierHandler` (in a thread of its own). The
handler reaches its :class:`~longtail_workers.verifier.server.VerifierServer` through
``self.app`` for the config, readiness and metrics. Error answers are JSON
``{"error": "..."}`` whose message names what is wrong and how to fix it:

- 400 malformed JSON, protocol errors (``items[3].gold: must be a string, got 5``), unknown
  reward names (the message lists the known ones);
- 404 unknown path, 405 wrong method (with an ``Allow`` header), 411 missing Content-Length;
- 413 body over ``max_body_bytes``, batch over ``max_batch``, answer over ``max_answer_chars``;
- 500 a reward function bug or any unexpected exception (logged with its traceback).

When an error is answered before the request body was read, a small body is discarded by the
server and the connection kept; after a large one the connection is closed instead, so unread
bytes are never worth the bandwidth.
"""

from __future__ import annotations

import json
import logging
import time
from http import HTTPStatus
from typing import TYPE_CHECKING, NoReturn

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
from longtail_workers.httprequest import (
    BodyErrors,
    JSONRequestHandler,
    RequestError,
    check_route,
    fail,
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
"""Unread request bodies up to this size are discarded and the connection kept (see handler)."""

_EXAMPLE = '{"items": [{"answer": "... \\\\boxed{42}", "gold": "42"}]}'
_BODY_ERRORS = BodyErrors(
    chunked="chunked Transfer-Encoding is not supported; send the body with Content-Length",
    missing="Content-Length header is required for POST",
    invalid="Content-Length: must be a non-negative integer, got {raw!r}",
    too_large="body is {length} bytes, over the limit of {limit} bytes "
    "(split the batch, or start the verifier with a larger --max-body-bytes)",
)


class VerifierHandler(JSONRequestHandler):
    """Handles one request."""

    app: VerifierServer
    dispatch_methods = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

    # --- dispatch ---------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        started = time.perf_counter()
        path = self.path
        endpoint = path if path in ROUTES else "other"
        status = int(HTTPStatus.INTERNAL_SERVER_ERROR)
        try:
            try:
                status = self._route(method, path)
            except RequestError as exc:
                body = ErrorResponse(exc.message).to_dict()
                status = self.send_json(exc.status, body, exc.headers)
        except (ConnectionError, TimeoutError) as exc:
            # The client hung up or stalled mid-request: nothing to answer, drop the connection.
            log.info("verifier: %s %s: client connection lost: %s", method, path, exc)
            self.close_connection = True
            status = CLIENT_CLOSED
        except Exception:  # HTTP boundary: log it, answer 500, keep serving
            log.exception("verifier: unexpected error handling %s %s", method, path)
            status = self._internal_error()
        finally:
            self.app.metrics.observe_request(endpoint, status, time.perf_counter() - started)

    def _internal_error(self) -> int:
        body = ErrorResponse("internal error in the verifier; see its logs for the traceback")
        return self.send_json(HTTPStatus.INTERNAL_SERVER_ERROR, body.to_dict())

    def _route(self, method: str, path: str) -> int:
        check_route(ROUTES, method, path)
        if path == HEALTHZ_PATH:
            return self.send_text(HTTPStatus.OK, "ok\n")
        if path == READYZ_PATH:
            if self.app.ready:
                return self.send_text(HTTPStatus.OK, "ready\n")
            return self.send_text(HTTPStatus.SERVICE_UNAVAILABLE, "not ready: shutting down\n")
        if path == METRICS_PATH:
            return self.send_body(HTTPStatus.OK, self.app.metrics.render(), CONTENT_TYPE)
        return self._verify()

    # --- POST /v1/verify --------------------------------------------------------------------

    def _verify(self) -> int:
        config = self.app.config
        data = _parse_json(self.read_body(config.max_body_bytes, _BODY_ERRORS))
        try:
            request = VerifyRequest.from_dict(
                data, max_items=config.max_batch, max_answer_chars=config.max_answer_chars
            )
        except ProtocolLimitError as exc:
            fail(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(exc))
        except ProtocolError as exc:
            fail(HTTPStatus.BAD_REQUEST, str(exc))
        try:
            batch = score_request(request, default_reward=config.default_reward)
        except UnknownRewardError as exc:
            fail(HTTPStatus.BAD_REQUEST, f"reward: {exc}")
        except RewardFailedError as exc:
            log.error("verifier: %s", exc, exc_info=exc.__cause__)
            fail(HTTPStatus.INTERNAL_SERVER_ERROR, str(exc))
        self.app.metrics.observe_batch(batch.reward, batch.results)
        return self.send_json(HTTPStatus.OK, batch.to_response().to_dict())

    # --- responses --------------------------------------------------------------------------

    def must_close(self) -> bool:
        """Close after this answer if the server is stopping or a large, chunked or unparsable
        request body is left unread.

        Answering an error without reading the body and then closing makes the kernel reset the
        connection, and the client may see the reset instead of our answer. Bodies up to
        DRAIN_LIMIT_BYTES are therefore left to the server to read and drop; larger ones are
        not worth the bandwidth, and the connection is closed instead.
        """
        unread = self.unread_body()
        return self.app.stopping or unread is None or unread > DRAIN_LIMIT_BYTES


def _parse_json(body: bytes) -> object:
    """Decode a JSON body; any problem becomes a 400 naming it."""
    if not body.strip():
        fail(HTTPStatus.BAD_REQUEST, f"request body is empty; send a JSON object like {_EXAMPLE}")
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        fail(
            HTTPStatus.BAD_REQUEST,
            f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
            f"(send a JSON object like {_EXAMPLE})",
        )
    except UnicodeDecodeError as exc:
        fail(HTTPStatus.BAD_REQUEST, f"request body is not valid UTF-8 JSON: {exc.reason}")
    except RecursionError:
        fail(HTTPStatus.BAD_REQUEST, "malformed JSON: nested too deeply")
    except ValueError as exc:  # NaN/Infinity constants, integers over Python's digit limit
        fail(HTTPStatus.BAD_REQUEST, f"malformed JSON: {exc}")


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON (send a finite number)")
