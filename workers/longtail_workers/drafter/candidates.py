"""What a drafter candidate is, and the trainer's checks of it at the merge: shared types.

Used by :mod:`~longtail_workers.drafter.registry` (which re-exports them: callers import them
from there), the trainer's HTTP exchange (``exchange.py``), the window cycle (``spot/cycle.py``)
and the trainer's merge checks (``trainer/candidate_checks.py``, the :class:`MergeGate`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from longtail_workers.drafter.model import EagleDrafter


class StaleCandidateError(RuntimeError):
    """A candidate trained from a version that is not the latest published one (HTTP 409)."""

    def __init__(self, message: str, base_version: int | None, latest: int | None) -> None:
        super().__init__(message)
        self.base_version, self.latest = base_version, latest


@dataclass(frozen=True)
class CandidateInfo:
    """What a worker says about the drafter it submits (one window's work): the one argument of
    every ``submit_candidate`` (directory registry, the trainer's HTTP exchange, their callers);
    ``candidate.json`` stores it with ``created_unix``."""

    worker: str
    """The submitting worker's name (it names a directory: non-empty, no ``/``)."""
    base_version: int | None
    """The published drafter version the window trained from (None: the initial drafter)."""
    policy_version: int
    """The newest policy version whose samples the window trained on."""
    tokens: int
    """Training pairs since the base version: the candidate's weight in the merge, capped by
    the tokens the trainer handed out in the window when it checks (``candidate_checks.py``)."""
    steps: int
    """The spot trainer's optimizer steps over its life when the window ended."""
    train_loss: float | None = None
    """The window's mean training loss (None: unknown)."""
    heldout_top1: float | None = None
    """Held-out top-1 accuracy of the trained drafter (None: not judged)."""

    def __post_init__(self) -> None:
        if not self.worker or "/" in self.worker:
            raise ValueError(f"worker={self.worker!r}; must be a non-empty name without '/'")

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON (``candidate.json`` and the exchange's upload query)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Candidate:
    """A worker's drafter trained from ``base_version`` in one window (``candidate.json``)."""

    path: Path
    worker: str
    base_version: int | None
    policy_version: int
    tokens: int
    steps: int
    train_loss: float | None
    heldout_top1: float | None
    created_unix: float


@dataclass(frozen=True)
class Admitted:
    """A candidate let into the merge, with the weight and the score the merge uses."""

    candidate: Candidate
    weights: dict[str, torch.Tensor]
    """Its trainable weights (checked by ``vetting.py``)."""
    tokens: int
    """Its weight in the merge: the trainer's verified tokens (the self-report without a gate)."""
    heldout_top1: float | None
    """The trainer's held-out top-1 of it (the self-report without a gate; None: not judged)."""


Refusal = tuple[str, str]
"""``(worker, reason)`` of a candidate the gate kept out of the merge."""


class MergeGate(Protocol):
    """What the trainer checks at the merge (``trainer/candidate_checks.py``; see the module
    text). ``current`` is the version the candidates were trained from (None: unknown)."""

    def admit(
        self,
        base: int | None,
        usable: Sequence[tuple[Candidate, dict[str, torch.Tensor]]],
        scratch: EagleDrafter,
        current: EagleDrafter | None,
    ) -> tuple[list[Admitted], list[Refusal]]:
        """Weigh and judge the vetted candidates of ``base`` (``scratch``: a drafter to load
        each one into for scoring)."""
        ...

    def judge_merge(
        self, merged: EagleDrafter, current: EagleDrafter | None
    ) -> tuple[float | None, str | None]:
        """The merge's held-out top-1 and, when it must not be published, why."""
        ...

    def initial_drafter(self) -> EagleDrafter | None:
        """The job's initial drafter: the current version before anything was published."""
        ...
