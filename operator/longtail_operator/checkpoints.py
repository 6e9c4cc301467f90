"""The trainer's checkpoint before a job's pods go, asked in the background (issue #48, item 3).

``reconcile.py`` asks trainer pod 0 for a checkpoint (``POST /v1/checkpoint``) before it deletes
the pods of a suspended, evicted or operator-failed job, or restarts a resized trainer group
(``model.Plan.checkpoint``). Writing one can take minutes (``checkpoint_timeout_s``), and a
reconcile that waited for it would write no status and post no event meanwhile. So the call
runs in a daemon thread (:class:`CheckpointCall`), and each reconcile asks
:meth:`Checkpointing.advance` whether the pods may go yet: the reconcile itself goes on planning,
writing the status (the phase the planner says: Suspended, Queued, Failed) and posting events
(a pod failing meanwhile gets its ``WorkerFailed``) while the pods wait for the answer. The call
wakes the job loop when it ends. A trainer that answers at once (within
:data:`GRACE_S`) has its checkpoint on disk before the status says the job stopped, as before.

A daemon thread never holds up the process's exit: an operator stopped mid-checkpoint exits at
once, and the one that takes over asks again; the trainer answers a request that arrives while
a checkpoint is being written with that checkpoint, never writing twice
(``longtail_workers.trainer.service``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from longtail_api.workerapi import CheckpointAnswer
from longtail_operator.model import Event

GRACE_S = 1.0
"""How long a reconcile waits for a call it just started before going on: a trainer that
answers within it has its checkpoint on disk before the status says the job stopped."""
RETRY_S = 1.0
"""The least time between a failed call (no answer, a 503 while loading) and the next."""


class CheckpointCall:
    """One ``POST /v1/checkpoint`` running in a daemon thread; ``on_end`` is called when it
    ends (the job loop's wake)."""

    def __init__(
        self,
        pod_uid: str,
        reason: str,
        ask: Callable[[], CheckpointAnswer | str],
        on_end: Callable[[], None],
    ) -> None:
        self.pod_uid, self.reason = pod_uid, reason
        self.answer: CheckpointAnswer | str | None = None
        """The trainer's answer, or why there is none; None while the call runs."""
        self.ended_at: float | None = None
        self._ask, self._on_end = ask, on_end
        self._ended = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"checkpoint-{reason}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        answer: CheckpointAnswer | str = "the checkpoint call raised (see the operator's log)"
        try:
            answer = self._ask()
        finally:  # an exception still reaches threading's hook, which logs its traceback
            self.answer = answer
            self.ended_at = time.monotonic()
            self._ended.set()
            self._on_end()

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def wait(self, seconds: float) -> bool:
        """Whether the call ended within ``seconds``."""
        return self._ended.wait(seconds)


@dataclass
class Checkpointing:
    """One job's checkpoint before its pods go (``JobRuntime.checkpointing``)."""

    started: float | None = None
    """When the first call for this stop started (monotonic); the timeout counts from it."""
    done: bool = False
    """Answered, or given up on: the pods may go."""
    call: CheckpointCall | None = None
    """The call running, or the last one (its answer not yet read)."""
    asked: bool = False
    """``CheckpointRequested`` was posted for this stop."""

    def reset(self) -> None:
        """The job runs again: the next stop asks afresh."""
        self.started, self.done, self.call, self.asked = None, False, None, False

    def drop(self) -> None:
        """Nothing to ask now (the trainer pod went): a call still running ends unread."""
        self.call = None

    def advance(
        self,
        pod_uid: str,
        reason: str,
        timeout_s: float,
        start: Callable[[float], CheckpointCall],
    ) -> tuple[bool, list[Event]]:
        """Whether the pods may go now, and the events to post. Starts a call (``start``,
        given the seconds left) when none runs, or retries a failed one after
        :data:`RETRY_S`; gives up once ``timeout_s`` passed since the first call."""
        events: list[Event] = []
        if self.done:
            return True, events
        call = self.call
        if call is not None and (call.pod_uid, call.reason) != (pod_uid, reason):
            call = self.call = None  # asked of another pod, or for another reason
        now = time.monotonic()
        self.started = self.started or now
        left = timeout_s - (now - self.started)
        failed = call is not None and call.ended and not isinstance(call.answer, CheckpointAnswer)
        retry = failed and call is not None and now >= (call.ended_at or now) + RETRY_S
        if left > 0 and (call is None or retry):
            if not self.asked:
                text = (
                    f"asked the trainer for a checkpoint ({reason}); its pods stay until it "
                    f"answers, at most {timeout_s:.0f} s"
                )
                events.append(Event("Normal", "CheckpointRequested", text))
                self.asked = True
            call = self.call = start(left)
            call.wait(GRACE_S)
        if call is not None and isinstance(call.answer, CheckpointAnswer):
            self.done = True
            msg = f"checkpoint of step {call.answer.step} written to {call.answer.location}"
            events.append(Event("Normal", "CheckpointSaved", msg))
        elif timeout_s - (time.monotonic() - self.started) <= 0:
            self.done = True
            why = f"no answer within checkpoint_timeout_s={timeout_s:.0f} s"
            if call is not None and isinstance(call.answer, str):
                why = call.answer
            msg = (
                f"no checkpoint before the pods go ({reason}: {why}); resuming uses the last "
                "periodic one"
            )
            events.append(Event("Warning", "CheckpointFailed", msg))
        return self.done, events
