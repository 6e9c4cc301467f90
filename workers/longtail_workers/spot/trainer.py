"""The preemptible spot trainer: trains the drafter from the rollout buffer in a background thread.

Driven by the rollout worker (``rollout/control.py``) when the harvest loop switches the worker
to ``drafter-train``: :meth:`SpotTrainer.start` launches a window of at most
``max_steps_per_window`` AdamW steps on the worker's device, with the policy still resident (the
drafter shares the target's embedding and LM head; nothing is reloaded). Switching back to
rollout calls :meth:`SpotTrainer.request_stop` then :meth:`SpotTrainer.wait_stopped`: the thread
checks the stop flag between optimizer steps only, so it stops within one step's time and the
weights are never left half-updated. The optimizer (AdamW moments) lives as long as the trainer:
the next window resumes with it.

Each step samples windows (``windows.py``) uniformly from the buffer's training slice, packs
them into ``rows_per_step`` rows of ``pack_tokens`` pairs and minimises TLT's loss
(``drafter/loss.py``). Every ``holdout_every``-th captured sequence is held out for
:meth:`SpotTrainer.evaluate` (top-1 agreement with the target's next token), which the
publisher records with each version.

Quality gate: a window's weights are only worth submitting if they draft better than the weights
they started from. :meth:`SpotTrainer.judge_against_base` scores both on the same held-out
windows; the window cycle (``spot/cycle.py``, run by ``rollout/control.py`` and
``trainer/drafter_window.py``) submits a candidate only when it is no worse, and otherwise
:meth:`SpotTrainer.revert_to_base`. Why: a drafter that starts well-fitted
(``drafterTraining.initialDrafter``) is pushed off its optimum by the first AdamW steps of a
short window at the online learning rate (docs/performance.md has the measured drop in accepted
length after one merge), and a worse merge would be served to every rollout worker.

Errors: starting on an empty buffer raises :class:`EmptyBufferError`; a crash inside the thread
is logged, puts the trainer in state ``failed`` with the message in
:attr:`SpotTrainerStatus.error`, and :meth:`SpotTrainer.raise_if_failed` re-raises it for the
controller. Nothing is swallowed.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from longtail_api.drafterstatus import SpotTrainerState, SpotTrainerStatus
from longtail_api.policies import DrafterTrainingSpec
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.spot.buffer import RolloutBuffer
from longtail_workers.spot.windows import (
    Window,
    pack_windows,
    packed_loss,
    top1_over,
    windows_of,
)

log = logging.getLogger(__name__)

StopReason = Literal["requested", "max_steps", "buffer_empty", "error"]


class EmptyBufferError(RuntimeError):
    """Training was asked for before any rollout data was captured."""


class SpotTrainingError(RuntimeError):
    """The training thread crashed; ``str()`` carries the original error."""


@dataclass(frozen=True)
class WindowReport:
    """What one training window did."""

    steps: int
    pairs: int
    mean_loss: float | None
    stop_reason: StopReason
    duration_s: float
    stop_latency_s: float | None
    """Request -> thread exit, when a stop was requested."""


@dataclass(frozen=True)
class WindowVerdict:
    """Held-out top-1 of the trained weights against the base they started from (same data)."""

    trained_top1: float | None
    base_top1: float | None
    pairs: int
    """Held-out pairs both were scored on."""

    # Fewer held-out pairs than this are too few to overrule the training loss.
    MIN_PAIRS: ClassVar[int] = 256

    @property
    def keep(self) -> bool:
        """Submit unless enough held-out data says the training made the drafter worse."""
        if self.trained_top1 is None or self.base_top1 is None or self.pairs < self.MIN_PAIRS:
            return True  # too little held-out data yet: nothing to judge by
        return self.trained_top1 >= self.base_top1


class SpotTrainer:
    """Owns a drafter (and its AdamW state) and trains it from a buffer on demand."""

    def __init__(
        self,
        drafter: EagleDrafter,
        buffer: RolloutBuffer,
        training: DrafterTrainingSpec | None = None,
        *,
        pack_tokens: int | None = None,
        rows_per_step: int = 2,
        holdout_every: int = 10,
        seed: int = 0,
        base_version: int | None = None,
    ) -> None:
        self.training = training or DrafterTrainingSpec()
        self.pack_tokens = pack_tokens or 2 * self.training.window_tokens
        if self.pack_tokens < self.training.window_tokens:
            raise ValueError(
                f"pack_tokens={self.pack_tokens} < window_tokens={self.training.window_tokens}; "
                "a packed row must hold at least one whole window"
            )
        if rows_per_step < 1 or holdout_every < 0:
            raise ValueError(
                f"rows_per_step={rows_per_step} must be >= 1 and holdout_every={holdout_every} "
                ">= 0 (0 disables the held-out slice)"
            )
        self.rows_per_step, self.holdout_every = rows_per_step, holdout_every
        self.drafter, self.buffer = drafter.eval(), buffer
        self.device = drafter.fc.weight.device
        self.optimizer = torch.optim.AdamW(drafter.parameters(), lr=self.training.learning_rate)
        self._gen = torch.Generator().manual_seed(seed)
        self._lock = threading.Lock()  # state transitions
        self._weights = threading.Lock()  # held across one optimizer step, and by copies
        self._stop, self._done = threading.Event(), threading.Event()
        self._done.set()
        self._thread: threading.Thread | None = None
        self._state: SpotTrainerState = "idle"
        self._error: BaseException | None = None
        self._cache: tuple[int, list[Window], list[Window]] | None = None
        self._stop_requested_at: float | None = None
        self.stop_latencies: deque[float] = deque(maxlen=1000)
        self.last_window: WindowReport | None = None
        self.base_version, self.total_steps, self.pairs_since_base = base_version, 0, 0
        # pairs_since_base: training pairs processed since base_version was loaded (steps x pairs
        # per step); the merge weights each worker's candidate by it.
        self._window_steps, self._max_steps = 0, 0
        self._last_loss: float | None = None
        self.policy_versions_seen: set[int] = set()
        self.rejected_windows = 0
        self._base_state = self._trainable_state()  # what revert_to_base() goes back to

    # --- control ----------------------------------------------------------------------------

    def start(self, max_steps: int | None = None) -> int:
        """Start a window in the background; returns its step budget (<= max_steps_per_window)."""
        cap = self.training.max_steps_per_window
        steps = cap if max_steps is None else min(max_steps, cap)
        if steps < 1:
            raise ValueError(f"max_steps={max_steps}; must be >= 1")
        with self._lock:
            if self._state in ("training", "stopping"):
                raise RuntimeError(
                    f"spot trainer is {self._state}; request_stop() and wait_stopped() first"
                )
            if len(self.buffer) == 0:
                raise EmptyBufferError(
                    "the rollout buffer is empty: no response was captured yet, so there is "
                    "nothing to train the drafter on; generate (with capture on) first"
                )
            self._error, self._stop_requested_at = None, None
            self._stop.clear()
            self._done.clear()
            self._state, self._window_steps, self._max_steps = "training", 0, steps
            self._thread = threading.Thread(
                target=self._run, args=(steps,), name="spot-trainer", daemon=True
            )
            self._thread.start()
        return steps

    def request_stop(self) -> None:
        """Ask the thread to stop after its current optimizer step (returns at once)."""
        with self._lock:
            if self._state == "training":
                self._state = "stopping"
                self._stop_requested_at = time.perf_counter()
                self._stop.set()

    def wait_stopped(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the thread to exit; True once it has."""
        return self._done.wait(timeout)

    def stop(self, timeout: float) -> bool:
        """:meth:`request_stop` then :meth:`wait_stopped`."""
        self.request_stop()
        return self.wait_stopped(timeout)

    def raise_if_failed(self) -> None:
        """Re-raise the training thread's crash, if there was one."""
        if self._error is not None:
            raise SpotTrainingError(self.status().error) from self._error

    @property
    def state(self) -> SpotTrainerState:
        return self._state

    def status(self) -> SpotTrainerStatus:
        err = self._error
        return SpotTrainerStatus(
            state=self._state,
            window_steps=self._window_steps,
            max_steps=self._max_steps,
            total_steps=self.total_steps,
            pairs_since_base=self.pairs_since_base,
            last_loss=self._last_loss,
            base_version=self.base_version,
            error=None if err is None else f"{type(err).__name__}: {err}",
            rejected_windows=self.rejected_windows,
        )

    # --- weights ----------------------------------------------------------------------------

    def drafter_copy(self) -> EagleDrafter:
        """An eval-mode copy of the current weights (taken between steps), e.g. to publish."""
        with self._weights:
            return copy.deepcopy(self.drafter).eval()

    @torch.no_grad()
    def load_weights(self, state: dict[str, torch.Tensor], base_version: int | None) -> None:
        """Continue from ``state`` (a merged version), keeping the optimizer's moments."""
        if self._state in ("training", "stopping"):
            raise RuntimeError("load_weights while training; stop the trainer first")
        self._copy_in(state)
        self.base_version, self.pairs_since_base = base_version, 0
        self._base_state = self._trainable_state()
        self.policy_versions_seen.clear()
        self._cache = None  # re-read the buffer's policy versions for the new base

    def revert_to_base(self) -> None:
        """Drop what was trained since the base was loaded (the quality gate's "no").

        The AdamW moments are kept: they still describe the loss around the base weights.
        """
        if self._state in ("training", "stopping"):
            raise RuntimeError("revert_to_base while training; stop the trainer first")
        self._copy_in(self._base_state)
        self.pairs_since_base = 0
        self.rejected_windows += 1

    def judge_against_base(self, max_pairs: int = 4096) -> WindowVerdict:
        """Held-out top-1 of the current weights and of the base weights, on the same windows."""
        held = self._heldout(max_pairs)
        base = self.drafter_copy()
        _load_into(base, self._base_state)
        trained, pairs = top1_over(self.drafter_copy(), held, self.pack_tokens, self.device)
        base_top1, _ = top1_over(base, held, self.pack_tokens, self.device)
        return WindowVerdict(trained, base_top1, pairs)

    def _copy_in(self, state: dict[str, torch.Tensor]) -> None:
        with self._weights:
            _load_into(self.drafter, state)

    def _trainable_state(self) -> dict[str, torch.Tensor]:
        with self._weights:
            return {n: p.detach().clone() for n, p in self.drafter.named_parameters()}

    def evaluate(self, max_pairs: int = 4096) -> float | None:
        """Held-out top-1 accuracy (None without held-out data); safe while training."""
        return top1_over(self.drafter_copy(), self._heldout(max_pairs), self.pack_tokens,
                         self.device)[0]  # fmt: skip

    def _heldout(self, max_pairs: int) -> list[Window]:
        """The first held-out windows, up to ``max_pairs`` pairs (at least one window)."""
        _, _, held = self._windows()
        picked: list[Window] = []
        total = 0
        for w in held:
            if total + w.num_pairs > max_pairs and picked:
                break
            picked.append(w)
            total += w.num_pairs
        return picked

    # --- the thread -------------------------------------------------------------------------

    def _run(self, max_steps: int) -> None:
        started, reason, losses, pairs = time.perf_counter(), "max_steps", [], 0
        try:
            for _ in range(max_steps):
                if self._stop.is_set():
                    reason = "requested"
                    break
                step = self._step_once()
                if step is None:
                    reason = "buffer_empty"
                    break
                losses.append(step[0])
                pairs += step[1]
        except BaseException as exc:  # surfaced via state "failed" + raise_if_failed()
            log.exception("spot trainer: training step crashed")
            self._error, reason = exc, "error"
        finally:
            self.drafter.eval()
            self._finish(started, reason, losses, pairs)

    def _finish(self, started: float, reason: str, losses: list[float], pairs: int) -> None:
        now = time.perf_counter()
        with self._lock:
            latency = None
            if self._stop_requested_at is not None:
                latency = now - self._stop_requested_at
                self.stop_latencies.append(latency)
            self.last_window = WindowReport(
                steps=len(losses),
                pairs=pairs,
                mean_loss=sum(losses) / len(losses) if losses else None,
                stop_reason=reason,  # type: ignore[arg-type]
                duration_s=now - started,
                stop_latency_s=latency,
            )
            self._state = "failed" if self._error is not None else "idle"
            self._done.set()

    def _step_once(self) -> tuple[float, int] | None:
        _, train, _ = self._windows()
        if not train:
            return None
        rows = self._sample_rows(train)
        batch = pack_windows([w for row in rows for w in row], self.pack_tokens, self.device)
        with self._weights:
            self.drafter.train()
            loss = packed_loss(self.drafter, batch, self.training.loss_weights)
            self.optimizer.zero_grad(set_to_none=True)
            loss.total.backward()  # type: ignore[no-untyped-call]
            self.optimizer.step()
            self.drafter.eval()
        value, n = float(loss.total.detach()), batch.num_pairs
        self.total_steps, self._window_steps = self.total_steps + 1, self._window_steps + 1
        self.pairs_since_base += n
        self._last_loss = value
        return value, n

    def _sample_rows(self, windows: list[Window]) -> list[list[Window]]:
        """Uniformly drawn windows, first-fit into ``rows_per_step`` rows of ``pack_tokens``."""
        rows: list[list[Window]] = [[]]
        used = 0
        while True:
            w = windows[int(torch.randint(len(windows), (1,), generator=self._gen))]
            if used + w.num_pairs > self.pack_tokens:
                if len(rows) == self.rows_per_step:
                    return rows
                rows.append([])
                used = 0
            rows[-1].append(w)
            used += w.num_pairs

    def _windows(self) -> tuple[int, list[Window], list[Window]]:
        """(buffer version, training windows, held-out windows), recomputed on change."""
        cached = self._cache
        if cached is not None and cached[0] == self.buffer.version:
            return cached
        snap = self.buffer.snapshot()
        k = self.holdout_every
        held = [s for s in snap.sequences if k and s.seq_id % k == k - 1]
        train = [s for s in snap.sequences if not (k and s.seq_id % k == k - 1)] or held
        self.policy_versions_seen.update(s.policy_version for s in train)
        w = self.training.window_tokens
        self._cache = (snap.version, windows_of(train, w), windows_of(held, w))
        return self._cache


@torch.no_grad()
def _load_into(drafter: EagleDrafter, state: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` (trainable weights by name) into ``drafter``'s parameters."""
    for name, param in drafter.named_parameters():
        param.copy_(state[name].to(param.device, param.dtype))
