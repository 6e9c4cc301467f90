"""The rollout worker's state: what it does with its GPU (rollout or drafter-train) and why.

:class:`RolloutWorker` is the object every front end drives: the HTTP control surface
(``rollout/http.py``) maps ``PUT /v1/role`` to its :attr:`RolloutWorker.role` and
``GET /v1/status`` to :meth:`RolloutWorker.status` (a typed ``RolloutWorkerStatus``); the
generation endpoint (``rollout/service.py``) calls :meth:`RolloutWorker.generate`. It owns the
engine (torch or vLLM), the capture buffer (``spot/buffer.py``), the spot trainer
(``spot/trainer.py``), the acceptance tracker and optionally a drafter registry
(:class:`~longtail_workers.drafter.registry.DrafterStore`: a shared directory, or the trainer's HTTP
exchange in ``drafter/exchange.py``).

Its role (``rollout`` or ``drafter-train``) is the harvested worker's one state machine
(``spot/harvested.py``), which only the harvest loop switches; this worker fills its hooks:
``drafter-train`` is refused (409) while generating, before any data was captured, when
training is disabled, or after the spot trainer failed; a window trains on top of the newest
published drafter version; the window cycle (``spot/cycle.py``) gates and submits its drafter
when the window ends. A generate call that reaches the worker in ``drafter-train`` (prompts
re-dispatched after another worker was lost) ends the window itself first (bounded wait,
candidate submitted), then generates: its own work comes first, and no role change is sent
over HTTP; a window that does not stop in time answers 409 and the trainer's pool retries the
shard. The newest published drafter is loaded at the start of each ``generate`` call, never
mid-sequence. When the trainer's drafter exchange cannot be reached (after its bounded retries),
the worker logs it and goes on with the drafter it has: speculative decoding stays lossless with
any drafter. What is this worker's own is how the buffer fills: by generating.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry

from longtail_api.harvest import DRAFTER_TRAIN, Activity
from longtail_api.policies import DrafterTrainingSpec
from longtail_api.workerapi import RolloutWorkerStatus, WorkerState, WorkerVersions
from longtail_workers.drafter.exchange import DrafterExchangeError
from longtail_workers.drafter.model import EagleDrafter, layout_options
from longtail_workers.drafter.registry import DrafterStore
from longtail_workers.engine.interface import GenerationRequest, GenerationResult, RolloutEngine
from longtail_workers.rollout.metrics import WorkerCollector, role_switch_histogram
from longtail_workers.spot.acceptance import INITIAL_DRAFTER, AcceptanceTracker
from longtail_workers.spot.buffer import RolloutBuffer
from longtail_workers.spot.cycle import RoleConflictError, WindowCycle, newest_drafter
from longtail_workers.spot.harvested import HarvestedRole
from longtail_workers.spot.trainer import EmptyBufferError, SpotTrainer

log = logging.getLogger(__name__)

ROLLOUT: Activity = "rollout"


class RolloutWorker:
    """Engine, buffer, spot trainer and the harvested role (see the module text)."""

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
        self._state = threading.Lock()  # generating/idle_since
        self._gen_lock = threading.Lock()  # one generate at a time
        self._generating = False
        self._idle_since: float | None = clock()  # None while generating
        self.metrics_registry = CollectorRegistry()
        switches = role_switch_histogram(self.metrics_registry)
        self.role = HarvestedRole(
            self, self.cycle, name=name, own=ROLLOUT, who="a rollout worker",
            switch_timeout_s=stop_timeout_s, clock=clock,
            on_switch=lambda role, seconds: switches.labels(role=role).observe(seconds),
        )  # fmt: skip
        """rollout or drafter-train, switched by the harvest loop (``spot/harvested.py``)."""
        self.metrics_registry.register(WorkerCollector(self))
        self.metrics_registry.register(self.acceptance)

    # --- generation -------------------------------------------------------------------------

    def generate(
        self, requests: Sequence[GenerationRequest], *, step: int | None = None
    ) -> list[GenerationResult]:
        """Generate, capture for the drafter, record acceptance; a drafter-train window is
        ended first (see the module text)."""
        with self._gen_lock:
            with self._state:  # from here on drafter-train is refused (the refusal hook)
                self._generating, self._idle_since = True, None
            try:
                if not self.role.reclaim(self.stop_timeout_s):
                    raise RoleConflictError(
                        f"worker {self.name}'s drafter training did not stop within "
                        f"{self.stop_timeout_s:g} s; retry the generate call"
                    )
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

    # --- roles (the hooks of spot/harvested.py) --------------------------------------------

    def refusal(self) -> str | None:
        """Why ``drafter-train`` cannot start now; None when it can."""
        if self.trainer is None:
            return (
                "drafter training is disabled on this worker (drafterTraining.enabled=false); "
                "it can only do rollout"
            )
        with self._state:
            generating = self._generating
        if generating:
            return (
                f"worker {self.name} is generating ({self.engine.running} sequences running, "
                f"{self.engine.waiting} waiting); it can train once its rollout share is done"
            )
        if self.trainer.state == "failed":
            return (
                f"the spot trainer failed ({self.trainer.status().error}); see the worker log, "
                "fix the cause and restart the worker"
            )
        if len(self.buffer) == 0:
            return (
                "no rollout data captured yet: the drafter has nothing to train on; assign "
                "drafter-train after this worker has generated"
            )
        return None

    def start_window(self) -> None:
        """Train on top of the newest published version; an unreachable exchange is logged and
        the window trains on the version it has (speculative decoding stays lossless)."""
        assert self.trainer is not None and self.cycle is not None  # refusal() checked it
        try:
            self.cycle.sync_base()
        except DrafterExchangeError as exc:
            log.warning("training on drafter version %s: %s", self.cycle.spot.base_version, exc)
        try:
            self.trainer.start()
        except EmptyBufferError as exc:
            raise RoleConflictError(str(exc)) from exc

    def stop_window(self, timeout_s: float) -> bool:
        """Stop the spot trainer between optimizer steps; True once it stopped."""
        return self.trainer is None or self.trainer.stop(timeout=timeout_s)

    # --- status -----------------------------------------------------------------------------

    def status(self) -> RolloutWorkerStatus:
        """The ``GET /v1/status`` body."""
        role = self.role.activity()
        with self._state:
            generating, idle_since = self._generating, self._idle_since
        trainer = self.trainer.status() if self.trainer is not None else None
        state: WorkerState = "idle"
        if generating:
            state = "generating"
        elif role.observed == DRAFTER_TRAIN and trainer is not None and trainer.state != "idle":
            state = trainer.state  # training, stopping or failed
        return RolloutWorkerStatus(
            worker=self.name,
            state=state,
            role=role,
            generating=generating,
            running=self.engine.running,
            waiting=self.engine.waiting,
            idle_since=idle_since,
            idle_seconds=None if idle_since is None else max(0.0, self.clock() - idle_since),
            versions=WorkerVersions(self.policy_version, self.drafter_version, self.step),
            buffer=self.buffer.stats(),
            trainer=trainer,
            acceptance=self.acceptance.snapshot(),
        )
