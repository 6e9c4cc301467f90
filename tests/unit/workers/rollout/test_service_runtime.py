"""``ServiceRuntime``: stop signals are handled before a service announces its URL."""

from __future__ import annotations

import signal
import threading
from typing import Any

from longtail_workers.runtime import ServiceRuntime


class _FakeServer:
    url = "http://127.0.0.1:1"

    def __init__(self) -> None:
        self.handler_at_start: Any = None
        self.stopped = False

    def start(self) -> _FakeServer:
        self.handler_at_start = signal.getsignal(signal.SIGTERM)
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        self.stopped = True


def test_sigterm_is_handled_before_the_url_is_printed(capsys: Any) -> None:
    server, stop = _FakeServer(), threading.Event()
    stop.set()  # serve_forever returns right after starting and announcing
    before = signal.getsignal(signal.SIGTERM)
    assert ServiceRuntime(server, "listening: ", stop).serve_forever() == 0
    assert server.handler_at_start not in (signal.SIG_DFL, before)
    assert server.stopped and signal.getsignal(signal.SIGTERM) == before
    assert capsys.readouterr().out == "listening: http://127.0.0.1:1\n"
