"""A small HTTP client for the verifier, for the trainer and local mode.

Wraps ``POST /v1/verify`` in :meth:`VerifierClient.verify` (typed request in, typed response
out) and waits for readiness with :meth:`VerifierClient.wait_ready`. Standard library only
(``urllib``), so it adds no dependency to whatever process uses it. Error answers from the
server become :class:`VerifierError` carrying the HTTP status and the server's message.
``POST /v1/verify`` carries the job's token (``token``, by default the process's
``LONGTAIL_AUTH_TOKEN``).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterable

from longtail_api.auth import is_write
from longtail_api.protocol import (
    READYZ_PATH,
    VERIFY_PATH,
    ErrorResponse,
    ProtocolError,
    VerifyItem,
    VerifyRequest,
    VerifyResponse,
)
from longtail_workers.auth import auth_headers


class VerifierError(RuntimeError):
    """The verifier answered with an error, or could not be reached (``status`` is ``None``)."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(
            f"verifier: HTTP {status}: {message}" if status else f"verifier: {message}"
        )
        self.status = status
        self.message = message


class VerifierClient:
    """Talks to one verifier at ``base_url`` (e.g. ``http://127.0.0.1:8100``)."""

    def __init__(
        self, base_url: str, *, timeout_s: float = 120.0, token: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.token = token

    def verify(
        self,
        items: Iterable[VerifyItem | tuple[str, str]],
        *,
        reward: str | None = None,
        format_weight: float = 0.0,
    ) -> VerifyResponse:
        """Score ``(answer, gold)`` pairs; results come back in the same order."""
        request = VerifyRequest(
            items=tuple(i if isinstance(i, VerifyItem) else VerifyItem(*i) for i in items),
            reward=reward,
            format_weight=format_weight,
        )
        body = json.dumps(request.to_dict()).encode("utf-8")
        data = self._call("POST", VERIFY_PATH, body)
        try:
            return VerifyResponse.from_dict(json.loads(data))
        except (ValueError, ProtocolError) as exc:
            raise VerifierError(200, f"unreadable response from {self.base_url}: {exc}") from exc

    def wait_ready(self, timeout_s: float = 30.0, poll_s: float = 0.1) -> None:
        """Block until ``GET /readyz`` answers 200; ``TimeoutError`` naming the last problem."""
        deadline = time.monotonic() + timeout_s
        last = "no attempt made"
        while time.monotonic() < deadline:
            try:
                self._call("GET", READYZ_PATH, None, timeout_s=min(poll_s * 10, self.timeout_s))
                return
            except VerifierError as exc:
                last = str(exc)
            time.sleep(poll_s)
        raise TimeoutError(
            f"verifier at {self.base_url} not ready after {timeout_s:g}s; last error: {last}"
        )

    def _call(
        self, method: str, path: str, body: bytes | None, *, timeout_s: float | None = None
    ) -> bytes:
        headers = auth_headers(self.token) if is_write(method) else {}
        url = self.base_url + path
        req = urllib.request.Request(url, data=body, method=method, headers=headers)
        if body is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                data: bytes = resp.read()
                return data
        except urllib.error.HTTPError as exc:
            raise VerifierError(exc.code, _error_message(exc.read())) from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise VerifierError(
                None,
                f"cannot reach {self.base_url}{path}: {reason} (is the verifier running there?)",
            ) from exc


def _error_message(body: bytes) -> str:
    """The ``error`` field of an error body, or the raw body when it is not one."""
    try:
        return ErrorResponse.from_dict(json.loads(body)).error
    except (ValueError, ProtocolError):
        return body.decode("utf-8", errors="replace")[:500] or "(empty body)"
