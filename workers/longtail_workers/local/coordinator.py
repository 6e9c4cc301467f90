"""The local harvest transport: the operator's harvest loop, for ``longtail run``.

Runs in the ``longtail run`` parent. Every ``harvest.pollPeriodSeconds`` it runs the shared
:class:`longtail_api.harvestloop.HarvestLoop` (exactly what the operator runs: views of the
step, trainer rule, just-in-time re-check, 409 policy with backoff) over this transport: it
reads the trainer's status (is a rollout in progress, which workers still hold requests) and
each rollout worker's ``GET /v1/status``, re-reads the trainer's status for the re-check, and
sends each change with ``PUT /v1/role`` carrying the run's token (``longtail_workers.auth``).
With ``trainer`` in ``harvest.eligibleRoles`` the trainer is one more target (role ``trainer``,
idle while it waits for the rollout, from its own status) and gets its changes on its
``PUT /v1/role``.

It also keeps the run's books: idle worker-seconds during rollouts (a worker without requests
while others still generate) and harvested worker-seconds (observed ``drafter-train``), per
step, and the trainer's harvested seconds apart, which the progress line and the report show,
plus counts of switches sent and refused.

It tracks the rollout workers actually present: ``run.py`` tells it which ones are alive
(:meth:`Coordinator.present`: one lost past its restarts is no harvest target any more, as a
deleted pod is not on a cluster) and which were restarted (:meth:`Coordinator.restarted`: the
loop forgets its assignment, and the new process starts over in its own role).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from longtail_api.harvest import DRAFTER_TRAIN, Activity, NamedTarget, Observation, RolloutState
from longtail_api.harvestloop import (
    HarvestLoop,
    Reports,
    RoleReply,
    observe_trainer,
    observe_worker,
)
from longtail_api.policies import HarvestSpec
from longtail_api.protocol import ProtocolError
from longtail_api.wirecodec import from_wire
from longtail_api.workerapi import RoleAnswer, RolloutWorkerStatus, TrainerStatus
from longtail_workers.httpclient import WorkerBusy, WorkerHTTPError, http_json

log = logging.getLogger(__name__)
TRAINER = "trainer"
"""The trainer's name in the views and the assignments (role ``trainer``)."""
HttpJson = Callable[..., Any]
"""``http_json(url, body, timeout_s, method, token)`` (tests pass a fake)."""


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
        http: HttpJson = http_json,
    ) -> None:
        self.spec, self.trainer_url, self.workers = spec, trainer_url, dict(workers)
        self._urls = dict(workers)
        """Every rollout worker of the run; :attr:`workers` holds those present."""
        self._forget: set[str] = set()
        self._forget_lock = threading.Lock()
        self.token = token
        """The run's token for ``PUT /v1/role`` (None: this process's ``LONGTAIL_AUTH_TOKEN``)."""
        self.harvest_trainer = spec.enabled and "trainer" in spec.eligible_roles
        self.books = HarvestBooks(trainer_tracked=self.harvest_trainer)
        self.trainer: TrainerStatus | None = None
        self.statuses: dict[str, RolloutWorkerStatus] = {}
        self.clock = clock
        self.loop = HarvestLoop(clock=clock)
        """The shared loop: assignments, decisions, re-check, re-sends."""
        self._http = http
        self._last: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def assigned(self) -> dict[str, Activity]:
        """The activity last assigned to each worker (acknowledged or not)."""
        return {name: a.activity for name, a in self.loop.assignments.items()}

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

    def present(self, names: Sequence[str]) -> None:
        """The rollout workers alive now (others are no harvest targets from the next poll)."""
        now = {n: url for n, url in self._urls.items() if n in names}
        if now != self.workers:
            self.workers = now  # rebound whole: a poll in progress reads the dict it began with

    def restarted(self, name: str) -> None:
        """``name``'s process was started again: its assignment is forgotten at the next poll
        (by the poll thread, the loop's one user)."""
        with self._forget_lock:
            self._forget.add(name)

    def poll_once(self) -> dict[str, Activity]:
        """One poll of the shared loop; returns the new decisions (sent at once). Raises
        OSError/ValueError/ProtocolError when the trainer's status cannot be read."""
        with self._forget_lock:
            forget, self._forget = self._forget, set()
        for name in forget:
            self.loop.forget(name)
        return dict(self.loop.step(self.spec, self).decided)

    # The transport (longtail_api.harvestloop.Transport).

    def read(self) -> Reports:
        trainer = self._trainer_status()
        self.trainer = trainer
        targets = [NamedTarget(name, "rollout") for name in self.workers]
        obs: dict[str, Observation] = {}
        for name, url in self.workers.items():
            try:
                raw = self._http(url + "/v1/status", None, 5.0, "GET")
                status = from_wire(RolloutWorkerStatus, raw, "status")
            except (OSError, ValueError, ProtocolError):
                self.statuses.pop(name, None)  # dead or restarting: its idleness is unknown
                continue
            self.statuses[name] = status
            obs[name] = observe_worker(status)
        report = observe_trainer(trainer)
        if self.harvest_trainer and trainer.role is not None:
            targets.append(NamedTarget(TRAINER, "trainer"))
            obs[TRAINER] = report
        self._account(trainer)
        return Reports(targets, obs, report)

    def recheck(self) -> RolloutState | None:
        """The trainer's status, re-read just before the harvest changes are sent."""
        try:
            now = self._trainer_status()
        except (OSError, ValueError, ProtocolError) as exc:
            log.debug("harvest re-check failed: %s", exc)
            return None
        return RolloutState(now.rollout_active, now.step)

    def send(self, orders: Sequence[tuple[str, Activity]]) -> list[RoleReply]:
        return [self._assign(name, role) for name, role in orders]

    def _trainer_status(self) -> TrainerStatus:
        raw = self._http(self.trainer_url + "/v1/status", None, 5.0, "GET")
        return from_wire(TrainerStatus, raw, "status")

    def _assign(self, name: str, role: Activity) -> RoleReply:
        """One ``PUT /v1/role``; counts switches and refusals."""
        url = self.trainer_url if name == TRAINER else self.workers.get(name)
        if url is None:  # lost past its restarts since the poll read it
            return RoleReply(None, None, f"{name} is no longer present")
        try:
            answer = self._http(url + "/v1/role", {"role": role}, 30.0, "PUT", self.token)
            ack = from_wire(RoleAnswer, answer, "response").role
        except WorkerBusy as exc:
            self.books.refusals += 1
            log.debug("%s refused %s: %s", name, role, exc)
            return RoleReply(409, None, f"HTTP 409: {exc}")
        except WorkerHTTPError as exc:
            log.info("could not assign %s to %s: %s", name, role, exc)
            return RoleReply(exc.code, None, str(exc))
        except (OSError, ValueError, ProtocolError) as exc:
            log.info("could not assign %s to %s: %s", name, role, exc)
            return RoleReply(None, None, f"{type(exc).__name__}: {exc}")
        self.books.switches += 1
        log.info("harvest: %s -> %s (%s)", name, role, ack.observed)
        return RoleReply(202 if ack.pending else 200, ack, None)

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
