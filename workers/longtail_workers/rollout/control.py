"""The rollout worker's state: what it does with its GPU (rollout or drafter-train) and why.

:class:`RolloutWorker` is the object every front end drives: the HTTP control surface
(``rollout/http.py``) maps ``PUT /v1/role`` to its :attr:`RolloutWorker.role` and ``GET
/v1/status`` to :meth:`RolloutWorker.status` (a typed ``RolloutWorkerStatus``); the generation
endpoint (``rollout/service.py``) calls :meth:`RolloutWorker.generate_call`. It owns the engine
(torch or vLLM), the capture buffer (``spot/buffer.py``), the spot trainer
(``spot/trainer.py``), the acceptance tracker, optionally a drafter registry
(:class:`~longtail_workers.drafter.registry.DrafterStore`: a shared directory, or the trainer's
HTTP exchange in ``drafter/exchange.py``) and optionally its weight source
(:class:`~longtail_workers.weights.sync.WeightSource`, ``runtime.make_weight_source``): a
generate call first loads the policy version it names from it
(:meth:`RolloutWorker.ensure_policy`), so one call never mixes versions; calls run one at a
time, so a call the trainer abandoned (its worker declared hung) ends under its own version
before the next one loads another.

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
from longtail_workers.engine.stats import RolloutStats
from longtail_workers.rollout.metrics import WorkerCollector, role_switch_histogram
from longtail_workers.spot.acceptance import INITIAL_DRAFTER, AcceptanceTracker
from longtail_workers.spot.buffer import RolloutBuffer
from longtail_workers.spot.cycle import RoleConflictError, WindowCycle, newest_drafter
from longtail_workers.spot.harvested import HarvestedRole
from longtail_workers.spot.trainer import EmptyBufferError, SpotTrainer
from longtail_workers.weights.sync import WeightSource, WeightSyncError, WeightVersionError
from longtail_workers.wire.rollout import EngineDelta, GenerateCall, GenerateReply, Sample

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
        weights: WeightSource | None = None,
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
        initial = drafter or engine.drafter
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
        self.weights = weights
        """Where the policy versions the generate calls name come from (None: the worker keeps
        the weights it loaded, and a call naming another version is refused)."""
        self._state = threading.Lock()  # generating/idle_since
        self._gen_lock = threading.Lock()  # one generate at a time
        self._load_lock = threading.Lock()
        self._call_lock = threading.Lock()
        """One generate call at a time, its policy load included (see the module text)."""
        self._unreported_load: tuple[int, float] = (-1, 0.0)
        """(version, seconds) of the last policy load no generate reply has reported yet."""
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

    # --- generate calls ---------------------------------------------------------------------

    def generate_call(self, call: GenerateCall) -> GenerateReply:
        """Load the policy version ``call`` names, generate, and reply with the engine's
        figures for the call (one call at a time)."""
        with self._call_lock:
            held, t_load = self.policy_version, time.perf_counter()
            self.ensure_policy(call.policy_version)
            if held != call.policy_version:
                # Kept until a reply carries it: a call refused after the load (the worker was
                # harvested meanwhile, 409) must not lose the pause it caused to the retried call.
                self._unreported_load = (call.policy_version, time.perf_counter() - t_load)
            self.begin_step(call.step, call.policy_version)
            # The counters so far (not a deep copy: a profiling recorder's step list stays out)
            before = self.engine.stats.since(RolloutStats())
            t0 = time.perf_counter()
            results = self.generate(call.requests, step=call.step)
            seconds = time.perf_counter() - t0
            version, load_s = self._unreported_load
            self._unreported_load = (-1, 0.0)
            # The rollout pause this call caused: obtaining and loading the version it names
            # (0 when held already); the trainer books it per version (trainer/syncbook.py).
            load_s = load_s if version == call.policy_version else 0.0
            engine = EngineDelta.of(self.engine.stats.since(before), seconds, load_s)
            samples = [Sample.of(r) for r in results]
            return GenerateReply(
                self.name, self.policy_version, self.drafter_version, samples, engine
            )

    def ensure_policy(self, version: int, timeout_s: float = 120.0) -> None:
        """Load policy ``version`` whole from :attr:`weights` (or raise, leaving the model as
        it was); retried until ``timeout_s`` while the source is not ready."""
        with self._load_lock:
            if version == self.policy_version:
                return
            if self.weights is None:
                raise WeightSyncError(
                    f"asked for policy version {version} but this worker has no weight source "
                    f"(it holds version {self.policy_version}); start it with --weights-url"
                )
            deadline = time.monotonic() + timeout_s
            delay = 0.05
            while True:
                try:
                    got = self.weights.load_into(self.engine.target.model, version)
                    self.engine.policy_loaded()  # vLLM: into the live engine, before any rollout
                    break
                except WeightVersionError:
                    raise  # the trainer publishes before it dispatches: missing is an error
                except WeightSyncError as exc:
                    if time.monotonic() + delay > deadline:
                        raise
                    log.info("policy version %d not loadable yet (%s); retrying", version, exc)
                    time.sleep(delay)
                    delay = min(2.0, delay * 2)
            self.policy_version = got

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
