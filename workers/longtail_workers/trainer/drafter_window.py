"""Drafter training on the trainer's own idle time during rollout (disaggregated placement).

In disaggregated placement the trainer's GPUs wait through every rollout. :class:`TrainerHarvest`
turns that wait into drafter training, as an idle rollout worker does, when the job asks for it:
``harvest.enabled``, ``drafterTraining.enabled`` and ``trainer`` in ``harvest.eligibleRoles``
(:func:`trainer_harvest_enabled`; otherwise nothing here is built and the trainer behaves as
before). Who calls it:

- the step driver (``driver.py``): :meth:`TrainerHarvest.begin_rollout` before a step's rollout,
  :meth:`TrainerHarvest.end_rollout` after it and before the policy update (training is
  preempted with a bounded wait and the window's drafter is submitted to the registry as the
  candidate of worker ``trainer``, which ``_merge_drafters`` merges with the rollout workers'
  candidates), and :meth:`TrainerHarvest.set_samples` after the update (that step's prompt +
  response tokens: the next window's data);
- the trainer's HTTP surface (``service.py``): ``PUT /v1/role`` -> :meth:`TrainerHarvest.set_role`
  (``drafter-train`` or ``train``; refused with ``RoleConflictError``, HTTP 409, outside a
  rollout, i.e. while the trainer updates the policy), ``GET /v1/status`` ->
  :meth:`TrainerHarvest.activity` and :meth:`TrainerHarvest.status`. The local coordinator and
  the operator's harvest loop decide when, with the shared ``longtail_api.harvest.decide``.

Data: a drafter-train window runs in a background thread through the shared
:class:`~longtail_workers.spot.sequences.SequenceWindows` (the dedicated drafter worker uses the
same one; its sync, gate and submission are the window cycle of ``spot/cycle.py`` that a rollout
worker runs too, and the role errors and checks come from there): it first computes, with the
current policy (the version the rollout workers are sampling with now; no grad), the last-layer
hidden states of the previous step's sequences and feeds them to the same
``RolloutBuffer.add_results`` a rollout worker uses, so the training pairs are identical to a
worker's capture; then the same :class:`~longtail_workers.spot.trainer.SpotTrainer` (same spec
settings) trains on top of the newest published drafter version. The thread checks for a stop
between capture batches, the spot trainer between optimizer steps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from longtail_api.harvest import DRAFTER_TRAIN, Activity
from longtail_api.spec import RLJobSpec
from longtail_api.workerapi import TRAINER_ACTIVITIES, RoleAck, RoleState
from longtail_workers.drafter.registry import Candidate, DrafterRegistry, DrafterStore
from longtail_workers.spot.buffer import RolloutBuffer
from longtail_workers.spot.cycle import RoleConflictError, check_activity
from longtail_workers.spot.sequences import SampleTokens, SequenceWindows
from longtail_workers.spot.trainer import SpotTrainer

log = logging.getLogger(__name__)

TRAIN: Activity = "train"
WORKER_NAME = "trainer"
"""The trainer's name in the drafter registry (its candidates) and in the harvest views."""


def trainer_harvest_enabled(spec: RLJobSpec) -> bool:
    """Whether the job asks the trainer to train the drafter while it waits for rollouts."""
    return (
        spec.harvest.enabled
        and spec.drafter_training.enabled
        and "trainer" in spec.harvest.eligible_roles
    )


def check_trainer_role(role: object) -> Activity:
    """``role`` as a trainer activity: :class:`InvalidRoleError` (HTTP 400) for a value that is
    no activity at all, :class:`RoleConflictError` (409) for one the trainer cannot take."""
    return check_activity(role, TRAINER_ACTIVITIES, "the trainer")


class TrainerHarvestError(RuntimeError):
    """Drafter training did not stop in time, so the policy update cannot start safely."""


