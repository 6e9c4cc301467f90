"""The verifier's HTTP server: health, readiness, Prometheus metrics and ``POST /v1/verify``.

:class:`VerifierServer` is the importable way to run a verifier: ``service.main`` (the
``longtail worker verifier`` entry point) starts one and waits for a signal; tests and local
mode start one on a free loopback port in a background thread::

    with VerifierServer(VerifierConfig(port=0)) as server:
        urllib.request.urlopen(server.url + "/healthz")

Built on the standard library's ``ThreadingHTTPServer`` (one thread per connection, HTTP/1.1
keep-alive). Every request is untrusted: bodies are size-capped before they are read, JSON and
protocol errors become 4xx answers with a JSON ``{"error": ...}`` body naming the problem, and
an unexpected exception becomes a logged 500; none of them stops the server.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass
from http.server import ThreadingHTTPServer

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


class VerifierServer:
    """A verifier HTTP server running in a background thread."""

    def __init__(self, config: VerifierConfig | None = None) -> None:
        self.config = config if config is not None else VerifierConfig()
        self.metrics = VerifierMetrics()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._ready = False
        self._stopping = False
        self._inflight = 0
        self._inflight_lock = threading.Condition()

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> VerifierServer:
        """Bind the socket and serve in a daemon thread. Raises ``OSError`` if binding fails."""
        if self._httpd is not None:
            raise RuntimeError("VerifierServer.start(): already started (create a new server)")
        server_cls = _HTTPServer6 if ":" in self.config.host else _HTTPServer
        self._httpd = server_cls((self.config.host, self.config.port), app=self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},  # also the latency of stop()
            name=f"verifier-http-{self.port}",
            daemon=True,
        )
        self._thread.start()
        self._ready = True
        log.info("verifier listening on %s", self.url)
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish (up to ``grace_s``), close the socket."""
        httpd = self._httpd
        if httpd is None or self._stopping:
            return
        self._ready = False
        self._stopping = True
        httpd.shutdown()  # returns once serve_forever has left its loop
        with self._inflight_lock:
            finished = self._inflight_lock.wait_for(lambda: self._inflight == 0, timeout=grace_s)
        if not finished:
            log.warning("verifier stopping with %d request(s) still in flight", self._inflight)
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=grace_s)
        log.info("verifier stopped")

    def __enter__(self) -> VerifierServer:
        return self.start() if self._httpd is None else self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (the real one when the config asked for port 0)."""
        if self._httpd is None:
            raise RuntimeError("VerifierServer.port: not started yet (call start() first)")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8100``."""
        host = self.config.host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"  # reachable from this host; the bind address itself is not
        elif ":" in host:
            host = "[::1]" if host == "::" else f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def stopping(self) -> bool:
        return self._stopping

    # --- request accounting (called by the handler) ---------------------------------------

    def request_started(self) -> None:
        with self._inflight_lock:
            self._inflight += 1

    def request_finished(self) -> None:
        with self._inflight_lock:
            self._inflight -= 1
            self._inflight_lock.notify_all()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections must not block shutdown
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], *, app: VerifierServer) -> None:
        self.app = app  # the handler reaches config, readiness and metrics through this
        super().__init__(address, VerifierHandler)


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6
