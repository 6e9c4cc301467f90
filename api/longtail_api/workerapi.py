"""Wire types of the worker control surfaces the operator (and local mode) drive.

Three services, one module, so the operator never imports the workers to read them:

- a rollout worker (``longtail_workers.rollout.http``): ``GET /v1/status`` ->
  :class:`RolloutWorkerStatus`, ``PUT /v1/role`` with :class:`RoleRequest` -> :class:`RoleAnswer`
  (200 acknowledged, 202 still completing, 409 refused now, 400 malformed);
- the trainer (the RL-loop service): ``GET /v1/status`` -> :class:`TrainerStatus`,
  ``POST /v1/checkpoint`` -> :class:`CheckpointAnswer`, which the operator sends before it
  deletes pods on ``suspend: true``, and ``PUT /v1/role`` like a rollout worker (activities
  :data:`TRAINER_ACTIVITIES`: ``train``, or ``drafter-train`` while it waits for a rollout when
  ``trainer`` is in ``harvest.eligibleRoles``);
- the dedicated drafter worker (``longtail_workers.drafter_worker``): ``GET /v1/status`` ->
  :class:`DrafterWorkerStatus`.

The bodies are plain dataclasses (their drafter-training parts in ``drafterstatus.py``),
written and read by :mod:`longtail_api.wirecodec`: ``to_wire(body)`` is the JSON (camelCase
keys like the RLJob API), ``from_wire(RolloutWorkerStatus, data, "status")`` checks every
field's type and range (the annotations: ``Count`` is an integer >= 0) and raises
:class:`~longtail_api.protocol.ProtocolError` naming the path, the value and the fix; unknown
keys are ignored (the operator and the workers are upgraded independently). Round trips of a
real worker's answer are tested.

Pure module: standard library and ``longtail_api`` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from longtail_api.drafterstatus import (
    AcceptanceSnapshot,
    BufferStats,
    DrafterMergeStatus,
    DrafterTrainingStatus,
    SpotTrainerStatus,
)
from longtail_api.harvest import Activity
from longtail_api.wirecodec import WIRE_NAME, Count, Fraction, NonNegative, Version

STATUS_PATH = "/v1/status"
"""Rollout worker and trainer: GET the status."""
ROLE_PATH = "/v1/role"
"""Rollout worker and trainer: PUT a :class:`RoleRequest`."""
CHECKPOINT_PATH = "/v1/checkpoint"
"""Trainer: POST (empty body or ``{"reason": "..."}``) to checkpoint now."""

ROLLOUT_PORT = 8200
"""Default control port of a rollout worker (``--port``)."""
TRAINER_PORT = 8300
"""Default status/control port of the trainer (``--port``)."""
WEIGHTS_PORT = 8301
"""Default port of the trainer's policy weight server (``--weights-port``), which rollout
workers pull versioned weights from."""
VERIFIER_PORT = 8100
"""Default port of the verifier (``POST /v1/verify``)."""

WorkerState = Literal["generating", "idle", "training", "stopping", "failed"]
TrainerPhase = Literal["running", "checkpointing", "complete", "failed"]
TRAINER_ACTIVITIES: tuple[Activity, ...] = ("train", "drafter-train")
"""Activities the trainer can be assigned (``drafter-train`` only during a step's rollout)."""


# --- rollout worker ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RoleState:
    """``role`` in a worker's status: what was asked last and what it does now."""

    desired: Activity
    observed: Activity
    since: NonNegative
    """Unix time the observed activity began."""


@dataclass(frozen=True)
class WorkerVersions:
    """Policy and drafter versions a worker generates with, and its current RL step."""

    policy: Count
    drafter: Version
    """-1: the unpublished initial drafter."""
    step: Count


@dataclass(frozen=True)
class RolloutWorkerStatus:
    """Body of a rollout worker's ``GET /v1/status``."""

    worker: str
    state: WorkerState
    role: RoleState
    generating: bool
    running: Count
    waiting: Count
    idle_since: NonNegative | None
    idle_seconds: NonNegative | None
    """Seconds since the last generation finished; None while generating."""
    versions: WorkerVersions
    buffer: BufferStats = field(default_factory=BufferStats)
    trainer: SpotTrainerStatus | None = None
    """None: the worker does not train a drafter."""
    acceptance: AcceptanceSnapshot = field(default_factory=AcceptanceSnapshot)

    @property
    def mean_accepted_length(self) -> float | None:
        """Mean accepted length under the drafter version the worker uses now, if measured."""
        stats = self.acceptance.by_drafter_version.get(self.versions.drafter)
        return None if stats is None else stats.mean_accepted_length


@dataclass(frozen=True)
class RoleRequest:
    """Body of ``PUT /v1/role``."""

    role: Activity


@dataclass(frozen=True)
class RoleAck:
    """``role`` in the answer to ``PUT /v1/role``."""

    desired: Activity
    observed: Activity
    since: NonNegative
    pending: bool
    """True while the switch is still completing (HTTP 202): observed != desired."""
    switch_seconds: NonNegative
    """Time the worker took to answer."""


@dataclass(frozen=True)
class RoleAnswer:
    """Body of a 200/202 answer to ``PUT /v1/role``."""

    worker: str
    role: RoleAck


# --- trainer ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepSeconds:
    """Wall time of the last completed RL step, split by phase."""

    rollout: NonNegative
    """Whole rollout phase (includes the tail)."""
    tail: NonNegative
    """Part of the rollout after the first worker went idle (the long tail)."""
    train: NonNegative
    """Reward, advantages and the policy update."""
    sync_pause: NonNegative | None = None
    """The weight sync of the policy version the step's rollout used: from the trainer's
    publish until the last rollout worker held it (the step row's ``sync_pause_s``); None when
    not booked (a trainer of an older version, or a version published before a restart)."""
    sync_gb_per_s: NonNegative | None = field(default=None, metadata={WIRE_NAME: "syncGBPerSecond"})
    """That sync's bytes over its pause, GB/s (None: the publisher did not count its bytes)."""


@dataclass(frozen=True)
class TrainerStatus:
    """Body of the trainer's ``GET /v1/status``; the operator copies it into the RLJob status.

    ``phase``: ``running`` (steps in progress), ``checkpointing`` (writing a checkpoint; asked
    by ``POST /v1/checkpoint`` or periodic), ``complete`` (``totalSteps`` done: the job
    succeeds), ``failed`` (``message`` says why: the job fails with reason TrainerFailed).
    """

    step: Count
    """Completed RL steps."""
    total_steps: Count
    phase: TrainerPhase
    policy_version: Count
    drafter_version: Version
    """Newest published drafter version (-1: none published yet)."""
    reward_mean: float | None = None
    """Mean reward of step :attr:`figures_step`."""
    accuracy: Fraction | None = None
    """Fraction of correct answers in step :attr:`figures_step`, in [0, 1]."""
    accepted_length: NonNegative | None = None
    """Mean accepted length of speculative decoding in step :attr:`figures_step`."""
    acceptance_collapsed: bool = False
    """Speculation accepts almost nothing after it once worked (``longtail_api.acceptance``):
    the drafter no longer matches the policy."""
    last_checkpoint_step: Count | None = None
    """Step of the newest complete checkpoint."""
    step_seconds: StepSeconds | None = None
    message: str = ""
    """Human-readable detail (the error when ``phase`` is ``failed``)."""
    eval_accuracy: NonNegative | None = None
    """Greedy accuracy on the eval split at the last evaluation, in [0, 1]."""
    eval_sampled_accuracy: NonNegative | None = None
    """Share of correct answers among ``algorithm.evalSamples`` sampled per eval prompt at the
    last evaluation, in [0, 1]; None when the job evaluates greedily only."""
    sd_fraction: NonNegative | None = None
    """Share of the last rollout's tokens generated by speculative steps, in [0, 1]."""
    rollout_active: bool = False
    """A step's rollout is in progress (the harvest coordinator's ``rollout_active``)."""
    pending_workers: tuple[str, ...] = ()
    """Rollout workers that hold unanswered requests of the current rollout."""
    answers_done: Count = 0
    answers_total: Count = 0
    """Progress of the current rollout, in answers."""
    role: RoleState | None = None
    """The trainer's own activity (``train`` or ``drafter-train``), as a rollout worker reports
    it; None from a trainer without a role surface (older versions)."""
    idle_since: NonNegative | None = None
    """Unix time the trainer began waiting for the current rollout; None outside a rollout."""
    idle_seconds: NonNegative | None = None
    """Seconds it has waited for the current rollout (the harvest's idleness); None outside."""
    harvested_seconds: NonNegative = 0.0
    """Seconds the trainer spent training the drafter while it waited (whole run)."""
    drafter_training: DrafterTrainingStatus | None = None
    """The trainer's own drafter training; None when trainer harvesting is off."""
    figures_step: Count | None = None
    """The step whose figures (reward, accuracy, accepted length, SD share, step seconds) this
    status carries: the last step completed with its eval, if it had one. It lags :attr:`step`
    while a trained step publishes its weights and evaluates; None before the first step of
    this trainer process completes."""
    worker_policy_versions: dict[str, Count] = field(default_factory=dict)
    """Policy version each rollout worker holds, by worker name, as its last generate reply
    said (a worker not called yet by this trainer process is absent)."""
    drafter_merges: DrafterMergeStatus | None = None
    """What the step merges made of the drafter candidates, and why no online drafter version
    was published yet; None when the trainer keeps no drafter registry."""
    sd_fraction_by_source: dict[str, NonNegative] = field(default_factory=dict)
    """:attr:`sd_fraction` split by draft source (``learned``, ``history``): the share of step
    :attr:`figures_step`'s tokens committed in speculative steps by the rows each drafted; empty
    before the first step, from a trainer older than the split, or when nothing speculated."""
    accepted_length_by_source: dict[str, NonNegative] = field(default_factory=dict)
    """:attr:`accepted_length` of the rows each draft source drafted in step
    :attr:`figures_step`."""
    tracking_failing: dict[str, str] = field(default_factory=dict)
    """Experiment trackers (``spec.tracking``) whose last attempt failed, by backend: the error
    and how many records wait for it (empty: every tracker is keeping up, or none is set)."""


@dataclass(frozen=True)
class CheckpointAnswer:
    """Body of a 200 answer to the trainer's ``POST /v1/checkpoint``: the checkpoint is
    complete on disk when the answer is sent."""

    step: Count
    location: str
    """Directory of the checkpoint inside the trainer pod."""


# --- drafter worker -----------------------------------------------------------------------------

DrafterWorkerState = Literal["waiting", "training", "failed"]


@dataclass(frozen=True)
class CandidateSummary:
    """``lastCandidate`` in a drafter worker's status: the newest candidate it submitted."""

    base_version: Count | None
    """The published drafter version its window trained from (None: the initial drafter)."""
    tokens: Count
    """Training pairs since that version: its weight in the merge."""
    steps: Count
    """The spot trainer's optimizer steps when the window ended."""


@dataclass(frozen=True)
class DrafterWorkerStatus:
    """Body of a dedicated drafter worker's ``GET /v1/status``."""

    worker: str
    state: DrafterWorkerState
    """``waiting`` for a step's answers, ``training`` a window, ``failed`` (the spot trainer
    crashed: the process exits 1)."""
    step: Count
    """The newest RL step whose answers were trained on (0: none yet)."""
    policy_version: Count | None
    """The policy version loaded (None: the one loaded at start, not synced yet)."""
    drafter_base_version: Count | None
    """The published drafter version the spot trainer trains from (None: the initial one)."""
    windows: Count
    """Windows run since the process started."""
    outcomes: dict[str, Count]
    """Windows by outcome: ``submitted``, ``dropped`` (quality gate), ``stale``, ``empty``."""
    last_candidate: CandidateSummary | None
    last_error: str | None
    """The last failed turn's error (the trainer's endpoints), or the crash when ``failed``."""
    drafter_training: DrafterTrainingStatus
    role: Literal["drafter"] = "drafter"
    """Always ``drafter`` (a rollout worker's status has its ``role`` object here)."""
