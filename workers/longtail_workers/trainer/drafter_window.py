"""Drafter training on the trainer's own idle time during rollout (disaggregated placement).

In disaggregated placement the trainer's GPUs wait through every rollout.
:class:`TrainerHarvestee` turns that wait into drafter training, as an idle rollout worker does,
when the job asks for it: ``harvest.enabled``, ``drafterTraining.enabled`` and ``trainer`` in
``harvest.eligibleRoles`` (:func:`trainer_harvest_enabled`; otherwise nothing here is built and
the trainer behaves as before). Its role (``train`` or ``drafter-train``) is the harvested
worker's one state machine (``spot/harvested.py``, :attr:`TrainerHarvestee.role`), which only
the harvest loop switches; this module fills its hooks. Who calls it:

- the step driver (``driver.py``): :meth:`TrainerHarvestee.begin_rollout` before a step's
  rollout, :meth:`TrainerHarvestee.end_rollout` after it and before the policy update (the
  trainer takes its GPU back: training is stopped with a bounded wait and the window's drafter
  is submitted to the registry as the candidate of worker ``trainer``, which
  ``_merge_drafters`` merges with the rollout workers' candidates), and
  :meth:`TrainerHarvestee.set_samples` after the update (that step's prompt + response tokens:
  the next window's data);
- the trainer's HTTP surface (``service.py``): ``PUT /v1/role`` -> ``role.set_role``
  (``drafter-train`` or ``train``; refused with ``RoleConflictError``, HTTP 409, outside a
  rollout, i.e. while the trainer updates the policy), ``GET /v1/status`` -> ``role.activity``
  and :meth:`TrainerHarvestee.status`. The local coordinator and the operator's harvest loop
  decide when, with the shared ``longtail_api.harvest.decide``.

Data: a drafter-train window runs in a background thread through the shared
:class:`~longtail_workers.spot.sequences.SequenceWindows` (the dedicated drafter worker uses the
same one; its sync, gate and submission are the window cycle of ``spot/cycle.py`` that a rollout
worker runs too): it first computes, with the current policy (the version the rollout workers
are sampling with now; no grad), the last-layer hidden states of the previous step's sequences
and feeds them to the same ``RolloutBuffer.add_results`` a rollout worker uses, so the training
pairs are identical to a worker's capture; then the same
:class:`~longtail_workers.spot.trainer.SpotTrainer` (same spec settings) trains on top of the
newest published drafter version. The thread checks for a stop between capture batches, the spot
trainer between optimizer steps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from longtail_api.drafterstatus import DrafterTrainingStatus
from longtail_api.harvest import Activity
from longtail_api.spec import RLJobSpec
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.registry import DrafterRegistry, DrafterStore
from longtail_workers.spot.harvested import HarvestedRole
from longtail_workers.spot.sequences import SampleTokens, SequenceWindows

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


class TrainerHarvestError(RuntimeError):
    """Drafter training did not stop in time, so the policy update cannot start safely."""


class TrainerHarvestee:
    """The trainer's hooks of its harvested role and its rollout windows (see the module text)."""

    def __init__(
        self,
        windows: SequenceWindows,
        *,
        clock: Callable[[], float] = time.time,
        switch_timeout_s: float = 5.0,
        stop_timeout_s: float = 60.0,
    ) -> None:
        self.windows = windows
        """Capture, training, gate and submission (shared with the drafter worker)."""
        self.registry: DrafterStore = windows.registry
        """Where the windows' candidates go (the trainer's own drafter registry)."""
        self.stop_timeout_s = stop_timeout_s
        self._lock = threading.Lock()  # rollout state and policy version
        self._rollout_active = False
        self._policy_version = 0
        self._harvested_before = 0.0  # role.harvested_seconds when the rollout began
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.error: str | None = None
        self.role = HarvestedRole(
            self, windows.cycle, name=WORKER_NAME, own=TRAIN, who="the trainer",
            switch_timeout_s=switch_timeout_s, clock=clock,
        )  # fmt: skip
        """train or drafter-train, switched by the harvest loop (``spot/harvested.py``)."""

    # --- the step driver ----------------------------------------------------------------------

    def set_samples(self, samples: Sequence[SampleTokens], step: int) -> None:
        """The answers of ``step`` (just trained on): the data of the next windows."""
        self.windows.set_samples(samples, step)

    def begin_rollout(self, policy_version: int) -> None:
        """A rollout with ``policy_version`` starts: ``drafter-train`` may be assigned now."""
        with self._lock:
            self._rollout_active, self._policy_version = True, policy_version
        self._harvested_before = self.role.harvested_seconds

    def end_rollout(self) -> float:
        """The rollout ended: take the GPU back (bounded wait; the window's drafter is
        submitted); returns the seconds harvested during this rollout. Raises
        :class:`TrainerHarvestError` when the training does not stop within ``stop_timeout_s``."""
        with self._lock:
            self._rollout_active = False  # from here on drafter-train is refused
        if not self.role.reclaim(self.stop_timeout_s):
            raise TrainerHarvestError(
                f"the trainer's drafter training did not stop within {self.stop_timeout_s:g}"
                " s, so the policy update cannot start (it would change the weights under "
                "it); see the trainer log for a stuck capture or spot trainer step"
            )
        return self.role.harvested_seconds - self._harvested_before

    def close(self) -> None:
        """Stop any window (the trainer is exiting); nothing is submitted."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.role.switch_timeout_s)
        self.windows.spot.stop(timeout=self.role.switch_timeout_s)

    # --- the hooks of spot/harvested.py -------------------------------------------------------

    @property
    def policy_version(self) -> int:
        """The policy version of the current rollout (the window's data is sampled with it)."""
        with self._lock:
            return self._policy_version

    def refusal(self) -> str | None:
        """Why ``drafter-train`` cannot start now; None when it can."""
        with self._lock:
            active = self._rollout_active
        if not active:
            return (
                "the trainer is not waiting for a rollout (it is updating the policy, "
                "evaluating or checkpointing); it trains the drafter only during a step's "
                "rollout, assign drafter-train then"
            )
        error = self.error or self.windows.spot.status().error
        if error is not None:
            return (
                f"the trainer's drafter training failed ({error}); see the trainer log, "
                "fix the cause and restart the trainer"
            )
        if self.windows.pending == 0 and len(self.windows.buffer) == 0:
            return (
                "nothing to train on yet: the trainer learns from the previous step's answers "
                "and no step has completed since it started; assign drafter-train from the "
                "next rollout on"
            )
        return None

    def start_window(self) -> None:
        """Capture, then train, in a background thread."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._window, name="trainer-harvest", daemon=True)
        self._thread.start()

    def stop_window(self, timeout_s: float) -> bool:
        """Stop the window's thread and spot trainer; True once both stopped."""
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                return False
        return self.windows.spot.stop(timeout=max(0.0, deadline - time.monotonic()))

    def _window(self) -> None:
        try:
            self.windows.capture(self.policy_version, self._stop)
            if self._stop.is_set():
                return
            self.windows.cycle.sync_base()
            steps = self.windows.start()
            if steps == 0:
                log.info("trainer harvest: no answer long enough to train on; window ends")
                return
            log.info("trainer harvest: training the drafter (up to %d steps)", steps)
        except Exception as exc:  # surfaced in the status and in later 409s
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("trainer harvest: drafter-train window failed")

    # --- status -------------------------------------------------------------------------------

    def status(self) -> DrafterTrainingStatus:
        """``TrainerStatus.drafter_training``."""
        return replace(self.windows.status(), error=self.error)


def build_trainer_harvest(
    spec: RLJobSpec, model: torch.nn.Module, registry: DrafterRegistry, drafter: EagleDrafter
) -> TrainerHarvestee:
    """The trainer's harvest for ``spec`` on the live policy ``model`` (shared embedding and LM
    head, as a rollout worker's drafter shares its engine's), training ``drafter`` (the job's
    initial one, built once by ``trainer/setup.py``)."""
    return TrainerHarvestee(
        SequenceWindows(
            model, drafter, registry, target_id=spec.model.path, training=spec.drafter_training
        )
    )
