"""The workers' one HTTP client: every call one Longtail process makes to another.

Used by the trainer's rollout dispatch (``trainer/dispatch.py``), the drafter exchange's rollout
side (``drafter/exchange.py``), the policy weight pull (``weights/http_sync.py``), the verifier
client (``verifier/client.py``), the drafter worker's samples feed (``wire/samples.py``), the
local coordinator and ``longtail run`` (``local/``). The server side of the same calls is
``httpserver.py``.

:func:`request` is the one call: a timeout on every request (httpx), bounded retries with
exponential backoff and jitter (tenacity) only for transient failures (connection refused or
reset, timeouts, other transport errors, HTTP 5xx), the job's token on writes, and the server's
error text in every error. A 409 is :class:`WorkerBusy` (a worker in another role); any other
error status is :class:`WorkerHTTPError`; an unreachable server is :class:`WorkerUnreachable`.
With ``into`` a successful body is read from the socket straight into the caller's buffer
(``http.client``'s ``readinto``: the policy weight pull writes each piece where its tensors will
be read from) instead of a new ``bytes``.
:meth:`Response.check_sha256` compares a downloaded body with the sha256 its server sent.
:func:`http_json` is the JSON form the coordinators use.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import tenacity

from longtail_api.auth import is_write
from longtail_workers.auth import auth_headers
from longtail_workers.httprequest import error_text

log = logging.getLogger(__name__)


class HTTPCallError(OSError):
    """A call failed for good (after its retries); the message names method, URL and cause."""

    def __init__(self, message: str, *, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts
        """How many times the request was sent."""


class WorkerHTTPError(HTTPCallError):
    """The server answered an HTTP error status ``code`` (its error text is ``text``)."""

    def __init__(self, code: int, message: str, *, text: str = "", attempts: int = 1) -> None:
        super().__init__(message, attempts=attempts)
        self.code = code
        self.text = text


class WorkerUnreachable(HTTPCallError):
    """No HTTP answer: connection refused or reset, a timeout, a broken response."""


class WorkerBusy(RuntimeError):
    """HTTP 409 from a worker: it is not in the rollout role right now."""

    code = 409


class ChecksumMismatch(OSError):
    """A downloaded body does not hash to the sha256 its server advertised; do not use it."""

    def __init__(self, url: str, header: str, expected: str, actual: str) -> None:
        super().__init__(
            f"{url}: the body hashes to sha256 {actual}, but {header} says "
            f"{expected or '(missing)'}; a corrupted transfer"
        )
        self.expected, self.actual = expected, actual


@dataclass(frozen=True)
class Retry:
    """How a call is repeated after a transient failure (the default: it is not)."""

    retries: int = 0
    """Extra attempts after the first (0: one attempt)."""
    backoff_s: float = 0.2
    """Wait before the first retry; doubles with each further one."""
    max_backoff_s: float = 10.0
    """Longest wait between two attempts."""

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(
                f"need retries >= 0, backoff_s >= 0, max_backoff_s >= 0; got {self.retries}, "
                f"{self.backoff_s}, {self.max_backoff_s}"
            )

    def wait_s(self, state: tenacity.RetryCallState) -> float:
        """Exponential backoff with jitter: workers that failed together do not retry together."""
        delay = min(self.max_backoff_s, self.backoff_s * 2.0 ** (state.attempt_number - 1))
        return delay * random.uniform(0.5, 1.0)


NO_RETRY = Retry()


def checked_base_url(url: str, what: str) -> str:
    """``url`` without a trailing ``/``, checked once for every client: ``what`` names the
    option in the error (e.g. ``drafters URL``)."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{what} {url!r}: expected http://HOST:PORT")
    return url.rstrip("/")


@dataclass(frozen=True)
class Response:
    """A successful (2xx) or accepted answer, read completely."""

    status: int
    """The HTTP status."""
    headers: Mapping[str, str]
    """Response headers (case-insensitive lookup)."""
    body: bytes
    """The whole body."""
    url: str
    """The URL asked."""

    def json(self) -> Any:
        """The body parsed as JSON (``ValueError`` when it is not)."""
        return json.loads(self.body)

    def check_sha256(self, header: str, expected: str | None = None) -> str:
        """Raise :class:`ChecksumMismatch` unless the body hashes to ``header``'s value (and to
        ``expected``, a manifest's, when given); returns the body's sha256."""
        advertised = (self.headers.get(header) or "").strip().lower()
        want = advertised if expected is None else expected
        actual = hashlib.sha256(self.body).hexdigest()
        if actual != want or advertised != want:
            shown = want if advertised == want else f"{want} (header: {advertised or 'missing'})"
            raise ChecksumMismatch(self.url, header, shown, actual)
        return actual


class _Transient(Exception):
    """One attempt failed in a way asking again may fix."""

    def __init__(self, last: str, code: int | None = None, text: str = "") -> None:
        super().__init__(last)
        self.last, self.code, self.text = last, code, text


_client: httpx.Client | None = None
_client_lock = threading.Lock()


