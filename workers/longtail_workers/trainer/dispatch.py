"""Spreading one step's generation requests over the rollout workers, surviving lost workers.

The step driver (``trainer/driver.py``) calls :meth:`RolloutPool.run` once per rollout (and per
greedy evaluation). Requests are split round-robin into one shard per live worker (answers of
one prompt land on different workers, so long-tailed prompts spread out) and each shard is sent
as one ``POST /v1/generate``. A shard whose worker fails (connection refused or reset: the
process died; HTTP 5xx; the call's timeout) or stops answering while it holds the shard (its
``/healthz`` unanswered for ``rollout.unresponsiveSeconds``: a stopped process or a frozen
node, ``trainer/liveness.py``; the call is abandoned and a late answer dropped) is queued again
and handed to the next free live worker; the failed worker is marked down (the step's
``failed_workers``, its requests counted in ``redispatched``) and skipped until a health check
at a later step start finds it back. A 409 (a worker in drafter-train ends its window itself
before it generates, ``spot/harvested.py``; 409 when that window did not stop in time) retries
the shard, the worker staying free. Any other 4xx means the call itself is wrong (a job
configuration error, e.g. ``algorithm.maxNewTokens`` beyond the model's context; the worker's
message names the field): it would fail on every worker, so the step fails at once with
:class:`RolloutRejected` carrying that message, and no worker is marked down. The step fails
with :class:`RolloutFailed`, naming every worker's last error, when no live worker is left or a
shard failed ``max_attempts`` times; it never waits longer than ``timeout_s`` per call.
``stop`` (Ctrl-C) aborts with :class:`RolloutAborted`. Every call goes through
``httpclient.py`` without HTTP-level retries (re-dispatching a shard is the retry); generate
calls carry the job's token (``longtail_workers.auth``). The pool never changes a worker's role
(the harvest loop is their one writer): before the step's drafter merge,
:meth:`RolloutPool.wait_windows_ended` waits, bounded, until no worker reports
``drafter-train`` any more, i.e. until the loop has ended the windows of the rollout and each
worker has submitted its candidate.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any

from longtail_api.harvest import DRAFTER_TRAIN, Activity
from longtail_api.protocol import HEALTHZ_PATH, ProtocolError
from longtail_api.wirecodec import from_wire, to_wire
from longtail_api.workerapi import STATUS_PATH, RolloutWorkerStatus
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.httpclient import WorkerBusy, WorkerHTTPError, http_json, request
from longtail_workers.shards import shard_round_robin
from longtail_workers.trainer.liveness import HealthProbe, Liveness
from longtail_workers.wire.rollout import GENERATE_PATH, GenerateCall, GenerateReply, Sample

log = logging.getLogger(__name__)


class RolloutFailed(RuntimeError):
    """The rollout could not complete (message says which workers failed and why)."""


class RolloutAborted(RuntimeError):
    """The rollout was abandoned because a stop was requested."""


class RolloutRejected(RolloutFailed):
    """A worker refused a generate call as invalid (HTTP 4xx other than 409): a job
    configuration error, not a lost worker; the message is the worker's, naming the field."""


@dataclass
class RolloutOutcome:
    """Samples in request order plus what the dispatch observed."""

    samples: list[Sample]
    replies: list[GenerateReply]
    seconds: float
    first_done_s: float
    """When the first worker ran out of work (start of the tail), from the start."""
    redispatched: int = 0
    failed_workers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Call:
    """One generate call in flight: its worker, shard, earlier attempts and health probe."""

    name: str
    shard: list[int]
    attempts: int
    probe: HealthProbe


