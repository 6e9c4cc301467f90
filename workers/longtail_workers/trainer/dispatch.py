"""Spreading one step's generation requests over the rollout workers, surviving lost workers.

The step driver (``trainer/driver.py``) calls :meth:`RolloutPool.run` once per rollout (and per
greedy evaluation). Requests are split round-robin into one shard per live worker (answers of one
prompt land on different workers, so long-tailed prompts spread out) and each shard is sent as one
``POST /v1/generate``. A shard whose worker fails (connection refused or reset: the process died;
HTTP 5xx; the call's timeout) or stops answering while it holds the shard (its ``/healthz``
unanswered for ``rollout.unresponsiveSeconds``: a stopped process or a frozen node,
``trainer/liveness.py``; the call is abandoned and a late answer dropped) is queued again and handed
to the next free live worker; the failed worker is marked down (the step's ``failed_workers``, its
requests counted in ``redispatched``) and skipped until a health check at a later step start finds
it back: a new or returning worker takes prompts from the step after it answers, and loads that
step's policy version (and the newest drafter) at its first call. The workers themselves may change
between steps: with a ``membership`` (in a pod, ``trainer/membership.py``: the job's live
``spec.rollout.replicas``) :meth:`RolloutPool.revive` first adds the workers it names as not yet
live (taken when they answer, as a returning worker is) and drops those it no longer names (one
whose pod was deleted mid-step failed its call there: its share was re-dispatched as a lost
worker's). Only when no live worker is left (every one lost, or none back yet: a run shrunk to
nothing while its workers restart) does the pool take one back mid-step: it waits, up to ``wait_s``
(the job's ``rollout.belowMinGraceSeconds``), health-checking the down ones every second, before it
gives up. Each answer's ``id`` must be its request's (a worker answering other requests is treated
as failed), and the outcome records which worker answered each request (the step row's
``answer_workers``) and how many workers were present (``rollout_workers``). A 409 (a worker in
drafter-train ends its window itself before it generates, ``spot/harvested.py``; 409 when that
window did not stop in time) retries the shard, the worker staying free. Any other 4xx means the
call itself is wrong (a job configuration error, e.g. ``algorithm.maxNewTokens`` beyond the model's
context; the worker's message names the field): it would fail on every worker, so the step fails at
once with :class:`RolloutRejected` carrying that message, and no worker is marked down. The step
fails with :class:`RolloutFailed`, naming every worker's last error, when no live worker is back
within ``wait_s`` or a shard failed ``max_attempts`` times; it never waits longer than ``timeout_s``
per call. ``stop`` (Ctrl-C) aborts with :class:`RolloutAborted`. Every call goes through
``httpclient.py`` without HTTP-level retries (re-dispatching a shard is the retry); generate calls
carry the job's token (``longtail_workers.auth``). The pool never changes a worker's role (the
harvest loop is their one writer): before the step's drafter merge,
:meth:`RolloutPool.wait_windows_ended` waits, bounded, until no worker reports ``drafter-train`` any
more, i.e. until the loop has ended the windows of the rollout and each worker has submitted its
candidate."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
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


NOT_YET_LIVE = "not yet live"
"""How the reason a worker is down starts while it never answered (new, or starting): when it
answers it joins, rather than comes back."""


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
    answered_by: list[str] = field(default_factory=list)
    """The worker whose answer was kept, per request (request order)."""
    workers_present: int = 0
    """Rollout workers live when the rollout ended (not marked down): those the step had."""


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
        wait_s: float = 0.0,
        membership: Callable[[], Mapping[str, str] | None] | None = None,
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
        self.wait_s = wait_s
        """How long a rollout waits for a live worker when none is left (0: fails at once)."""
        self.membership = membership
        """The workers the job names now (None from it: unknown, keep them; no membership:
        the workers given are fixed)."""
        self._lock = threading.Lock()

    @property
    def live(self) -> list[str]:
        return [w for w in self.workers if w not in self.down]

    def follow(self, named: Mapping[str, str]) -> tuple[list[str], list[str]]:
        """Make the workers ``named`` (name -> URL): new ones join as not yet live, those no
        longer named leave. Only between calls (nothing in flight). Returns (joined, left)."""
        joined = [n for n in named if n not in self.workers]
        left = [n for n in self.workers if n not in named]
        for name in joined:
            self.down[name] = f"{NOT_YET_LIVE} (new in spec.rollout.replicas)"
        for name in left:
            self.down.pop(name, None)
        self.workers = {n: named[n].rstrip("/") for n in named}
        if joined or left:
            log.info("rollout workers now %d (spec.rollout.replicas): joining %s, leaving %s",
                     len(self.workers), ", ".join(joined) or "none",
                     ", ".join(left) or "none")  # fmt: skip
        return joined, left

    def revive(self, timeout_s: float = 2.0) -> list[str]:
        """At a step start (or while no worker is live): follow the membership (when there is
        one), then health-check the workers marked down; a healthy one takes work again.
        Returns those back (a new worker counts once it answers)."""
        named = self.membership() if self.membership is not None else None
        if named:
            self.follow(named)
        back = []
        for name in list(self.down):
            try:
                request("GET", self.workers[name] + HEALTHZ_PATH, timeout_s=timeout_s)
            except (OSError, WorkerBusy):
                continue
            if self.down.pop(name, "").startswith(NOT_YET_LIVE):
                log.info("rollout worker %s answers; it joins the pool", name)
            else:
                log.info("rollout worker %s answers again; back in the pool", name)
            back.append(name)
        return back

    def _wait_for_a_worker(
        self, stop: threading.Event, left: int, poll_s: float = 1.0
    ) -> list[str]:
        """The workers back once at least one is (every worker is down): revived every
        ``poll_s`` up to :attr:`wait_s`; :class:`RolloutAborted` on ``stop``,
        :class:`RolloutFailed` naming every worker's error when none came back."""
        deadline = time.monotonic() + self.wait_s
        if self.wait_s > 0:
            log.warning(
                "no live rollout worker (%d requests left); waiting up to %gs for one to "
                "answer (spec.rollout.belowMinGraceSeconds)",
                left,
                self.wait_s,
            )
        while True:
            back = self.revive()
            if back:
                return back
            if time.monotonic() + poll_s > deadline:
                errors = "; ".join(f"{n}: {e}" for n, e in self.down.items()) or "none recorded"
                raise RolloutFailed(
                    f"no live rollout worker left with {left} requests unanswered (none answered "
                    f"within {self.wait_s:g}s, spec.rollout.belowMinGraceSeconds); worker "
                    f"errors: {errors}"
                )
            if stop.wait(poll_s):
                raise RolloutAborted("stop requested while waiting for a rollout worker")

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
        live = self.live or self._wait_for_a_worker(stop, len(requests))
        queue: deque[tuple[list[int], int]] = deque(
            (s, 0) for s in shard_round_robin(len(requests), len(live), group)
        )
        free = deque(live)
        samples: list[Sample | None] = [None] * len(requests)
        answered_by = [""] * len(requests)
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
                if not in_flight:  # every worker is down: wait for one to answer again
                    free.extend(self._wait_for_a_worker(stop, sum(len(s) for s, _ in queue)))
                    continue
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
                        samples[i], answered_by[i] = sample, c.name
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
        outcome.answered_by, outcome.workers_present = answered_by, len(self.live)
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
        for req, sample in zip(call.requests, reply.samples, strict=True):
            if sample.request_id != req.request_id:
                raise ValueError(
                    f"{name} answered request {sample.request_id!r} where {req.request_id!r} "
                    "was asked: its answers do not match the call"
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