def _shared_client() -> httpx.Client:
    """One client per process (httpx clients are thread-safe). No idle keep-alive connections:
    the workers' servers give a thread to each open connection."""
    global _client
    with _client_lock:
        if _client is None:
            _client = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))
        return _client


def request(
    method: str,
    url: str,
    *,
    timeout_s: float,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    retry: Retry = NO_RETRY,
    token: str | None = None,
    accept: tuple[int, ...] = (),
    into: memoryview | None = None,
) -> Response:
    """Send one request, retrying transient failures as ``retry`` says.

    Returns 2xx answers and those whose status is in ``accept`` (e.g. 404 for "not published").
    A write (not GET/HEAD) carries ``token``, by default this process's job token. With
    ``into``, a 2xx body must be exactly ``len(into)`` bytes and is written there (the
    returned ``body`` is empty); a body of another length is a :class:`WorkerUnreachable`.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    sent = dict(headers or {})
    if is_write(method):
        sent.update(auth_headers(token))

    tries = 0

    def attempt() -> Response:
        nonlocal tries
        tries += 1
        try:
            if into is not None:
                return _stream_into(into, method, url, body, sent, timeout_s, accept)
            answer = _shared_client().request(
                method, url, content=body, headers=sent, timeout=timeout_s
            )
        except httpx.TransportError as exc:
            raise _Transient(f"{type(exc).__name__}: {exc or 'no detail'}") from exc
        return _answer(answer, method, url, accept)

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(retry.retries + 1),
        wait=retry.wait_s,
        retry=tenacity.retry_if_exception_type(_Transient),
        before_sleep=lambda state: _log_retry(method, url, retry, state),
        reraise=True,
    )
    try:
        return retrying(attempt)
    except _Transient as exc:
        message = (
            f"{method} {url} failed after {tries} attempt(s); last error: {exc.last}"
            if retry.retries
            else f"{method} {url}: {exc.last}"
        )
        if exc.code is not None:
            raise WorkerHTTPError(exc.code, message, text=exc.text, attempts=tries) from exc
        raise WorkerUnreachable(message, attempts=tries) from exc


def _answer(answer: httpx.Response, method: str, url: str, accept: tuple[int, ...]) -> Response:
    """A read answer as a :class:`Response`, or the error its status means."""
    return _judge(answer.status_code, answer.headers, answer.content, method, url, accept)


def _judge(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    method: str,
    url: str,
    accept: tuple[int, ...],
) -> Response:
    if 200 <= status < 300 or status in accept:
        return Response(status, headers, body, url)
    text = error_text(body)[:500]
    if status >= 500:
        raise _Transient(f"HTTP {status}: {text}", status, text)
    if status == 409:
        raise WorkerBusy(text)
    raise WorkerHTTPError(status, f"{method} {url}: HTTP {status}: {text}", text=text)


def _stream_into(
    into: memoryview,
    method: str,
    url: str,
    body: bytes | None,
    headers: dict[str, str],
    timeout_s: float,
    accept: tuple[int, ...],
) -> Response:
    """One attempt whose 2xx body is written into ``into`` (see :func:`request`).

    The body goes from the socket straight into ``into`` (``http.client``'s ``readinto``):
    httpx hands a body out in 64 KiB ``bytes`` chunks that are then copied, which made a policy
    weight pull CPU-bound at a third of the rate (figures: docs/performance.md). Same timeout
    (per socket operation), same errors, a new connection per request as the shared client.
    """
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname or "", parts.port, timeout=timeout_s)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request(method, target, body=body, headers=headers)
        answer = conn.getresponse()
        if not 200 <= answer.status < 300:
            refused = (answer.status, httpx.Headers(answer.getheaders()), answer.read())
        else:
            refused = None
            done = 0
            while done < len(into):
                n = answer.readinto(into[done:])
                if not n:
                    break
                done += n
            if done != len(into) or answer.read(1):
                raise _Transient(f"body of {done}+ bytes, expected {len(into)}")
    except (OSError, http.client.HTTPException) as exc:
        raise _Transient(f"{type(exc).__name__}: {exc or 'no detail'}") from exc
    finally:
        conn.close()
    if refused is not None:
        return _judge(*refused, method, url, accept)
    return Response(answer.status, httpx.Headers(answer.getheaders()), b"", url)


def _log_retry(method: str, url: str, retry: Retry, state: tenacity.RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    log.warning(
        "%s %s failed (attempt %d/%d): %s",
        method, url, state.attempt_number, retry.retries + 1, exc,
    )  # fmt: skip


def http_json(
    url: str, body: dict[str, Any] | None, timeout_s: float, method: str, token: str | None = None
) -> Any:
    """One JSON request, no retries; raises :class:`WorkerBusy` on 409 and the ``OSError``
    family otherwise (:class:`WorkerHTTPError`, :class:`WorkerUnreachable`).

    A write (not GET/HEAD) carries ``token``, by default this process's job token."""
    data = None if body is None else json.dumps(body).encode()
    headers = {} if data is None else {"Content-Type": "application/json"}
    return request(method, url, timeout_s=timeout_s, body=data, headers=headers, token=token).json()