class RolloutPool:
    """The rollout workers of a job, by name -> base URL."""

    def __init__(
        self,
        workers: dict[str, str],
        *,
        timeout_s: float = 900.0,
        max_attempts: int = 3,
        on_assign: Callable[[str, bool], None] | None = None,
        token: str | None = None,
        liveness: Liveness | None = None,
    ) -> None:
        if not workers:
            raise ValueError("RolloutPool needs at least one rollout worker URL")
        self.workers = dict(workers)
        self.down: dict[str, str] = {}
        self.timeout_s, self.max_attempts = timeout_s, max_attempts
        self.on_assign = on_assign or (lambda name, busy: None)
        self.token = token
        """The job's token for generate calls (None: the process's)."""
        self.liveness = liveness or Liveness()
        """When a worker holding a shard counts as hung (``rollout.unresponsiveSeconds``)."""
        self._lock = threading.Lock()

    @property
    def live(self) -> list[str]:
        return [w for w in self.workers if w not in self.down]

    def revive(self, timeout_s: float = 2.0) -> None:
        """Health-check workers marked down; a healthy one takes work again."""
        for name in list(self.down):
            try:
                request("GET", self.workers[name] + HEALTHZ_PATH, timeout_s=timeout_s)
            except (OSError, WorkerBusy):
                continue
            log.info("rollout worker %s answers again; back in the pool", name)
            self.down.pop(name, None)

    def wait_windows_ended(self, timeout_s: float, poll_s: float = 0.1) -> list[str]:
        """Wait, at most ``timeout_s``, until no live worker reports ``drafter-train`` (a worker
        reports ``rollout`` once its window's candidate is submitted); returns the workers
        still training at the deadline. A worker whose status cannot be read is not waited for
        (it is lost or restarting: its window's candidate is lost with it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            training = [n for n in self.live if self._observed(n) == DRAFTER_TRAIN]
            if not training or time.monotonic() + poll_s > deadline:
                return training
            time.sleep(poll_s)

    def _observed(self, name: str) -> Activity | None:
        try:
            raw = http_json(self.workers[name] + STATUS_PATH, None, 5.0, "GET")
            return from_wire(RolloutWorkerStatus, raw, "status").role.observed
        except (OSError, ValueError, ProtocolError):
            return None

    def run(
        self,
        requests: Sequence[GenerationRequest],
        step: int,
        policy_version: int,
        stop: threading.Event,
        group: int = 1,
        started: Callable[[], None] | None = None,
    ) -> RolloutOutcome:
        """Generate every request on the pool; samples come back in request order.

        ``group``: consecutive requests that stay on one worker (a prompt's answers).
        ``started``: called once the first shards are handed out, every worker holding one
        already marked busy (``on_assign``): the trainer reports the rollout as active from
        there, so a harvest poll never sees it active while its workers look idle.
        """
        live = self.live
        if not live:
            raise RolloutFailed(f"no live rollout worker (down: {self.down})")
        queue: deque[tuple[list[int], int]] = deque(
            (s, 0) for s in shard_round_robin(len(requests), len(live), group)
        )
        free = deque(live)
        samples: list[Sample | None] = [None] * len(requests)
        replies: list[GenerateReply] = []
        outcome = RolloutOutcome([], replies, 0.0, 0.0)
        start = time.monotonic()
        first_done: float | None = None
        in_flight: dict[Future[GenerateReply], _Call] = {}
        try:
            # Daemon threads (_spawn): an aborted step must not keep the process alive.
            while queue or in_flight:
                while queue and free:
                    shard, attempts = queue.popleft()
                    name = free.popleft()
                    call = GenerateCall(step, policy_version, [requests[i] for i in shard])
                    self.on_assign(name, True)
                    probe = HealthProbe(name, self.workers[name], self.liveness)
                    in_flight[_spawn(self._post, name, call)] = _Call(name, shard, attempts, probe)
                if started is not None:
                    started()
                    started = None
                if not in_flight:
                    raise RolloutFailed(self._no_worker_message(queue))
                done, _ = wait(list(in_flight), timeout=0.2, return_when=FIRST_COMPLETED)
                if stop.is_set():
                    raise RolloutAborted("stop requested during rollout")
                for fut in done:
                    c = self._ended(in_flight, fut)
                    try:
                        reply = fut.result()
                    except WorkerBusy as exc:
                        log.info("%s is busy (%s); retrying its shard", c.name, exc)
                        self._retry(queue, c.shard, c.attempts, c.name, str(exc))
                        free.append(c.name)
                        continue
                    except (OSError, ValueError) as exc:
                        self._lost(c, f"{type(exc).__name__}: {exc}", queue, outcome)
                        continue
                    for i, sample in zip(c.shard, reply.samples, strict=True):
                        samples[i] = sample
                    replies.append(reply)
                    free.append(c.name)
                    if first_done is None:
                        first_done = time.monotonic() - start
                silent = [f for f, c in in_flight.items() if c.probe.verdict and not f.done()]
                for fut in silent:  # a call that ended meanwhile is read at the next turn
                    c = self._ended(in_flight, fut)
                    fut.add_done_callback(functools.partial(_drop_late, c.name, step))
                    self._lost(c, str(c.probe.verdict), queue, outcome)
        finally:
            for c in in_flight.values():  # aborted or failed: the calls are left to end
                c.probe.close()
        outcome.samples = [s for s in samples if s is not None]
        if len(outcome.samples) != len(requests):
            raise RolloutFailed(f"{len(requests) - len(outcome.samples)} requests got no answer")
        outcome.seconds = time.monotonic() - start
        outcome.first_done_s = first_done if first_done is not None else outcome.seconds
        return outcome

    def _ended(self, in_flight: dict[Future[GenerateReply], _Call], fut: Future[Any]) -> _Call:
        """Take ``fut``'s call out of ``in_flight``: its worker no longer holds a shard."""
        c = in_flight.pop(fut)
        c.probe.close()
        self.on_assign(c.name, False)
        return c

    def _lost(
        self,
        c: _Call,
        why: str,
        queue: deque[tuple[list[int], int]],
        outcome: RolloutOutcome,
    ) -> None:
        """``c``'s worker failed (died, erred or went silent): mark it down until a later
        :meth:`revive` finds it back, book it in ``outcome``, and queue its shard again."""
        self.down[c.name] = why
        outcome.failed_workers[c.name] = why
        outcome.redispatched += len(c.shard)
        log.warning("rollout worker %s failed (%s); re-dispatching %d requests",
                    c.name, why, len(c.shard))  # fmt: skip
        self._retry(queue, c.shard, c.attempts, c.name, why)

    def _post(self, name: str, call: GenerateCall) -> GenerateReply:
        url = self.workers[name] + GENERATE_PATH
        try:
            answer = http_json(url, to_wire(call), self.timeout_s, "POST", self.token)
        except WorkerHTTPError as exc:
            if 400 <= exc.code < 500:  # 409 is WorkerBusy: never here
                raise RolloutRejected(
                    f"rollout worker {name} refused the generate call: {exc}. This is a job "
                    "configuration error, not a lost worker: fix the field it names (the "
                    "requests come from spec.algorithm: maxNewTokens, temperature, topP, and "
                    "from the dataset's prompts) and run again"
                ) from exc
            raise
        reply = from_wire(GenerateReply, answer, "reply")
        if len(reply.samples) != len(call.requests):
            raise ValueError(
                f"{name} answered {len(reply.samples)} samples for {len(call.requests)} requests"
            )
        return reply

    def _retry(
        self,
        queue: deque[tuple[list[int], int]],
        shard: list[int],
        attempts: int,
        name: str,
        why: str,
    ) -> None:
        if attempts + 1 >= self.max_attempts:
            raise RolloutFailed(
                f"{len(shard)} requests failed {attempts + 1} times (last on {name}: {why}); "
                f"workers down: {self.down or 'none'}"
            )
        queue.append((shard, attempts + 1))

    def _no_worker_message(self, queue: deque[tuple[list[int], int]]) -> str:
        left = sum(len(s) for s, _ in queue)
        errors = "; ".join(f"{n}: {e}" for n, e in self.down.items()) or "none recorded"
        return (
            f"no live rollout worker left with {left} requests unanswered; worker errors: {errors}"
        )


def _drop_late(name: str, step: int, fut: Future[GenerateReply]) -> None:
    """Done callback of a call abandoned as hung: whatever it ends with is dropped (its shard
    was re-dispatched)."""
    error = fut.exception()
    if error is None:
        log.info("rollout worker %s answered its abandoned call of step %d late; the answer is "
                 "dropped", name, step)  # fmt: skip
    else:
        log.info("rollout worker %s's abandoned call of step %d ended late: %s (dropped)",
                 name, step, error)  # fmt: skip


def _spawn(fn: Callable[..., GenerateReply], *args: Any) -> Future[GenerateReply]:
    """Run ``fn`` in a daemon thread; its result or exception lands in the future."""
    fut: Future[GenerateReply] = Future()

    def target() -> None:
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - re-raised by fut.result() in run()
            fut.set_exception(exc)

    threading.Thread(target=target, name="rollout-call", daemon=True).start()
    return fut
