"""The rollout worker's state: what it does with its GPU (rollout or drafter-train) and why.

:class:`RolloutWorker` is the object every front end drives: the HTTP control surface
(``rollout/http.py``) maps ``PUT /v1/role`` to :meth:`RolloutWorker.set_role` and
``GET /v1/status`` to :meth:`RolloutWorker.status`; the generation endpoint
(``rollout/service.py``) calls :meth:`RolloutWorker.generate`. It owns the engine (torch or
vLLM), the capture buffer (``spot/buffer.py``), the spot trainer (``spot/trainer.py``), the
acceptance tracker and optionally a drafter registry
(:class:`~longtail_workers.drafter.registry.DrafterStore`: a shared directory, or the trainer's HTTP
exchange in ``drafter/exchange.py``).

Role state machine (activity names from ``longtail_api.harvest``)::

    rollout --PUT drafter-train--> drafter-train      refused (409) while generating, before any
       ^                               |              data was captured, when training is
       |                               |              disabled, or after the trainer failed
       +------PUT rollout-------------+               trainer stopped between optimizer steps

``desired`` is what was asked last, ``observed`` what the worker does now, ``since`` when the
observed activity began. Switching to rollout waits up to ``stop_timeout_s`` for the trainer to
stop; if it has not by then, the answer says so (pending) and ``observed`` flips as soon as the
thread exits. Generation is refused unless the worker is in rollout, and the newest published
drafter is loaded at the start of each ``generate`` call, never mid-sequence. When the trainer's
drafter exchange cannot be reached (after its bounded retries), the worker logs it and goes on
with the drafter it has: speculative decoding stays lossless with any drafter. The window's
sync, gate and submission, and the role errors, are the window cycle every harvested worker
shares (``spot/cycle.py``); what is this worker's own is how the buffer fills: by generating.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from longtail_api.harvest import DRAFTER_TRAIN, Activity
from longtail_api.policies import DrafterTrainingSpec
from longtail_api.workerapi import RoleAck
from longtail_workers.drafter.exchange import DrafterExchangeError
from longtail_workers.drafter.model import EagleDrafter, layout_options
from longtail_workers.drafter.registry import Candidate, DrafterStore
from longtail_workers.engine.interface import GenerationRequest, GenerationResult, RolloutEngine
from longtail_workers.rollout.metrics import WorkerCollector, role_switch_histogram
from longtail_workers.spot.acceptance import INITIAL_DRAFTER, AcceptanceTracker
from longtail_workers.spot.buffer import RolloutBuffer
from longtail_workers.spot.cycle import (
    RoleConflictError,
    WindowCycle,
    check_activity,
    newest_drafter,
)
from longtail_workers.spot.trainer import EmptyBufferError, SpotTrainer

log = logging.getLogger(__name__)

ROLLOUT: Activity = "rollout"
WORKER_ACTIVITIES: tuple[Activity, ...] = (ROLLOUT, DRAFTER_TRAIN)
"""Activities a rollout worker can take."""


class RolloutWorker:
    """Engine, buffer, spot trainer and the role state machine (see the module text)."""

    def __init__(
        self,
        engine: RolloutEngine,  # TorchEngine or VllmEngine: target, stats, running, set_drafter
        *,
        target_id: str,
        name: str = "rollout-0",
        training: DrafterTrainingSpec | None = None,
        registry: DrafterStore | None = None,
        drafter: EagleDrafter | None = None,
        max_buffer_bytes: int = 8 << 30,
        policy_version: int = 0,
        step: int = 0,
        stop_timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine, self.name, self.target_id = engine, name, target_id
        self.training = training or DrafterTrainingSpec()
        self.registry, self.stop_timeout_s, self.clock = registry, stop_timeout_s, clock
        self.buffer = RolloutBuffer(self.training.buffer_tokens, max_buffer_bytes)
        self.acceptance = AcceptanceTracker()
        initial = drafter or (engine.sd.drafter if engine.sd is not None else None)
        if initial is None:
            initial = EagleDrafter(
                engine.target.model,
                target_id=target_id,
                **layout_options(self.training.layout),
            )
        self.trainer: SpotTrainer | None = None
        self.cycle: WindowCycle | None = None
        """Sync, gate and submission of the drafter-train windows (``spot/cycle.py``)."""
        if self.training.enabled:
            self.trainer = SpotTrainer(copy.deepcopy(initial), self.buffer, self.training)
            self.cycle = WindowCycle(
                self.trainer, registry, engine.target.model, target_id=target_id
            )
        self.policy_version, self.step = policy_version, step
        self.drafter_version = INITIAL_DRAFTER
        self._state = threading.Lock()  # desired/observed/generating
        self._role_lock = threading.Lock()  # one role change at a time
        self._gen_lock = threading.Lock()  # one generate at a time
        self._desired: Activity = ROLLOUT
        self._observed: Activity = ROLLOUT
        now = clock()
        self._since, self._generating = now, False
        self._idle_since: float | None = now
        self.metrics_registry = CollectorRegistry()
        self.role_switch = role_switch_histogram(self.metrics_registry)
        self.metrics_registry.register(WorkerCollector(self))
        self.metrics_registry.register(self.acceptance)

    # --- generation -------------------------------------------------------------------------

    def generate(
        self, requests: Sequence[GenerationRequest], *, step: int | None = None
    ) -> list[GenerationResult]:
        """Generate (rollout role only), capture for the drafter, record acceptance."""
        with self._gen_lock:
            with self._state:
                self._settle()
                if self._desired != ROLLOUT or self._observed != ROLLOUT:
                    raise RoleConflictError(
                        f"worker {self.name} is assigned {self._desired!r} (doing "
                        f"{self._observed!r}); PUT /v1/role rollout before sending prompts"
                    )
                self._generating, self._idle_since = True, None
            try:
                return self._generate(requests, self.step if step is None else step)
            finally:
                with self._state:
                    self._generating, self._idle_since = False, self.clock()

    def _generate(self, requests: Sequence[GenerationRequest], step: int) -> list[GenerationResult]:
        self._refresh_drafter()  # between generate calls only: never mid-sequence
        capture = self.trainer is not None
        sent = [dataclasses.replace(r, return_hidden_states=True) for r in requests]
        results = self.engine.generate(sent if capture else requests)
        if capture:
            self.buffer.add_results(results, policy_version=self.policy_version, step=step)
            for req, res in zip(requests, results, strict=True):
                if not req.return_hidden_states:
                    res.hidden_states = None  # the caller did not ask; do not ship it
        self.acceptance.record(
            results, policy_version=self.policy_version, drafter_version=self.drafter_version
        )
        return results

    def _refresh_drafter(self) -> None:
        if self.registry is None:
            return
        model, have = self.engine.target.model, self.drafter_version
        try:
            found = newest_drafter(self.registry, model, self.target_id, have)
        except DrafterExchangeError as exc:
            log.warning("keeping drafter version %s: %s", self.drafter_version, exc)
            return
        if found is not None:
            self.engine.set_drafter(found[0])
            self.drafter_version = found[1]

    def begin_step(self, step: int, policy_version: int) -> None:
        """Record that new policy weights (``policy_version``) are loaded for ``step``."""
        with self._state:
            if self._generating:
                raise RoleConflictError("begin_step while generating; wait for the rollout")
            self.step, self.policy_version = step, policy_version

    # --- roles ------------------------------------------------------------------------------

    def set_role(self, role: object) -> RoleAck:
        """Switch to ``role`` (see the module text); raises InvalidRoleError / RoleConflictError."""
        started = time.perf_counter()
        role = check_activity(role, WORKER_ACTIVITIES, "a rollout worker")
        with self._role_lock:
            if role == DRAFTER_TRAIN:
                self._to_training()
            else:
                self._to_rollout()
            seconds = time.perf_counter() - started
            self.role_switch.labels(role=role).observe(seconds)
            with self._state:
                self._settle()
                return RoleAck(
                    desired=self._desired,
                    observed=self._observed,
                    since=self._since,
                    pending=self._desired != self._observed,
                    switch_seconds=seconds,
                )

    def _to_training(self) -> None:
        with self._state:
            self._settle()
            if self._observed == DRAFTER_TRAIN and self._desired == DRAFTER_TRAIN:
                return  # already training (or its window ended): acknowledge as is
            self._check_can_train()
            self._desired = DRAFTER_TRAIN  # from here on generate() is refused
        trainer, cycle = self.trainer, self.cycle
        assert trainer is not None and cycle is not None
        try:
            self._sync_trainer_base(cycle)
            trainer.start()
        except EmptyBufferError as exc:
            with self._state:
                self._desired = ROLLOUT
            raise RoleConflictError(str(exc)) from exc
        with self._state:
            self._observed, self._since = DRAFTER_TRAIN, self.clock()

    def _check_can_train(self) -> None:
        if self.trainer is None:
            raise RoleConflictError(
                "drafter training is disabled on this worker (drafterTraining.enabled=false); "
                "it can only do rollout"
            )
        if self._generating:
            raise RoleConflictError(
                f"worker {self.name} is generating ({self.engine.running} sequences running, "
                f"{self.engine.waiting} waiting); it can train once its rollout share is done"
            )
        if self.trainer.state in ("training", "stopping"):
            raise RoleConflictError(
                "the spot trainer is still stopping from the last window; retry in a moment"
            )
        if self.trainer.state == "failed":
            raise RoleConflictError(
                f"the spot trainer failed ({self.trainer.status().error}); see the worker log, "
                "fix the cause and restart the worker"
            )
        if len(self.buffer) == 0:
            raise RoleConflictError(
                "no rollout data captured yet: the drafter has nothing to train on; assign "
                "drafter-train after this worker has generated"
            )

    def _sync_trainer_base(self, cycle: WindowCycle) -> None:
        """Train on top of the newest published version; an unreachable exchange is logged and
        the window trains on the version it has (speculative decoding stays lossless)."""
        try:
            cycle.sync_base()
        except DrafterExchangeError as exc:
            log.warning("training on drafter version %s: %s", cycle.spot.base_version, exc)

    def _to_rollout(self) -> None:
        with self._state:
            self._settle()
            if self._observed == ROLLOUT:
                self._desired = ROLLOUT
                return
            self._desired = ROLLOUT
        if self.trainer is not None:
            self.trainer.stop(timeout=self.stop_timeout_s)

    def _settle(self) -> None:
        """Flip observed to rollout once a stop asked for has completed (call under _state)."""
        trainer = self.trainer
        busy = trainer is not None and trainer.state in ("training", "stopping")
        if self._desired == ROLLOUT and self._observed == DRAFTER_TRAIN and not busy:
            self._observed, self._since = ROLLOUT, self.clock()

    # --- publishing -------------------------------------------------------------------------

    def submit_candidate(self) -> Candidate | None:
        """Judge the trained drafter, then revert it or submit it for this window's merge (once
        per window: the driver and the harvest coordinator both end a window with
        ``rollout``); None if nothing was trained, the gate dropped it or no registry is set."""
        if self.cycle is None:
            return None
        return self.cycle.submit(self.name, self.policy_version, self.name)

    # --- status -----------------------------------------------------------------------------

    def activity(self) -> tuple[Activity, Activity, float, bool, float | None]:
        """(desired, observed, since, generating, idle_since) under the state lock."""
        with self._state:
            self._settle()
            return self._desired, self._observed, self._since, self._generating, self._idle_since

    def status(self) -> dict[str, Any]:
        """The ``GET /v1/status`` body (camelCase keys)."""
        desired, observed, since, generating, idle_since = self.activity()
        trainer = self.trainer.status() if self.trainer is not None else None
        if generating:
            state = "generating"
        elif observed == DRAFTER_TRAIN and trainer is not None and trainer.state != "idle":
            state = trainer.state  # training, stopping or failed
        else:
            state = "idle"
        now = self.clock()
        return {
            "worker": self.name,
            "state": state,
            "role": {"desired": desired, "observed": observed, "since": since},
            "generating": generating,
            "running": self.engine.running,
            "waiting": self.engine.waiting,
            "idleSince": idle_since,
            "idleSeconds": None if idle_since is None else max(0.0, now - idle_since),
            "versions": {
                "policy": self.policy_version,
                "drafter": self.drafter_version,
                "step": self.step,
            },
            "buffer": self.buffer.stats(),
            "trainer": trainer.to_dict() if trainer is not None else None,
            "acceptance": self.acceptance.snapshot(),
        }
