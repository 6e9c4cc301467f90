"""Wire types of a drafter training, as the statuses in ``workerapi.py`` carry them.

``drafterTraining`` of the trainer's and of a drafter worker's status
(:class:`DrafterTrainingStatus`), and the ``buffer``, ``trainer`` and ``acceptance`` of a
rollout worker's: filled by ``longtail_workers.spot`` (buffer, trainer, sequences, acceptance),
read by the operator, local mode and the harvest loop. JSON through
:mod:`longtail_api.wirecodec` (camelCase keys; SD counters keyed by version numbers as strings).

Pure module: standard library and ``longtail_api`` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from longtail_api.wirecodec import Count

SpotTrainerState = Literal["idle", "training", "stopping", "failed"]


@dataclass(frozen=True)
class BufferStats:
    """``buffer``: what a rollout buffer holds (``longtail_workers.spot.buffer``)."""

    tokens: Count = 0
    bytes: Count = 0
    """Tokens plus hidden states."""
    sequences: Count = 0
    max_tokens: Count = 0
    max_bytes: Count = 0
    steps: tuple[int, ...] = ()
    """RL steps of the sequences held."""
    policy_versions: tuple[int, ...] = ()
    """Policy versions of the sequences held."""
    dropped: dict[str, Count] = field(default_factory=dict)
    """Sequences refused, by reason."""
    evicted: dict[str, Count] = field(default_factory=dict)
    """Sequences evicted, by reason."""


@dataclass(frozen=True)
class SpotTrainerStatus:
    """``trainer`` of a drafter training: its spot trainer (``longtail_workers.spot.trainer``),
    not the RL trainer's ``workerapi.TrainerStatus``."""

    state: SpotTrainerState
    window_steps: Count
    """Optimizer steps of the current (or last) window."""
    max_steps: Count
    """That window's step budget."""
    total_steps: Count
    pairs_since_base: Count
    """Training pairs since :attr:`base_version`."""
    last_loss: float | None
    """Mean loss of the last window (NaN or infinite when it diverged)."""
    base_version: Count | None
    """The published drafter version it trains from (None: the initial drafter)."""
    error: str | None
    """The training thread's crash (state ``failed``)."""
    rejected_windows: Count
    """Trained weights dropped by the quality gate (worse than their base on held-out data)."""


@dataclass
class AcceptanceStats:
    """Speculative-decoding counters of the sequences generated under one version; mutable:
    ``longtail_workers.spot.acceptance`` adds them up."""

    sequences: Count = 0
    spec_steps: Count = 0
    drafted_tokens: Count = 0
    accepted_tokens: Count = 0

    @property
    def mean_accepted_length(self) -> float | None:
        """(accepted + spec_steps) / spec_steps; None while SD never ran."""
        if self.spec_steps == 0:
            return None
        return (self.accepted_tokens + self.spec_steps) / self.spec_steps

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None


@dataclass(frozen=True)
class AcceptanceSnapshot:
    """``acceptance`` in a rollout worker's status: SD counters by the version generated with
    (JSON keys: the version numbers as strings)."""

    by_policy_version: dict[int, AcceptanceStats] = field(default_factory=dict)
    by_drafter_version: dict[int, AcceptanceStats] = field(default_factory=dict)
    """-1: the unpublished initial drafter."""


@dataclass(frozen=True)
class DrafterTrainingStatus:
    """``drafterTraining`` of the trainer and of a drafter worker: drafter windows trained on
    given answers (``longtail_workers.spot.sequences``)."""

    buffer: BufferStats
    trainer: SpotTrainerStatus
    pending_sequences: Count
    """Answers waiting for their hidden states."""
    captured_sequences: Count
    """Answers captured into the buffer (whole run)."""
    error: str | None = None
    """The trainer's last failed window (None from a drafter worker: see its ``lastError``)."""
