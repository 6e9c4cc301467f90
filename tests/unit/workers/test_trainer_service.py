"""The trainer's HTTP surface (``trainer/service.py``): its ``/readyz`` tells the truth.

Ready only once the policy is loaded and the weight server serves (the step driver exists),
not while it fails or stops; ``/healthz`` answers as long as the process does (liveness). The
operator's pods probe ``/readyz``, so a trainer pod is Ready, and the RLJob Running, only then.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

from httpcall import http

from longtail_workers.trainer.service import TrainerApp


def test_readyz_is_503_until_the_model_is_loaded_and_while_stopping_or_failed() -> None:
    app = TrainerApp("127.0.0.1", 0).start()
    stop = threading.Event()
    app.stop_requested = stop
    try:
        code, _, text = http(app.url + "/readyz")
        assert code == 503 and b"loading the policy" in text
        assert http(app.url + "/healthz")[::2] == (200, b"ok\n")  # alive while it loads
        app.driver = SimpleNamespace()  # type: ignore[assignment]  # built: model and weights
        assert http(app.url + "/readyz")[::2] == (200, b"ready\n")
        stop.set()  # SIGTERM: it checkpoints and stops
        assert http(app.url + "/readyz")[::2] == (503, b"stopping\n")
        stop.clear()
        app.failed = "RuntimeError: CUDA error"
        code, _, text = http(app.url + "/readyz")
        assert code == 503 and b"training failed: RuntimeError: CUDA error" in text
    finally:
        app.stop()
