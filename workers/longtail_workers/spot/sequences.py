"""Drafter windows on given answers: the capture of the roles that do not generate.

A rollout worker captures the policy's hidden states while it generates. Two roles train the
drafter on answers they did not generate themselves, and both go through :class:`SequenceWindows`:

- the trainer's own drafter training (``trainer/drafter_window.py``): during a rollout, on the
  previous step's answers, in a background thread it can preempt;
- the dedicated drafter worker (``drafter_worker/worker.py``, ``spec.drafter``): on every
  completed step's answers, fetched from the trainer's ``GET /v1/samples/latest``.

One window, as both run it: :meth:`SequenceWindows.set_samples` (the answers, as prompt + output
token ids) -> :meth:`~SequenceWindows.capture` (last-layer hidden states recomputed with the
loaded policy by :func:`~longtail_workers.engine.target.response_states`, i.e. what the rollout
engine returns with ``return_hidden_states``, fed through the same ``RolloutBuffer.add_results``
a rollout worker uses, so the training pairs equal a worker's capture) -> the window cycle every
harvested worker runs (:attr:`SequenceWindows.cycle`, ``spot/cycle.py``): ``sync_base`` (train
on top of the newest published drafter version) -> :meth:`~SequenceWindows.start` (the shared
:class:`~longtail_workers.spot.trainer.SpotTrainer`, same spec settings) -> the caller stops it
-> ``submit`` (the quality gate of ``spot/trainer.py``, then the window's drafter goes to the
registry, a directory or the trainer's HTTP exchange, as a candidate that the step driver merges
with every other worker's). Capturing given answers is this module's part of the cycle.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from longtail_api.drafterstatus import DrafterTrainingStatus
from longtail_api.policies import DrafterTrainingSpec
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.registry import DrafterStore
from longtail_workers.engine.interface import GenerationResult
from longtail_workers.engine.target import response_states
from longtail_workers.spot.buffer import RolloutBuffer
from longtail_workers.spot.cycle import WindowCycle
from longtail_workers.spot.trainer import SpotTrainer

log = logging.getLogger(__name__)


class SampleTokens(Protocol):
    """What a window needs of an answer (``wire/rollout.py``'s ``Sample`` and
    ``wire/samples.py``'s ``StepSequence`` have it)."""

    @property
    def request_id(self) -> str | None: ...

    @property
    def prompt_token_ids(self) -> Sequence[int]: ...

    @property
    def output_token_ids(self) -> Sequence[int]: ...


@dataclass(frozen=True)
class PendingAnswer:
    """One answer waiting for its hidden states."""

    request_id: str | None
    """The generate request's id (kept in the buffer for tracing)."""
    prompt: tuple[int, ...]
    """Prompt token ids."""
    output: tuple[int, ...]
    """Generated token ids."""


class SequenceWindows:
    """Capture -> train -> gate -> submit on answers given from outside (see the module text)."""

    def __init__(
        self,
        model: torch.nn.Module,
        drafter: EagleDrafter,
        registry: DrafterStore,
        *,
        target_id: str,
        training: DrafterTrainingSpec,
        max_buffer_bytes: int = 8 << 30,
        capture_batch: int = 8,
        capture_tokens: int = 16384,
    ) -> None:
        if capture_batch < 1 or capture_tokens < 1:
            raise ValueError(
                f"capture_batch={capture_batch}, capture_tokens={capture_tokens}; both must be "
                ">= 1 (sequences and padded tokens per capture forward)"
            )
        self.model, self.registry, self.target_id = model, registry, target_id
        self.buffer = RolloutBuffer(training.buffer_tokens, max_buffer_bytes)
        self.spot = SpotTrainer(drafter, self.buffer, training)
        self.capture_batch, self.capture_tokens = capture_batch, capture_tokens
        self._lock = threading.Lock()  # _pending and _step
        self._pending: deque[PendingAnswer] = deque()
        self._step = 0
        self.cycle = WindowCycle(self.spot, registry, model, target_id=target_id)
        """Sync, gate and submission: the cycle every harvested worker runs."""
        self.captured_sequences = 0
        """Answers whose hidden states went into the buffer, over the process's life."""

    def set_samples(self, samples: Sequence[SampleTokens], step: int) -> None:
        """The answers of RL ``step``: the data of the next capture (replaces any not taken)."""
        pending = deque(
            PendingAnswer(s.request_id, tuple(s.prompt_token_ids), tuple(s.output_token_ids))
            for s in samples
        )
        with self._lock:
            self._pending, self._step = pending, step

    @property
    def pending(self) -> int:
        """Answers still waiting for their hidden states."""
        with self._lock:
            return len(self._pending)

    def capture(self, policy_version: int, stop: threading.Event | None = None) -> int:
        """Hidden states of the pending answers under the loaded policy (``policy_version``)
        into the buffer, a batch at a time, checking ``stop`` between batches; returns the
        answers captured."""
        done = 0
        while stop is None or not stop.is_set():
            with self._lock:
                batch, step = self._next_batch(), self._step
            if not batch:
                break
            states = response_states(self.model, [(b.prompt, b.output) for b in batch])
            results = [
                GenerationResult(b.request_id, list(b.prompt), list(b.output), [], "stop", h)
                for b, h in zip(batch, states, strict=True)
            ]
            self.buffer.add_results(results, policy_version=policy_version, step=step)
            done += len(batch)
            self.captured_sequences += len(batch)
        return done

    def _next_batch(self) -> list[PendingAnswer]:
        """Up to ``capture_batch`` pending answers whose padded batch stays within
        ``capture_tokens`` (always at least one); call under ``_lock``."""
        batch: list[PendingAnswer] = []
        width = 0
        while self._pending and len(batch) < self.capture_batch:
            nxt = self._pending[0]
            w = max(width, len(nxt.prompt) + len(nxt.output))
            if batch and (len(batch) + 1) * w > self.capture_tokens:
                break
            batch.append(self._pending.popleft())
            width = w
        return batch

    def start(self, max_steps: int | None = None) -> int:
        """Start a training window in the background; its step budget, 0 when the buffer holds
        no answer long enough to train on (nothing started)."""
        if len(self.buffer) == 0:
            return 0
        return self.spot.start(max_steps)

    def status(self) -> DrafterTrainingStatus:
        """The ``drafterTraining`` of the trainer's or the drafter worker's status."""
        return DrafterTrainingStatus(
            self.buffer.stats(), self.spot.status(), self.pending, self.captured_sequences
        )
