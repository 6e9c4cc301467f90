"""The verifier's HTTP server: health, readiness, Prometheus metrics and ``POST /v1/verify``.

:class:`VerifierServer` is the importable way to run a verifier: ``service.main`` (the
``longtail worker verifier`` entry point) starts one and waits for a signal; tests and local
mode start one on a free loopback port in a background thread::

    with VerifierServer(VerifierConfig(port=0)) as server:
        urllib.request.urlopen(server.url + "/healthz")

Built on :class:`~longtail_workers.httpserver.BackgroundHTTPServer` (the standard library's
``ThreadingHTTPServer``: one thread per connection, HTTP/1.1 keep-alive). Every request is
untrusted: bodies are size-capped before they are read, JSON and protocol errors become 4xx
answers with a JSON ``{"error": ...}`` body naming the problem, and an unexpected exception
becomes a logged 500; none of them stops the server.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from longtail_workers.httpserver import BackgroundHTTPServer
from longtail_workers.verifier.handler import VerifierHandler
from longtail_workers.verifier.metrics import VerifierMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifierConfig:
    """Settings of one verifier server (the ``longtail worker verifier`` flags)."""

    host: str = "127.0.0.1"
    port: int = 8100
    """TCP port; 0 picks a free one (read it back from :attr:`VerifierServer.port`)."""
    max_batch: int = 4096
    """Most items per request; larger batches get 413."""
    max_answer_chars: int = 65536
    """Longest ``answer`` or ``gold`` string, in characters; longer ones get 413."""
    max_body_bytes: int = 64 * 1024 * 1024
    """Largest request body accepted; checked against Content-Length before reading."""
    default_reward: str = "math"
    """Reward used when a request names none."""
    request_timeout_s: float = 30.0
    """Socket timeout per connection, so a stalled client cannot hold a thread forever."""


class VerifierServer(BackgroundHTTPServer):
    """A verifier HTTP server running in a background thread."""

    handler_class = VerifierHandler
    thread_name = "verifier-http"
    started_log = "verifier listening on %s"
    stopped_log = "verifier stopped"

    def __init__(self, config: VerifierConfig | None = None) -> None:
        self.config = config if config is not None else VerifierConfig()
        super().__init__(
            self.config.host, self.config.port, request_timeout_s=self.config.request_timeout_s
        )
        self.metrics = VerifierMetrics()
        self._inflight = 0
        self._inflight_lock = threading.Condition()

    def _wait_idle(self, grace_s: float) -> None:
        """Let in-flight requests finish (up to ``grace_s``) before the socket closes."""
        with self._inflight_lock:
            finished = self._inflight_lock.wait_for(lambda: self._inflight == 0, timeout=grace_s)
        if not finished:
            log.warning("verifier stopping with %d request(s) still in flight", self._inflight)

    # --- request accounting (called by the handler) ---------------------------------------

    def request_started(self) -> None:
        with self._inflight_lock:
            self._inflight += 1

    def request_finished(self) -> None:
        with self._inflight_lock:
            self._inflight -= 1
            self._inflight_lock.notify_all()
