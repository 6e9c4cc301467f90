"""SIGTERM/SIGINT as a stop request, for every worker service's main loop.

The trainer and rollout services (through ``runtime.ServiceRuntime``) and the verifier service
call :func:`install_stop_signals` before they announce their URL. Kept free of torch so the
verifier, which never loads a model, can use it. Installing before the announcement matters:
whoever reads the URL may send SIGTERM at once (Kubernetes, ``longtail run``, tests), and a
signal that arrives before the handler kills the process with the default action instead of
letting it stop cleanly.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger(__name__)


def install_stop_signals(stop: threading.Event) -> Callable[[], None]:
    """SIGTERM/SIGINT set ``stop``; returns a function restoring the previous handlers.

    Off the main thread (where Python cannot install handlers, e.g. a service started inside a
    test) it does nothing and the caller's ``stop`` event is the only way to stop.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
