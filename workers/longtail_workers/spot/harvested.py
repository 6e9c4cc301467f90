"""The harvested worker's role: the one state machine of every worker the harvest loop reassigns.

Who calls it: the rollout worker (``rollout/control.py``) and the trainer's harvestee
(``trainer/drafter_window.py``) each compose one :class:`HarvestedRole` and fill its
:class:`Harvestee` hooks; their HTTP surfaces map ``PUT /v1/role`` to
:meth:`HarvestedRole.set_role` and report :meth:`HarvestedRole.activity` in their status.

One writer of roles: only the harvest loop (operator or ``longtail run``, around
``longtail_api.harvestloop``) sends ``PUT /v1/role``. A harvestee takes its GPU back in process
when its own work arrives (:meth:`HarvestedRole.reclaim`): a rollout worker when a generate call
reaches it in drafter-train (a re-dispatched shard), the trainer when its rollout ends.

State (``own``: ``rollout``, or ``train`` for the trainer)::

    own --set_role(drafter-train)--> drafter-train     refused (409) with the harvestee's reason,
     ^                                     |             or while the last window still stops
     +---- set_role(own) / reclaim() ------+             stop (bounded), submit, then own

``desired`` is what was asked last, ``observed`` what the worker does now, ``since`` when that
began. Ending a window stops its training, submits its drafter through the window cycle
(``spot/cycle.py``), and only then reports the own activity: a worker reporting it has no
candidate left to send, which is what the step driver's merge waits for
(``trainer/dispatch.py``). A stop not done in time answers pending (HTTP 202), ``observed``
still ``drafter-train``, and the loop sends the switch again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from longtail_api.harvest import DRAFTER_TRAIN, Activity
from longtail_api.workerapi import RoleAck, RoleState
from longtail_workers.drafter.exchange import DrafterExchangeError
from longtail_workers.spot.cycle import RoleConflictError, WindowCycle, check_activity

log = logging.getLogger(__name__)


class Harvestee(Protocol):
    """What each harvested worker fills in (called under the role lock: no switch races them)."""

    @property
    def policy_version(self) -> int:
        """The policy version a candidate is tagged with when its buffer names none."""
        ...

    def refusal(self) -> str | None:
        """Why ``drafter-train`` cannot start now (the 409's reason, saying what to do); None
        when it can."""
        ...

    def start_window(self) -> None:
        """Start the window's training in the background; :class:`RoleConflictError` refuses."""
        ...

    def stop_window(self, timeout_s: float) -> bool:
        """Stop the window's training; True once it stopped within ``timeout_s``."""
        ...


class HarvestedRole:
    """desired/observed/since of one harvested worker and its windows (see the module text)."""

    def __init__(
        self,
        harvestee: Harvestee,
        cycle: WindowCycle | None,
        *,
        name: str,
        own: Activity,
        who: str,
        switch_timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        on_switch: Callable[[Activity, float], None] | None = None,
    ) -> None:
        self.harvestee = harvestee
        self.cycle = cycle
        """Gate and submission of each window's drafter (None: training is off)."""
        self.name, self.own, self.who = name, own, who
        self.activities: tuple[Activity, ...] = (own, DRAFTER_TRAIN)
        self.switch_timeout_s, self.clock = switch_timeout_s, clock
        self.on_switch = on_switch or (lambda role, seconds: None)
        """Called with each completed ``set_role``'s activity and seconds (metrics)."""
        self._lock = threading.Lock()  # the fields below
        self._role_lock = threading.Lock()  # one switch or reclaim at a time
        self._desired: Activity = own
        self._observed: Activity = own
        self._since = clock()
        self._harvested = 0.0

    def set_role(self, role: object) -> RoleAck:
        """``PUT /v1/role``; raises ``InvalidRoleError`` (400) or :class:`RoleConflictError`
        (409)."""
        started = time.perf_counter()
        role = check_activity(role, self.activities, self.who)
        with self._role_lock:
            if role == DRAFTER_TRAIN:
                self._begin_window()
            else:
                self._end_window(self.switch_timeout_s)
            seconds = time.perf_counter() - started
            self.on_switch(role, seconds)
            with self._lock:
                pending = self._desired != self._observed
                return RoleAck(self._desired, self._observed, self._since, pending, seconds)

    def reclaim(self, timeout_s: float) -> bool:
        """The harvestee's own work arrived: end any window (its candidate submitted) and go
        back to the own activity; False when the training did not stop within ``timeout_s``."""
        with self._role_lock:
            return self._end_window(timeout_s)

    def _begin_window(self) -> None:
        with self._lock:
            if self._observed == DRAFTER_TRAIN:
                if self._desired == DRAFTER_TRAIN:
                    return  # already training (or its window ended): acknowledge as is
                raise RoleConflictError(
                    f"{self.name} is still stopping its last drafter-train window; retry"
                )
        why = self.harvestee.refusal()
        if why is not None:
            raise RoleConflictError(why)
        with self._lock:
            self._desired = DRAFTER_TRAIN
        try:
            self.harvestee.start_window()
        except RoleConflictError:
            with self._lock:
                self._desired = self.own
            raise
        with self._lock:
            self._observed, self._since = DRAFTER_TRAIN, self.clock()

    def _end_window(self, timeout_s: float) -> bool:
        with self._lock:
            self._desired = self.own
            if self._observed == self.own:
                return True
        if not self.harvestee.stop_window(timeout_s):
            return False
        self._submit()
        with self._lock:  # only now: a worker reporting its own activity has nothing to send
            now = self.clock()
            self._harvested += max(0.0, now - self._since)
            self._observed, self._since = self.own, now
        return True

    def _submit(self) -> None:
        """Gate the window's drafter and submit it as this worker's candidate; an unreachable
        exchange is logged (the switch itself succeeded; the next window syncs anew)."""
        if self.cycle is None:
            return
        try:
            self.cycle.submit(self.name, self.harvestee.policy_version, self.name)
        except DrafterExchangeError as exc:
            log.warning("%s: drafter candidate of this window not submitted: %s", self.name, exc)

    def activity(self) -> RoleState:
        """The role as the worker's status reports it."""
        with self._lock:
            return RoleState(self._desired, self._observed, self._since)

    @property
    def harvested_seconds(self) -> float:
        """Seconds spent in drafter-train so far, the current window included."""
        with self._lock:
            ongoing = self.clock() - self._since if self._observed == DRAFTER_TRAIN else 0.0
            return self._harvested + max(0.0, ongoing)
