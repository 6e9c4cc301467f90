"""Telling a hung rollout worker from a busy one while it holds a shard of the rollout.

:class:`~longtail_workers.trainer.dispatch.RolloutPool` starts one :class:`HealthProbe` per
generate call it has in flight and closes it when the call ends. A worker that died refuses
or resets the call itself and is re-dispatched at once; one that hangs (a stopped process, a
frozen node, a partitioned network) accepts the connection or not but answers nothing, and the
call alone would wait for the rollout timeout (``--rollout-timeout``, 900 s). The probe asks
the worker's ``GET /healthz`` meanwhile, a route its HTTP server answers from its own threads
whatever the engine does (a decode, a policy load, drafter training), with a short timeout;
after :attr:`Liveness.misses` probes in a row get no answer, i.e. ``rollout.unresponsiveSeconds``
of silence, :attr:`HealthProbe.verdict` says why and the pool treats the worker exactly as a
dead one: marked down, its shard re-dispatched, revived at a later step start once it answers.

Any HTTP answer counts as alive (the process serves); a refused connection, a reset or a
timeout is a miss. A miss is counted only once its probe's whole timeout has passed, so a
refused probe does not outrun the call's own error, and a probe's timeout is measured on the
socket: a trainer too busy to read an answer in time does not count the worker as silent.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from longtail_api.protocol import HEALTHZ_PATH
from longtail_workers.httpclient import WorkerBusy, WorkerHTTPError, request


@dataclass(frozen=True)
class Liveness:
    """How long a worker holding a shard may stay silent (``rollout.unresponsiveSeconds``)."""

    unresponsive_s: float = 6.0
    """Seconds of unanswered health probes after which the worker is declared down."""
    misses: int = 3
    """Probes in a row that must go unanswered (each given ``unresponsive_s / misses``)."""
    period_s: float = 1.0
    """Time between the starts of two probes that were answered (a hung worker is declared
    down at most this much later than ``unresponsive_s`` after it stopped answering)."""

    def __post_init__(self) -> None:
        if not self.unresponsive_s > 0 or self.misses < 1 or not self.period_s > 0:
            raise ValueError(
                f"Liveness(unresponsive_s={self.unresponsive_s}, misses={self.misses}, "
                f"period_s={self.period_s}): each must be > 0 (misses an integer >= 1); "
                "set spec.rollout.unresponsiveSeconds to a positive number of seconds"
            )

    @property
    def probe_timeout_s(self) -> float:
        return self.unresponsive_s / self.misses


class HealthProbe:
    """Probes ``base_url``'s ``/healthz`` from a daemon thread until :meth:`close` or a verdict."""

    def __init__(self, name: str, base_url: str, liveness: Liveness) -> None:
        self.name, self.url, self.liveness = name, base_url + HEALTHZ_PATH, liveness
        self._verdict: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"probe-{name}", daemon=True)
        self._thread.start()

    @property
    def verdict(self) -> str | None:
        """None while the worker answers; why it is declared hung once it stopped answering."""
        return self._verdict

    def close(self) -> None:
        """Stop probing (the thread ends after the probe in progress, if any)."""
        self._stop.set()

    def _run(self) -> None:
        cfg, missed, last = self.liveness, 0, ""
        timeout = cfg.probe_timeout_s
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                request("GET", self.url, timeout_s=timeout)
                answered = True
            except (WorkerHTTPError, WorkerBusy):  # an error status is an answer: it serves
                answered = True
            except OSError as exc:  # refused, reset or timed out: no answer
                answered, last = False, f"{type(exc).__name__}: {exc}"
            if answered:
                missed = 0
                self._stop.wait(max(0.0, cfg.period_s - (time.monotonic() - started)))
                continue
            missed += 1
            if missed >= cfg.misses:
                self._verdict = (
                    f"unresponsive: {missed} health probes in a row got no answer within "
                    f"{timeout:g}s each (spec.rollout.unresponsiveSeconds "
                    f"{cfg.unresponsive_s:g}); last: {last}"
                )
                return
            self._stop.wait(max(0.0, timeout - (time.monotonic() - started)))
