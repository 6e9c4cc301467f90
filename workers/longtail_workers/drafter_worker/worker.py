"""The dedicated drafter worker's loop: one drafter window per completed RL step.

``drafter_worker/service.py`` builds a :class:`DrafterWorker` and runs :meth:`DrafterWorker.run`
in a thread; its HTTP surface reads :meth:`DrafterWorker.status`. One turn of the loop:

1. wait for a step newer than the last one trained on (``GET /v1/samples/latest`` on the
   trainer, :class:`~longtail_workers.wire.samples.SampleFeed`; bounded, with backoff);
2. load the policy version published after that step from the trainer's weight server (the
   same :class:`~longtail_workers.weights.sync.WeightSource` a rollout worker pulls with), so
   the hidden states are the current policy's;
3. one window of the shared :class:`~longtail_workers.spot.sequences.SequenceWindows` (capture,
   then the window cycle every harvested worker runs, ``spot/cycle.py``: train on top of the
   newest published drafter, quality gate), then submit the window's drafter
   to the trainer's drafter exchange as this worker's candidate; the step driver merges it with
   the rollout workers' candidates at the end of the step being rolled out, exactly as theirs.

A candidate is only worth sending while its base is still the newest version (the merge takes
the candidates of the newest version only): when a version was published during the window, the
candidate is not sent and the next window starts from that version. Failures of the trainer's
endpoints (unreachable, restarting, a policy version evicted) are logged, shown in the status
and retried at the next turn after a backoff; a crash of the spot trainer itself ends the loop
(:attr:`DrafterWorker.fatal`), and the process exits 1 so that it is restarted.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from longtail_api import metrics as names
from longtail_api.workerapi import CandidateSummary, DrafterWorkerState, DrafterWorkerStatus
from longtail_workers.drafter.registry import Candidate
from longtail_workers.spot.sequences import SequenceWindows
from longtail_workers.spot.trainer import SpotTrainingError
from longtail_workers.verifier.metrics import counter_from_spec, gauge_from_spec
from longtail_workers.weights.sync import WeightSource, WeightSyncError
from longtail_workers.wire.samples import SampleFeed, StepSamples

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopTimes:
    """Every wait of the loop, in seconds."""

    step_wait_s: float = 600.0
    """Longest wait for the trainer to answer a samples poll before it is reported lost."""
    window_s: float = 600.0
    """Longest a training window may run before it is stopped (between optimizer steps)."""
    stop_s: float = 30.0
    """Longest wait for a stop asked for to take effect."""
    backoff_s: float = 1.0
    """First pause after a failed turn (doubled per failure in a row, up to ``max_backoff_s``)."""
    max_backoff_s: float = 30.0
    """Longest pause after failed turns."""


class DrafterWorker:
    """Trains the drafter on each completed step's answers (see the module text)."""

    def __init__(
        self,
        windows: SequenceWindows,
        feed: SampleFeed,
        weights: WeightSource,
        *,
        name: str,
        times: LoopTimes | None = None,
    ) -> None:
        self.windows, self.feed, self.weights, self.name = windows, feed, weights, name
        self.times = times or LoopTimes()
        self.stop = threading.Event()
        self.step = 0
        """The newest RL step whose answers were trained on (0: none yet)."""
        self.policy_version: int | None = None
        """The policy version loaded (None: the one loaded at start, not yet synced)."""
        self.windows_run = 0
        self.outcomes: dict[str, int] = {"submitted": 0, "dropped": 0, "stale": 0, "empty": 0}
        """Windows by outcome: candidate submitted, dropped by the quality gate, not sent
        because a newer version was published during it, nothing long enough to train on."""
        self.metrics_registry = CollectorRegistry()
        """Served on ``GET /metrics`` (``longtail_api.metrics.DRAFTER_WORKER_METRICS``)."""
        self._windows_total = counter_from_spec(
            names.DRAFTER_WORKER_WINDOWS_TOTAL, self.metrics_registry
        )
        self._step_gauge = gauge_from_spec(names.DRAFTER_WORKER_STEP, self.metrics_registry)
        self.last_error: str | None = None
        self.fatal: str | None = None
        """Set when the loop ended on a crash of the spot trainer (the process exits 1)."""
        self.state: DrafterWorkerState = "waiting"

    # --- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        """Turns until :attr:`stop` is set or the spot trainer crashes."""
        failures = 0
        while not self.stop.is_set():
            try:
                self.turn()
                failures = 0
            except SpotTrainingError as exc:
                self.fatal = self.last_error = f"drafter training crashed: {exc}"
                log.error("%s: %s; stopping (see the traceback above)", self.name, self.fatal)
                self.stop.set()
                return
            except (TimeoutError, OSError, WeightSyncError, ValueError) as exc:
                # DrafterExchangeError is an OSError: the trainer's endpoints, retried later.
                failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                pause = min(self.times.max_backoff_s, self.times.backoff_s * 2 ** (failures - 1))
                log.warning("%s: drafter window failed (%s); next try in %.1fs",
                            self.name, self.last_error, pause)  # fmt: skip
                self.stop.wait(pause)

    def turn(self) -> Candidate | None:
        """Wait for the next step's answers and run one window on them."""
        self.state = "waiting"
        samples = self.feed.wait_newer(self.step, self.times.step_wait_s, self.stop)
        if samples is None:
            return None  # stopped, or no new step yet while the trainer answers
        self.state = "training"
        try:
            return self.window(samples)
        finally:
            self.state = "waiting"

    def window(self, samples: StepSamples) -> Candidate | None:
        """One window on ``samples``: policy sync, capture, training, gate, submission."""
        self.ensure_policy(samples.policy_version)
        w = self.windows
        w.set_samples(samples.sequences, samples.step)
        w.capture(samples.policy_version, self.stop)
        self.step = samples.step  # captured: a failure below does not need these answers again
        self._step_gauge.set(self.step)
        base = w.cycle.sync_base()
        if self.stop.is_set():
            return None
        self.windows_run += 1
        if w.start() == 0:
            self._count("empty")
            log.info("%s: step %d has no answer long enough to train on", self.name, self.step)
            return None
        # close() stops the spot trainer, which ends this wait early on SIGTERM.
        finished = w.spot.wait_stopped(self.times.window_s)
        if (not finished or self.stop.is_set()) and not w.spot.stop(self.times.stop_s):
            raise TimeoutError(
                f"the spot trainer did not stop within {self.times.stop_s:g}s after its "
                f"window of {self.times.window_s:g}s"
            )
        w.spot.raise_if_failed()
        if self.stop.is_set():
            return None
        return self._submit(base, samples.policy_version)

    def _submit(self, base: int | None, policy_version: int) -> Candidate | None:
        latest = self.windows.registry.latest_version()
        if latest != base:
            # The merge only takes candidates of the newest version; train again from it.
            self._count("stale")
            log.info("%s: drafter version %s was published during the window (base %s); "
                     "candidate not sent", self.name, latest, base)  # fmt: skip
            return None
        refused = self.windows.cycle.stale_refused
        cand = self.windows.cycle.submit(self.name, policy_version, self.name)
        if cand is None and self.windows.cycle.stale_refused > refused:
            self._count("stale")  # published between the check above and the upload (409)
        else:
            self._count("submitted" if cand is not None else "dropped")
        return cand

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] += 1
        self._windows_total.labels(outcome=outcome).inc()

    def ensure_policy(self, version: int) -> None:
        """Load policy ``version`` (the weight source verifies it) unless it is loaded."""
        if version == self.policy_version:
            return
        got = self.weights.load_into(self.windows.model, version)
        self.policy_version = got
        log.info("%s: policy version %d loaded", self.name, got)

    def close(self) -> None:
        """Stop the loop and any window (the process is exiting); nothing is submitted."""
        self.stop.set()
        self.windows.spot.stop(self.times.stop_s)

    # --- status -------------------------------------------------------------------------------

    def status(self) -> DrafterWorkerStatus:
        """The body of ``GET /v1/status``."""
        cand = self.windows.cycle.last_candidate
        return DrafterWorkerStatus(
            worker=self.name,
            state="failed" if self.fatal else self.state,
            step=self.step,
            policy_version=self.policy_version,
            drafter_base_version=self.windows.spot.base_version,
            windows=self.windows_run,
            outcomes=dict(self.outcomes),
            last_candidate=None
            if cand is None
            else CandidateSummary(cand.base_version, cand.tokens, cand.steps),
            last_error=self.last_error or self.feed.last_error,
            drafter_training=self.windows.status(),
        )
