"""The verifier's HTTP server: health, readiness, Prometheus metrics and ``POST /v1/verify``.

:class:`VerifierServer` is the importable way to run a verifier: ``service.main`` (the
``longtail worker verifier`` entry point) starts one and waits for a signal; tests and local
mode start one on a free loopback port in a background thread::

    with VerifierServer(VerifierConfig(port=0)) as server:
        urllib.request.urlopen(server.url + "/healthz")

Built on :class:`~longtail_workers.httpserver.BackgroundHTTPServer` (uvicorn + Starlette,
HTTP/1.1 keep-alive, each request handled in a thread of its own; ``stop`` lets in-flight
requests finish within its grace). Every request is untrusted: bodies are size-capped before
they are read, JSON and protocol errors become 4xx answers with a JSON ``{"error": ...}`` body
naming the problem, and an unexpected exception becomes a logged 500; none of them stops the
server.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.routing import Route

from longtail_api.protocol import VERIFY_PATH
from longtail_workers.httpserver import BackgroundHTTPServer, probe_routes, route
from longtail_workers.verifier.handler import verify
from longtail_workers.verifier.metrics import VerifierMetrics


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
    score_threads: int = 1
    """Items of one request scored at once (the ``math`` reward's checker processes)."""
    request_timeout_s: float = 30.0
    """Idle timeout of a connection and of each wait for body bytes, so a stalled client cannot
    hold a thread forever."""


class VerifierServer(BackgroundHTTPServer):
    """A verifier HTTP server running in a background thread."""

    service = "verifier"
    thread_name = "verifier-http"
    started_log = "verifier listening on %s"
    stopped_log = "verifier stopped"

    def __init__(self, config: VerifierConfig | None = None) -> None:
        self.config = config if config is not None else VerifierConfig()
        super().__init__(
            self.config.host, self.config.port, request_timeout_s=self.config.request_timeout_s
        )
        self.metrics = VerifierMetrics()

    def routes(self) -> list[Route]:
        return [
            *probe_routes(self.unready, self.metrics.registry),
            route(VERIFY_PATH, lambda handler: verify(handler, self.config, self.metrics), "POST"),
        ]

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        self.metrics.observe_request(endpoint, status, seconds)
