"""Wire types of a drafter training, as the statuses in ``workerapi.py`` carry them.

``drafterTraining`` of the trainer's and of a drafter worker's status
(:class:`DrafterTrainingStatus`), and the ``buffer``, ``trainer`` and ``acceptance`` of a
rollout worker's: filled by ``longtail_workers.spot`` (buffer, trainer, sequences, acceptance),
read by the operator, local mode and the harvest loop. ``drafterMerges`` of the trainer's
status (:class:`DrafterMergeStatus`: what became of the drafter candidates, and why no online
version was published) is filled by ``longtail_workers.drafter.refusals``; the reasons a
candidate is refused (:data:`REFUSAL_REASONS`) are the label values of the trainer's
``longtail_trainer_drafter_candidates_rejected_total``, the keys of a step row's
``drafter_refused`` and the words of ``longtail run``'s report (:func:`describe_refusals`).
JSON through :mod:`longtail_api.wirecodec` (camelCase keys; SD counters keyed by version numbers
as strings).

Pure module: standard library and ``longtail_api`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
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


REFUSAL_REASONS: dict[str, str] = {
    "request": "came as unusable uploads (no Content-Length, too large, no or a wrong sha256)",
    "query": "had a malformed query field (a NaN loss, an infinite score, negative tokens, ...)",
    "policy_version": "named a policy version newer than the trainer's or older than it allows",
    "malformed": "failed the check against the job's drafter (tensor names, shapes, dtypes, "
    "target; no tensors; NaN/inf weights)",
    "base_version": "came from a drafter version that was not the latest (stale)",
    "empty": "trained on no token",
    "unverified": "had no token the trainer can verify (none handed out in their window)",
    "worse": "scored below the current drafter version on the trainer's held-out sample",
    "superseded": "arrived while a newer drafter version was being published from the others "
    "(superseded, never merged)",
}
"""Why the trainer refused a drafter candidate, by reason (the metric's ``reason`` label), each
with the words that follow a count (``"3 " + words``). ``request``, ``query``,
``policy_version`` and ``malformed`` are bad input (HTTP 400 at the upload; ``malformed`` also
at the merge), ``base_version`` is the 409 of a stale or future base, ``empty``,
``unverified`` and ``worse`` are judged at the step's merge (``worse``: a well-formed drafter
that drafts worse than the version it would replace, or a merge that does), ``superseded`` an
accepted upload that a publish overtook."""

NO_CANDIDATE = "no candidate was trained"
"""How :class:`DrafterMergeStatus`'s ``unpublished`` begins when no candidate reached the trainer
(``longtail run``'s report adds the harvest's figures to it)."""

BAD_INPUT_REASONS = ("request", "query", "policy_version", "malformed")
"""The reasons that mean a worker sent something wrong (not a drafter that lost on merit)."""


def describe_refusals(counts: Mapping[str, int]) -> str:
    """``{"worse": 44, "base_version": 2}`` as ``"44 scored below ...; 2 were trained ..."``
    (in :data:`REFUSAL_REASONS`' order; an unknown reason is named as it is)."""
    known = [r for r in REFUSAL_REASONS if counts.get(r)]
    other = sorted(r for r in counts if r not in REFUSAL_REASONS and counts[r])
    parts = [f"{counts[r]} {REFUSAL_REASONS[r]}" for r in known]
    return "; ".join(parts + [f"{counts[r]} refused ({r})" for r in other])


@dataclass(frozen=True)
class DrafterMergeStatus:
    """``drafterMerges`` of the trainer's status: what the step merges made of the drafter
    candidates since the trainer started (``longtail_workers.drafter.refusals``)."""

    candidates: Count
    """Candidates the merges took (each worker's newest of a window), refused ones included."""
    published: Count
    """Drafter versions the merges published."""
    refused: dict[str, Count] = field(default_factory=dict)
    """Candidates refused, by reason (:data:`REFUSAL_REASONS`), at the upload and the merge."""
    unpublished: str | None = None
    """Why no online drafter version has been published yet (None once one is)."""
