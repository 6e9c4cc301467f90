"""One HTTP request that returns error answers instead of raising, and a free loopback port,
for tests of any server (worker or operator); imported by name (``tests/conftest.py`` puts this
directory on sys.path)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from email.message import Message


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, Message, bytes]:
    """One request; (status, headers, body) for 2xx and error answers alike."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def http_json(url: str, method: str = "GET", body: bytes | None = None, **kw) -> tuple[int, object]:
    """:func:`http` with the answer's JSON body."""
    status, _, raw = http(url, method, body, **kw)
    return status, json.loads(raw)
