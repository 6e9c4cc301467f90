"""Keeps experiment trackers off the training path: a thread and a bounded buffer per backend.

:class:`Tracker` is what callers hold: the trainer (rank 0, ``trainer/service.py``) builds one
with :func:`open_tracker`, logs the spec once and every step's row, and closes it with the
run's outcome; ``longtail run`` (``local/run.py``) does the same at the end for the report.
Every call only appends to the buffers and returns. Each backend's :class:`BackendSink`
thread sends its records in order; a record that fails (a tracker down or erroring) stays at
the head of its buffer and is tried again with a growing pause, so what was buffered is sent
once the tracker answers; one it refuses (:class:`~.backends.TrackerRefused`) is dropped. Both
are logged and counted (``observer``: the trainer's Prometheus metrics) and shown by
:meth:`Tracker.failing` (the trainer status). A full buffer drops its oldest record. Closing
waits, at most ``flush_timeout_s``, for the buffers to drain.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from longtail_api.spec import RLJobSpec
from longtail_api.steprow import StepRow
from longtail_api.tracking import MLFLOW_URI_ENV
from longtail_workers.tracking.backends import (
    Backend,
    MlflowBackend,
    RunIds,
    TensorBoardBackend,
    TrackerRefused,
    WandbBackend,
)
from longtail_workers.tracking.figures import spec_params, step_figures

log = logging.getLogger(__name__)

RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0
STEPS_PER_SEND = 32
"""Buffered steps sent in one call once a tracker is back (one request each would take as
long to catch up as the outage lasted)."""


@dataclass
class Record:
    """One thing to send: the parameters, one step's figures, a file or directory, the end."""

    kind: Literal["params", "metrics", "artifact", "finish"]
    step: int = 0
    data: Mapping[str, Any] = field(default_factory=dict)
    path: Path | None = None
    name: str = ""


class TrackingObserver:
    """Hooks the trainer's Prometheus metrics into the sinks (the default counts nothing)."""

    def failed(self, backend: str) -> None:
        """An attempt to send a record failed."""

    def dropped(self, backend: str) -> None:
        """A record was dropped (a full buffer or a refusal)."""

    def buffered(self, backend: str, records: int) -> None:
        """The backend's buffer now holds ``records``."""


