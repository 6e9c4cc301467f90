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
  (``drafter-train`` or ``train``; refused with :class:`RoleConflictError`, HTTP 409, outside a
  rollout, i.e. while the trainer updates the policy), ``GET /v1/status`` ->
  :meth:`TrainerHarvest.activity` and :meth:`TrainerHarvest.status`. The local coordinator and
  the operator's harvest loop decide when, with the shared ``longtail_api.harvest.decide``.

Data: a drafter-train window runs in a background thread. It first computes, with the current
policy (the version the rollout workers are sampling with now; no grad), the last-layer hidden
states of the previous step's sequences (:func:`engine_hidden_states`: the states the rollout
engine returns with ``return_hidden_states``) and feeds them through the same
``RolloutBuffer.add_results`` a rollout worker uses, so the training pairs are identical to a
worker's capture; then the same :class:`~longtail_workers.spot.trainer.SpotTrainer` (same spec
settings) trains on top of the newest published drafter version. The thread checks for a stop
between capture batches, the spot trainer between optimizer steps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from longtail_api.harvest import DRAFTER_TRAIN, Activity
from longtail_api.policies import DrafterTrainingSpec
from longtail_api.spec import RLJobSpec
from longtail_api.workerapi import TRAINER_ACTIVITIES, RoleAck, RoleState
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.interface import GenerationResult
from longtail_workers.rollout.control import RoleConflictError, check_activity
from longtail_workers.spot.buffer import RolloutBuffer
from longtail_workers.spot.publish import Candidate, DrafterRegistry
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


class SampleTokens(Protocol):
    """What the trainer keeps of an answer (``rollout.wire.Sample`` has it)."""

    @property
    def request_id(self) -> str | None: ...

    @property
    def prompt_token_ids(self) -> Sequence[int]: ...

    @property
    def output_token_ids(self) -> Sequence[int]: ...


@dataclass(frozen=True)
class _Pending:
    request_id: str | None
    prompt: tuple[int, ...]
    output: tuple[int, ...]


@torch.no_grad()
def engine_hidden_states(
    model: torch.nn.Module, sequences: Sequence[tuple[Sequence[int], Sequence[int]]]
) -> list[torch.Tensor]:
    """Per ``(prompt, output)``: ``[len(output), H]`` last-layer states (post final norm) that
    produced each output token, i.e. ``GenerationResult.hidden_states`` of the rollout engine.

    One uncached forward of ``prompt + output[:-1]`` per row (right-padded batch): state ``i``
    is the one at absolute position ``len(prompt) - 1 + i``.
    """
    if not sequences:
        return []
    if any(len(p) == 0 for p, _ in sequences):
        raise ValueError("engine_hidden_states: every sequence needs at least one prompt token")
    rows = [[*p, *o[:-1]] for p, o in sequences]
    width = max(len(r) for r in rows)
    device = next(model.parameters()).device
    ids = torch.zeros((len(rows), width), dtype=torch.long, device=device)  # [B, L]
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)  # [B, L]
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    decoder: Any = model.get_decoder()  # type: ignore[operator]
    hidden = decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    out = []
    for i, (prompt, output) in enumerate(sequences):
        start = len(prompt) - 1
        out.append(hidden[i, start : start + len(output)].clone())  # [T_out, H]
    return out


