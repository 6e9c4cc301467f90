"""A small HTTP client for the verifier, for the trainer and local mode.

Wraps ``POST /v1/verify`` in :meth:`VerifierClient.verify` (typed request in, typed response
out) and waits for readiness with :meth:`VerifierClient.wait_ready`, over the workers' one HTTP
client (``httpclient.py``; no retries: ``wait_ready`` polls, and the trainer's step decides what
a failed scoring call means). Error answers from the server become :class:`VerifierError`
carrying the HTTP status and the server's message.
``POST /v1/verify`` carries the job's token (``token``, by default the process's
``LONGTAIL_AUTH_TOKEN``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

from longtail_api.protocol import (
    READYZ_PATH,
    VERIFY_PATH,
    ProtocolError,
    VerifyItem,
    VerifyRequest,
    VerifyResponse,
)
from longtail_workers.httpclient import WorkerBusy, WorkerHTTPError, WorkerUnreachable, request


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
        headers = {} if body is None else {"Content-Type": "application/json"}
        try:
            answer = request(
                method, self.base_url + path, timeout_s=timeout_s or self.timeout_s, body=body,
                headers=headers, token=self.token,
            )  # fmt: skip
        except WorkerHTTPError as exc:
            raise VerifierError(exc.code, exc.text or "(empty body)") from exc
        except WorkerBusy as exc:
            raise VerifierError(WorkerBusy.code, str(exc) or "(empty body)") from exc
        except WorkerUnreachable as exc:
            raise VerifierError(
                None, f"cannot reach {self.base_url}{path}: {exc} (is the verifier running there?)"
            ) from exc
        return answer.body
