"""The workers' one HTTP client: JSON calls to other Longtail processes.

Used by the trainer's rollout dispatch (``trainer/dispatch.py``), the local coordinator and
``longtail run`` (``local/``) and the drafter worker's samples client (``wire/samples.py``). The
server side of the same calls is ``httpserver.py``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from longtail_api.auth import is_write
from longtail_workers.auth import auth_headers
from longtail_workers.httpserver import error_text


class WorkerBusy(RuntimeError):
    """HTTP 409 from a worker: it is not in the rollout role right now."""


class WorkerHTTPError(OSError):
    """A worker answered an HTTP error status ``code`` (its error text is in the message)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def http_json(
    url: str, body: dict[str, Any] | None, timeout_s: float, method: str, token: str | None = None
) -> Any:
    """One JSON request; raises :class:`WorkerBusy` on 409 and ``OSError`` family otherwise.

    A write (not GET/HEAD) carries ``token``, by default this process's job token."""
    data = None if body is None else json.dumps(body).encode()
    headers = auth_headers(token) if is_write(method) else {}
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        text = error_text(exc.read())[:500]
        if exc.code == 409:
            raise WorkerBusy(text) from exc
        raise WorkerHTTPError(exc.code, f"HTTP {exc.code} from {url}: {text}") from exc