class BackendSink:
    """A backend's buffer (at most ``capacity`` records) and the thread that drains it."""

    def __init__(self, backend: Backend, capacity: int, observer: TrackingObserver) -> None:
        self.backend, self.capacity, self.observer = backend, capacity, observer
        self._queue: collections.deque[Record] = collections.deque()
        self._cond = threading.Condition()
        self._closing = False
        self._opened = False
        self._solo = 0
        """Records still to send one at a time (a batch was refused: find which record)."""
        self.sent = 0
        self.failures = 0
        self.dropped = 0
        self.last_error: str | None = None
        """The last attempt's error; None once a record goes through."""
        self._thread = threading.Thread(
            target=self._loop, name=f"tracking-{backend.name}", daemon=True
        )
        self._thread.start()

    def put(self, record: Record) -> None:
        """Buffer ``record`` (never blocks); a full buffer drops its oldest record."""
        with self._cond:
            if self._closing:
                return
            if len(self._queue) >= self.capacity:
                self._queue.popleft()
                self._drop("buffer full (tracking.bufferRecords)")
            self._queue.append(record)
            self.observer.buffered(self.backend.name, len(self._queue))
            self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def close(self, timeout_s: float) -> bool:
        """Stop taking records and wait up to ``timeout_s`` for the buffer to drain; True
        when everything was sent."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout_s)
        left = self.pending()
        if left:
            log.warning("tracking %s: %d record(s) not sent after %.0f s (last error: %s)",
                        self.backend.name, left, timeout_s, self.last_error)  # fmt: skip
        return left == 0 and not self._thread.is_alive()

    def _drop(self, why: str) -> None:
        self.dropped += 1
        self.observer.dropped(self.backend.name)
        log.warning("tracking %s: a record was dropped: %s", self.backend.name, why)

    def _loop(self) -> None:
        pause = RETRY_FIRST_S
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return  # closing, all sent
                batch = self._head()
            try:
                self._send(batch)
            except TrackerRefused as exc:
                self._failed(exc)
                if len(batch) > 1:  # find the one refused: send these one at a time
                    self._solo = len(batch)
                    continue
                with self._cond:
                    self._queue.popleft()
                self._drop(f"refused: {exc}")
                continue
            # A tracker library may raise anything (its HTTP client's errors, its own, a
            # service process that died): each is counted and the record retried.
            except Exception as exc:  # noqa: BLE001
                self._failed(exc)
                with self._cond:
                    self._cond.wait(pause)  # a close wakes it to try once more, then gives up
                pause = min(pause * 2, RETRY_MAX_S)
                continue
            pause = RETRY_FIRST_S
            with self._cond:
                for _ in batch:
                    self._queue.popleft()
                self.observer.buffered(self.backend.name, len(self._queue))
            self.sent += len(batch)
            self.last_error = None

    def _failed(self, exc: BaseException) -> None:
        first = self.last_error is None
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]
        self.observer.failed(self.backend.name)
        # Logged when it starts failing and then every tenth attempt, not at every retry.
        if first or self.failures % 10 == 0:
            log.warning("tracking %s: failed (%d so far, %d record(s) buffered): %s",
                        self.backend.name, self.failures, self.pending(),
                        self.last_error)  # fmt: skip

    def _head(self) -> list[Record]:
        """The record at the head, with the metrics records right after it (up to
        :data:`STEPS_PER_SEND`) when it is one; called holding the lock."""
        batch = [self._queue[0]]
        if self._solo:
            self._solo -= 1
        elif batch[0].kind == "metrics":
            for record in itertools.islice(self._queue, 1, STEPS_PER_SEND):
                if record.kind != "metrics":
                    break
                batch.append(record)
        return batch

    def _send(self, batch: list[Record]) -> None:
        b, record = self.backend, batch[0]
        if not self._opened:
            b.open()
            self._opened = True
        if record.kind == "params":
            b.log_params(dict(record.data))
        elif record.kind == "metrics":
            b.log_metrics([(r.step, dict(r.data)) for r in batch])
        elif record.kind == "artifact" and record.path is not None:
            b.log_artifact(record.path, record.name)
        elif record.kind == "finish":
            b.finish(str(record.data.get("outcome", "complete")))


class Tracker:
    """The sinks of one job's backends (none: every call does nothing)."""

    def __init__(self, sinks: list[BackendSink]) -> None:
        self.sinks = sinks

    def _put(self, record: Record) -> None:
        for sink in self.sinks:
            sink.put(record)

    def params(self, spec: RLJobSpec) -> None:
        self._put(Record("params", data=spec_params(spec)))

    def step(self, row: StepRow) -> None:
        self._put(Record("metrics", row.step, step_figures(row)))

    def figures(self, step: int, figures: Mapping[str, float]) -> None:
        if figures:
            self._put(Record("metrics", step, dict(figures)))

    def artifact(self, path: Path, name: str = "") -> None:
        if path.exists():
            self._put(Record("artifact", path=path, name=name))

    def failing(self) -> dict[str, str]:
        """Backends whose last attempt failed: the error and what waits (trainer status)."""
        return {
            s.backend.name: f"{s.last_error} ({s.pending()} record(s) buffered)"
            for s in self.sinks
            if s.last_error is not None
        }

    def close(self, outcome: str, timeout_s: float = 60.0) -> bool:
        """End every tracker run with ``outcome`` (complete, stopped, failed), waiting at most
        ``timeout_s`` in all; True when everything was sent."""
        self._put(Record("finish", data={"outcome": outcome}))
        deadline = time.monotonic() + timeout_s
        return all([s.close(max(0.0, deadline - time.monotonic())) for s in self.sinks])


def run_name(run_dir: Path) -> str:
    """The tracker run's name: the RLJob's name in a pod, else the run directory's."""
    from longtail_api.podenv import JOB_NAME

    return os.environ.get(JOB_NAME) or run_dir.resolve().name


def open_tracker(
    spec: RLJobSpec,
    run_dir: Path,
    state_dir: Path,
    *,
    purge_step: int | None = None,
    observer: TrackingObserver | None = None,
    env: Mapping[str, str] = os.environ,
) -> Tracker:
    """The job's :class:`Tracker`; ``state_dir`` keeps the run ids (the checkpoint directory),
    ``purge_step`` (a resume) hides TensorBoard events from that step on."""
    t, ids, name = spec.tracking, RunIds(state_dir), run_name(run_dir)
    backends: list[Backend] = []
    if t.tensorboard is not None:
        log_dir = Path(t.tensorboard.log_dir or run_dir / "tensorboard")
        backends.append(TensorBoardBackend(log_dir, purge_step))
    if t.mlflow is not None:
        uri = t.mlflow.tracking_uri or env.get(MLFLOW_URI_ENV)
        if uri:
            backends.append(MlflowBackend(uri, t.mlflow.experiment, name, ids))
        else:
            log.warning(
                "tracking mlflow: no tracking.mlflow.trackingUri and no %s in the "
                "environment: MLflow tracking is off for this run",
                MLFLOW_URI_ENV,
            )
    if t.wandb is not None:
        w = t.wandb
        backends.append(WandbBackend(w.project, w.entity, w.mode, run_dir, name, ids))
    observer = observer or TrackingObserver()
    sinks = [BackendSink(b, t.buffer_records, observer) for b in backends]
    if sinks:
        log.info("tracking to %s", ", ".join(b.name for b in backends))
    return Tracker(sinks)
