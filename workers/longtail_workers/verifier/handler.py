"""The verifier's ``POST /v1/verify`` endpoint: body limits, JSON and protocol errors, scoring.

``server.py`` routes ``POST /v1/verify`` to :func:`verify` (in a thread of its own, through
``httpserver.py``, which also answers 404/405 and the probes). Error answers are JSON
``{"error": "..."}`` whose message names what is wrong and how to fix it:

- 400 malformed JSON, protocol errors (``items[3].gold: must be a string, got 5``), unknown
  reward names (the message lists the known ones);
- 411 missing Content-Length;
- 413 body over ``max_body_bytes``, batch over ``max_batch``, answer over ``max_answer_chars``;
- 500 a reward function bug or any unexpected exception (logged with its traceback).
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import TYPE_CHECKING, NoReturn

from longtail_api.protocol import ProtocolError, ProtocolLimitError, VerifyRequest
from longtail_workers.httprequest import BodyErrors, JSONRequestHandler, fail
from longtail_workers.rewards import UnknownRewardError
from longtail_workers.verifier.scoring import RewardFailedError, score_request

if TYPE_CHECKING:
    from longtail_workers.verifier.metrics import VerifierMetrics
    from longtail_workers.verifier.server import VerifierConfig

log = logging.getLogger(__name__)

_EXAMPLE = '{"items": [{"answer": "... \\\\boxed{42}", "gold": "42"}]}'
_BODY_ERRORS = BodyErrors(
    chunked="chunked Transfer-Encoding is not supported; send the body with Content-Length",
    missing="Content-Length header is required for POST",
    invalid="Content-Length: must be a non-negative integer, got {raw!r}",
    too_large="body is {length} bytes, over the limit of {limit} bytes "
    "(split the batch, or start the verifier with a larger --max-body-bytes)",
)


def verify(handler: JSONRequestHandler, config: VerifierConfig, metrics: VerifierMetrics) -> None:
    """``POST /v1/verify``: score the batch and answer its results (errors: module text)."""
    data = _parse_json(handler.read_body(config.max_body_bytes, _BODY_ERRORS))
    try:
        request = VerifyRequest.from_dict(
            data, max_items=config.max_batch, max_answer_chars=config.max_answer_chars
        )
    except ProtocolLimitError as exc:
        fail(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(exc))
    except ProtocolError as exc:
        fail(HTTPStatus.BAD_REQUEST, str(exc))
    try:
        batch = score_request(
            request, default_reward=config.default_reward, threads=config.score_threads
        )
    except UnknownRewardError as exc:
        fail(HTTPStatus.BAD_REQUEST, f"reward: {exc}")
    except RewardFailedError as exc:
        log.error("verifier: %s", exc, exc_info=exc.__cause__)
        fail(HTTPStatus.INTERNAL_SERVER_ERROR, str(exc))
    for name, results in batch.by_reward().items():
        metrics.observe_batch(name, results)
    handler.send_json(HTTPStatus.OK, batch.to_response().to_dict())


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
