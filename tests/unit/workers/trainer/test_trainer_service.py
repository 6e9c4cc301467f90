"""The trainer's HTTP surface (``trainer/service.py``): its ``/readyz`` tells the truth.

Ready only once the policy is loaded and the weight server serves (the step driver exists),
not while it fails or stops; ``/healthz`` answers as long as the process does (liveness). The
operator's pods probe ``/readyz``, so a trainer pod is Ready, and the RLJob Running, only then.
A ``POST /v1/checkpoint`` arriving while a checkpoint is written gets that one: never two writes.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from httpcall import http, http_json

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


class _SlowDriver:
    """A step driver whose checkpoint takes a while and counts its writes."""

    def __init__(self) -> None:
        self.state = SimpleNamespace(step=7)
        self.writes = 0

    def checkpoint(self) -> str:
        self.writes += 1
        time.sleep(1.5)
        return f"/checkpoints/step-{self.state.step}-write-{self.writes}"


def test_a_checkpoint_request_during_a_write_gets_that_checkpoint_not_a_second_write() -> None:
    """Issue #48, item 3: the operator that takes over mid-checkpoint asks again; the trainer
    answers it with the checkpoint being written instead of writing a second one."""
    app = TrainerApp("127.0.0.1", 0).start()
    driver = _SlowDriver()
    app.driver = driver  # type: ignore[assignment]
    try:
        url, body = app.url + "/v1/checkpoint", json.dumps({"reason": "suspend"}).encode()
        headers = {"Content-Type": "application/json"}
        with ThreadPoolExecutor(3) as pool:
            asks = [pool.submit(http_json, url, "POST", body, headers=headers) for _ in range(3)]
            answers = [f.result(timeout=30) for f in asks]
        assert answers == [(200, {"step": 7, "location": "/checkpoints/step-7-write-1"})] * 3
        assert driver.writes == 1
        # Once it is on disk, a new request writes a new one.
        again = http_json(url, "POST", body, headers=headers)
        assert again == (200, {"step": 7, "location": "/checkpoints/step-7-write-2"})
    finally:
        app.stop()
