"""The trainer's HTTP surface (``trainer/service.py``): its ``/readyz`` tells the truth.

Ready only once the policy is loaded and the weight server serves (the step driver exists),
not while it fails or stops; ``/healthz`` answers as long as the process does (liveness). The
operator's pods probe ``/readyz``, so a trainer pod is Ready, and the RLJob Running, only then.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from types import SimpleNamespace

from longtail_workers.trainer.service import TrainerApp


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_readyz_is_503_until_the_model_is_loaded_and_while_stopping_or_failed() -> None:
    app = TrainerApp("127.0.0.1", 0).start()
    stop = threading.Event()
    app.stop_requested = stop
    try:
        code, text = get(app.url + "/readyz")
        assert code == 503 and "loading the policy" in text
        assert get(app.url + "/healthz") == (200, "ok\n")  # alive while it loads
        app.driver = SimpleNamespace()  # type: ignore[assignment]  # built: model and weights
        assert get(app.url + "/readyz") == (200, "ready\n")
        stop.set()  # SIGTERM: it checkpoints and stops
        assert get(app.url + "/readyz") == (503, "stopping\n")
        stop.clear()
        app.failed = "RuntimeError: CUDA error"
        code, text = get(app.url + "/readyz")
        assert code == 503 and "training failed: RuntimeError: CUDA error" in text
    finally:
        app.stop()