class TrainerHarvest:
    """The trainer's drafter-train windows and role state (see the module text)."""

    def __init__(
        self,
        model: torch.nn.Module,
        drafter: EagleDrafter,
        registry: DrafterRegistry,
        *,
        target_id: str,
        training: DrafterTrainingSpec,
        max_buffer_bytes: int = 8 << 30,
        capture_batch: int = 8,
        capture_tokens: int = 16384,
        switch_timeout_s: float = 5.0,
        stop_timeout_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if capture_batch < 1 or capture_tokens < 1:
            raise ValueError(
                f"capture_batch={capture_batch}, capture_tokens={capture_tokens}; both must be "
                ">= 1 (sequences and padded tokens per capture forward)"
            )
        self.model, self.registry, self.target_id = model, registry, target_id
        self.buffer = RolloutBuffer(training.buffer_tokens, max_buffer_bytes)
        self.spot = SpotTrainer(drafter, self.buffer, training)
        self.capture_batch, self.capture_tokens, self.clock = capture_batch, capture_tokens, clock
        self.switch_timeout_s, self.stop_timeout_s = switch_timeout_s, stop_timeout_s
        self._lock = threading.Lock()  # the fields below
        self._role_lock = threading.Lock()  # one role change (or rollout end) at a time
        self._desired: Activity = TRAIN
        self._observed: Activity = TRAIN
        self._since = clock()
        self._rollout_active = False
        self._policy_version = 0
        self._pending: deque[_Pending] = deque()
        self._samples_step = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._harvested_total = 0.0
        self._harvested_rollout = 0.0
        self._submitted_at = 0  # spot.total_steps when the last candidate was submitted
        self.error: str | None = None
        self.captured_sequences = 0
        self.last_candidate: Candidate | None = None

    # --- the step driver ----------------------------------------------------------------------

    def set_samples(self, samples: Sequence[SampleTokens], step: int) -> None:
        """The answers of ``step`` (just trained on): the data of the next windows."""
        pending = deque(
            _Pending(s.request_id, tuple(s.prompt_token_ids), tuple(s.output_token_ids))
            for s in samples
        )
        with self._lock:
            self._pending, self._samples_step = pending, step

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
        if not self._pending and len(self.buffer) == 0:
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
            self._capture()
            if self._stop.is_set():
                return
            self._sync_base()
            if len(self.buffer) == 0:
                log.info("trainer harvest: no answer long enough to train on; window ends")
                return
            steps = self.spot.start()
            log.info("trainer harvest: training the drafter (up to %d steps)", steps)
        except Exception as exc:  # surfaced in the status and in later 409s
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("trainer harvest: drafter-train window failed")

    def _capture(self) -> None:
        """Hidden states of the pending answers into the buffer, a batch at a time."""
        while not self._stop.is_set():
            with self._lock:
                batch = self._next_batch()
                step, version = self._samples_step, self._policy_version
            if not batch:
                return
            states = engine_hidden_states(self.model, [(b.prompt, b.output) for b in batch])
            results = [
                GenerationResult(b.request_id, list(b.prompt), list(b.output), [], "stop", h)
                for b, h in zip(batch, states, strict=True)
            ]
            self.buffer.add_results(results, policy_version=version, step=step)
            self.captured_sequences += len(batch)

    def _next_batch(self) -> list[_Pending]:
        """Up to ``capture_batch`` pending answers whose padded batch stays within
        ``capture_tokens`` (always at least one); call under ``_lock``."""
        batch: list[_Pending] = []
        width = 0
        while self._pending and len(batch) < self.capture_batch:
            nxt = self._pending[0]
            w = max(width, len(nxt.prompt) + len(nxt.output))
            if batch and (len(batch) + 1) * w > self.capture_tokens:
                break
            batch.append(self._pending.popleft())
            width = w
        return batch

    def _sync_base(self) -> None:
        """Train on top of the newest published version (keeps the optimizer's moments)."""
        latest = self.registry.latest_version()
        if latest is None or latest == self.spot.base_version:
            return
        drafter, _ = self.registry.load(self.model, target_id=self.target_id, version=latest)
        self.spot.load_weights(drafter.trainable_state_dict(), base_version=latest)
        self._submitted_at = self.spot.total_steps

    def _submit(self) -> Candidate | None:
        """Submit the drafter trained since the last submission as candidate ``trainer``."""
        spot = self.spot
        if spot.pairs_since_base == 0 or spot.total_steps == self._submitted_at:
            return None
        verdict = spot.judge_against_base()
        if not verdict.keep:
            spot.revert_to_base()
            self._submitted_at = spot.total_steps
            log.info("trainer harvest: drafter window dropped, held-out top-1 %.3f < %.3f of "
                     "base version %s", verdict.trained_top1, verdict.base_top1,
                     spot.base_version)  # fmt: skip
            return None
        window = spot.last_window
        cand = self.registry.submit_candidate(
            spot.drafter_copy(),
            worker=WORKER_NAME,
            base_version=spot.base_version,
            policy_version=max(spot.policy_versions_seen, default=self._policy_version),
            tokens=spot.pairs_since_base,
            steps=spot.total_steps,
            train_loss=window.mean_loss if window is not None else None,
            heldout_top1=verdict.trained_top1,
        )
        self._submitted_at = spot.total_steps
        self.last_candidate = cand
        log.info("trainer harvest: drafter candidate submitted (base %s, %d pairs, %d steps)",
                 cand.base_version, cand.tokens, cand.steps)  # fmt: skip
        return cand

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
        with self._lock:
            pending = len(self._pending)
        return {
            "buffer": self.buffer.stats(),
            "trainer": self.spot.status().to_dict(),
            "pendingSequences": pending,
            "capturedSequences": self.captured_sequences,
            "error": self.error,
        }


def build_trainer_harvest(
    spec: RLJobSpec, model: torch.nn.Module, registry: DrafterRegistry
) -> TrainerHarvest:
    """The trainer's harvest for ``spec`` on the live policy ``model`` (shared embedding and LM
    head, as a rollout worker's drafter shares its engine's), starting from the job's initial
    drafter."""
    from longtail_workers.runtime import initial_drafter

    target_id = spec.model.path
    return TrainerHarvest(
        model,
        initial_drafter(spec, model, target_id),
        registry,
        target_id=target_id,
        training=spec.drafter_training,
    )
