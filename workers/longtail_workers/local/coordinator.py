"""The local harvest coordinator: the operator's harvest loop, for ``longtail run``.

Runs in the ``longtail run`` parent. Every ``harvest.pollPeriodSeconds`` it reads the trainer's
status (is a rollout in progress, which workers still hold requests) and each rollout worker's
``GET /v1/status`` (idle since when, observed role), builds one
:class:`~longtail_api.harvest.WorkerView` per worker and calls the shared, pure
:func:`longtail_api.harvest.decide` (exactly what the operator calls), then sends each change
with ``PUT /v1/role``. A 409 (the worker cannot train yet, e.g. nothing captured) leaves it
assigned to its own activity so the next poll may try again. With ``trainer`` in
``harvest.eligibleRoles`` the trainer is one more view (role ``trainer``, idle while it waits
for the rollout, from its own status) and gets its changes on its ``PUT /v1/role``. Role
changes carry the run's token (``longtail_workers.auth``).

It also keeps the run's books: idle worker-seconds during rollouts (a worker without requests
while others still generate) and harvested worker-seconds (observed ``drafter-train``), per
step, and the trainer's harvested seconds apart, which the progress line and the report show.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from longtail_api.harvest import DRAFTER_TRAIN, Activity, WorkerView, decide, default_activity
from longtail_api.policies import HarvestSpec
from longtail_api.protocol import ProtocolError
from longtail_api.workerapi import RolloutWorkerStatus, TrainerStatus
from longtail_workers.httpclient import WorkerBusy, http_json

log = logging.getLogger(__name__)
TRAINER = "trainer"
"""The trainer's name in the views and the assignments (role ``trainer``)."""


@dataclass
class HarvestBooks:
    """Worker-seconds per step: idle during rollout, and harvested (drafter-train)."""

    idle: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    harvested: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    trainer_harvested: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    """Seconds the trainer reported drafter-train during each step's rollout."""
    trainer_tracked: bool = False
    """The trainer is a harvest target (``trainer`` in ``harvest.eligibleRoles``)."""
    switches: int = 0
    refusals: int = 0

    @property
    def idle_total(self) -> float:
        return float(sum(self.idle.values()))

    @property
    def harvested_total(self) -> float:
        return float(sum(self.harvested.values()))

    @property
    def trainer_harvested_total(self) -> float:
        return float(sum(self.trainer_harvested.values()))


class Coordinator:
    """Polls, decides, assigns (see the module text). ``start()`` runs it in a thread."""

    def __init__(
        self,
        spec: HarvestSpec,
        trainer_url: str,
        workers: dict[str, str],
        *,
        clock: Callable[[], float] = time.monotonic,
        token: str | None = None,
    ) -> None:
        self.spec, self.trainer_url, self.workers = spec, trainer_url, dict(workers)
        self.token = token
        """The run's token for ``PUT /v1/role`` (None: this process's ``LONGTAIL_AUTH_TOKEN``)."""
        self.assigned: dict[str, Activity] = {name: "rollout" for name in workers}
        self.harvest_trainer = spec.enabled and "trainer" in spec.eligible_roles
        if self.harvest_trainer:
            self.assigned[TRAINER] = default_activity("trainer")
        self.books = HarvestBooks(trainer_tracked=self.harvest_trainer)
        self.trainer: TrainerStatus | None = None
        self.statuses: dict[str, RolloutWorkerStatus] = {}
        self.clock = clock
        self._last: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Coordinator:
        self._thread = threading.Thread(target=self._loop, name="harvest", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _loop(self) -> None:
        while not self._stop.wait(self.spec.poll_period_seconds):
            try:
                self.poll_once()
            except (OSError, ValueError, ProtocolError) as exc:
                log.debug("harvest poll failed: %s", exc)  # a child restarting or stopping

    def poll_once(self) -> dict[str, Activity]:
        """One poll: read statuses, account, decide, assign; returns the changes sent."""
        trainer = self._trainer_status()
        self.trainer = trainer
        views: list[WorkerView] = []
        for name, url in self.workers.items():
            try:
                status = RolloutWorkerStatus.from_dict(
                    http_json(url + "/v1/status", None, 5.0, "GET")
                )
            except (OSError, ValueError, ProtocolError):
                self.statuses.pop(name, None)  # dead or restarting: not harvestable
                continue
            self.statuses[name] = status
            idle = None if status.generating else status.idle_seconds
            views.append(WorkerView(name, "rollout", self.assigned[name], idle,
                                    pending_work=name in trainer.pending_workers))  # fmt: skip
        if self.harvest_trainer and trainer.role is not None:
            idle = trainer.idle_seconds  # waiting for the rollout; None outside one
            views.append(WorkerView(TRAINER, "trainer", self.assigned[TRAINER], idle))
        self._account(trainer)
        changes = decide(self.spec, trainer.rollout_active, views)
        if any(role == DRAFTER_TRAIN for role in changes.values()) and not self._still(trainer):
            # The rollout ended while we polled the workers: harvesting now would train through
            # the policy update. Drop the harvest changes; the next poll decides afresh.
            changes = {n: r for n, r in changes.items() if r != DRAFTER_TRAIN}
        for name, role in changes.items():
            self._assign(name, role)
        return changes

    def _still(self, before: TrainerStatus) -> bool:
        """Whether the rollout seen in ``before`` is still running (re-read, just in time)."""
        now = self._trainer_status()
        return now.rollout_active and now.step == before.step

    def _trainer_status(self) -> TrainerStatus:
        return TrainerStatus.from_dict(http_json(self.trainer_url + "/v1/status", None, 5.0, "GET"))

    def _assign(self, name: str, role: Activity) -> None:
        url = self.trainer_url if name == TRAINER else self.workers[name]
        try:
            answer: Any = http_json(url + "/v1/role", {"role": role}, 30.0, "PUT", self.token)
        except WorkerBusy as exc:
            self.books.refusals += 1
            log.debug("%s refused %s: %s", name, role, exc)
            self.assigned[name] = default_activity("trainer" if name == TRAINER else "rollout")
            return
        except OSError as exc:
            log.info("could not assign %s to %s: %s", name, role, exc)
            return
        self.assigned[name] = role
        self.books.switches += 1
        log.info("harvest: %s -> %s (%s)", name, role, answer.get("role", {}).get("observed"))

    def _account(self, trainer: TrainerStatus) -> None:
        now = self.clock()
        dt = 0.0 if self._last is None else now - self._last
        self._last = now
        if not trainer.rollout_active:
            return
        step = trainer.step + 1  # the step whose rollout is running
        for status in self.statuses.values():
            if status.generating:
                continue
            self.books.idle[step] += dt
            if status.role.observed == "drafter-train":
                self.books.harvested[step] += dt
        role = trainer.role
        if self.harvest_trainer and role is not None and role.observed == DRAFTER_TRAIN:
            self.books.trainer_harvested[step] += dt