class TrainerHarvest:
    """The trainer's drafter-train windows and role state (see the module text)."""

    def __init__(
        self,
        windows: SequenceWindows,
        *,
        clock: Callable[[], float] = time.time,
        switch_timeout_s: float = 5.0,
        stop_timeout_s: float = 60.0,
    ) -> None:
        self.windows, self.clock = windows, clock
        """Capture, training, gate and submission (shared with the drafter worker)."""
        self.registry: DrafterStore = windows.registry
        """Where the windows' candidates go (the trainer's own drafter registry)."""
        self.switch_timeout_s, self.stop_timeout_s = switch_timeout_s, stop_timeout_s
        self._lock = threading.Lock()  # the fields below
        self._role_lock = threading.Lock()  # one role change (or rollout end) at a time
        self._desired: Activity = TRAIN
        self._observed: Activity = TRAIN
        self._since = clock()
        self._rollout_active = False
        self._policy_version = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._harvested_total = 0.0
        self._harvested_rollout = 0.0
        self.error: str | None = None

    @property
    def buffer(self) -> RolloutBuffer:
        """The capture buffer the windows train from."""
        return self.windows.buffer

    @property
    def spot(self) -> SpotTrainer:
        """The spot trainer (the drafter and its optimizer)."""
        return self.windows.spot

    @property
    def captured_sequences(self) -> int:
        """Answers whose hidden states were captured so far."""
        return self.windows.captured_sequences

    @property
    def last_candidate(self) -> Candidate | None:
        """The newest candidate this trainer submitted."""
        return self.windows.last_candidate

    # --- the step driver ----------------------------------------------------------------------

    def set_samples(self, samples: Sequence[SampleTokens], step: int) -> None:
        """The answers of ``step`` (just trained on): the data of the next windows."""
        self.windows.set_samples(samples, step)

    def begin_rollout(self, policy_version: int) -> None:
        """A rollout with ``policy_version`` starts: ``drafter-train`` may be assigned now."""
        with self._lock:
            self._rollout_active, self._policy_version = True, policy_version
            self._harvested_rollout = 0.0

    def end_rollout(self) -> float:
        """The rollout ended: stop training (bounded wait), submit the window's drafter; returns
        the seconds harvested during this rollout. Raises :class:`TrainerHarvestError` when the
        training does not stop within ``stop_timeout_s``."""
        with self._lock:
            self._rollout_active = False  # from here on drafter-train is refused
        with self._role_lock:
            with self._lock:
                self._desired = TRAIN
            if not self._finish_window(self.stop_timeout_s):
                raise TrainerHarvestError(
                    f"the trainer's drafter training did not stop within {self.stop_timeout_s:g}"
                    " s, so the policy update cannot start (it would change the weights under "
                    "it); see the trainer log for a stuck capture or spot trainer step"
                )
            self._submit()
        with self._lock:
            seconds, self._harvested_rollout = self._harvested_rollout, 0.0
        return seconds

    def close(self) -> None:
        """Stop any window (the trainer is exiting); nothing is submitted."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.switch_timeout_s)
        self.spot.stop(timeout=self.switch_timeout_s)

    # --- roles --------------------------------------------------------------------------------

    def set_role(self, role: object) -> RoleAck:
        """``PUT /v1/role``; raises :class:`InvalidRoleError` (400) or
        :class:`RoleConflictError` (409)."""
        started = time.perf_counter()
        role = check_trainer_role(role)
        with self._role_lock:
            if role == DRAFTER_TRAIN:
                self._to_training()
            else:
                self._to_train()
            with self._lock:
                return RoleAck(
                    desired=self._desired,
                    observed=self._observed,
                    since=self._since,
                    pending=self._desired != self._observed,
                    switch_seconds=time.perf_counter() - started,
                )

    def _to_training(self) -> None:
        with self._lock:
            if self._observed == DRAFTER_TRAIN:
                if self._desired == DRAFTER_TRAIN:
                    return  # already training (or its window ended): acknowledge as is
                raise RoleConflictError(
                    "the trainer is still stopping its last drafter-train window; retry"
                )
            self._check_can_train()
            self._desired = self._observed = DRAFTER_TRAIN
            self._since = self.clock()
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._window, name="trainer-harvest", daemon=True
            )
            self._thread.start()

    def _check_can_train(self) -> None:
        """Refusals of ``drafter-train`` (call under ``_lock``); each says why and what to do."""
        if not self._rollout_active:
            raise RoleConflictError(
                "the trainer is not waiting for a rollout (it is updating the policy, "
                "evaluating or checkpointing); it trains the drafter only during a step's "
                "rollout, assign drafter-train then"
            )
        error = self.error or self.spot.status().error
        if error is not None:
            raise RoleConflictError(
                f"the trainer's drafter training failed ({error}); see the trainer log, "
                "fix the cause and restart the trainer"
            )
        if self.spot.state in ("training", "stopping"):
            raise RoleConflictError(
                f"the trainer's spot trainer is {self.spot.state}; retry in a moment"
            )
        if self.windows.pending == 0 and len(self.buffer) == 0:
            raise RoleConflictError(
                "nothing to train on yet: the trainer learns from the previous step's answers "
                "and no step has completed since it started; assign drafter-train from the "
                "next rollout on"
            )

    def _to_train(self) -> None:
        with self._lock:
            self._desired = TRAIN
            if self._observed == TRAIN:
                return
        if self._finish_window(self.switch_timeout_s):
            self._submit()

    def _finish_window(self, timeout_s: float) -> bool:
        """Stop the window's thread and spot trainer; True once both stopped (then observed
        flips to ``train`` and the window's seconds are booked)."""
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                return False
        if not self.spot.stop(timeout=max(0.0, deadline - time.monotonic())):
            return False
        with self._lock:
            if self._observed == DRAFTER_TRAIN:
                now = self.clock()
                seconds = max(0.0, now - self._since)
                self._harvested_total += seconds
                self._harvested_rollout += seconds
                self._observed, self._since = TRAIN, now
        return True

    # --- the window thread --------------------------------------------------------------------

    def _window(self) -> None:
        try:
            with self._lock:
                version = self._policy_version
            self.windows.capture(version, self._stop)
            if self._stop.is_set():
                return
            self.windows.sync_base()
            steps = self.windows.start()
            if steps == 0:
                log.info("trainer harvest: no answer long enough to train on; window ends")
                return
            log.info("trainer harvest: training the drafter (up to %d steps)", steps)
        except Exception as exc:  # surfaced in the status and in later 409s
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("trainer harvest: drafter-train window failed")

    def _submit(self) -> Candidate | None:
        """Submit the drafter trained since the last submission as candidate ``trainer``."""
        with self._lock:
            version = self._policy_version
        return self.windows.submit(WORKER_NAME, version, "trainer harvest")

    # --- status -------------------------------------------------------------------------------

    def activity(self) -> RoleState:
        """The trainer's role as its status reports it."""
        with self._lock:
            return RoleState(self._desired, self._observed, self._since)

    @property
    def harvested_seconds(self) -> float:
        """Seconds spent in drafter-train over the run, the current window included."""
        with self._lock:
            ongoing = self.clock() - self._since if self._observed == DRAFTER_TRAIN else 0.0
            return self._harvested_total + max(0.0, ongoing)

    def status(self) -> dict[str, Any]:
        """Plain JSON for ``TrainerStatus.drafter_training`` (camelCase keys)."""
        return {**self.windows.status(), "error": self.error}


def build_trainer_harvest(
    spec: RLJobSpec, model: torch.nn.Module, registry: DrafterRegistry
) -> TrainerHarvest:
    """The trainer's harvest for ``spec`` on the live policy ``model`` (shared embedding and LM
    head, as a rollout worker's drafter shares its engine's), starting from the job's initial
    drafter."""
    from longtail_workers.runtime import initial_drafter

    target_id = spec.model.path
    drafter = initial_drafter(spec, model, target_id)
    return TrainerHarvest(
        SequenceWindows(
            model, drafter, registry, target_id=target_id, training=spec.drafter_training
        )
    )
