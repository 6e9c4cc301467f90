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

JSON keys are camelCase like the RLJob API. ``from_dict`` checks every field it reads (type and
range) and raises :class:`~longtail_api.protocol.ProtocolError` naming the path, the value and
the fix. Unknown keys in *responses* are ignored on purpose: the operator and the workers are
upgraded independently, and an older operator must keep reading a newer worker's status. Round
trips (``from_dict(x).to_dict() == x`` for a real worker's answer) are tested.

Pure module: standard library and ``longtail_api`` only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, get_args

from longtail_api.harvest import Activity
from longtail_api.protocol import ProtocolError

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
SpotTrainerState = Literal["idle", "training", "stopping", "failed"]
_T = TypeVar("_T")


class Reader:
    """Typed field access on one JSON object, with error paths: the one parser of every typed
    body here, in ``steprow.py`` and in the workers' ``wire/`` (generate calls and
    replies, step samples, rank commands)."""

    def __init__(self, data: object, path: str) -> None:
        if not isinstance(data, Mapping):
            raise ProtocolError(path, "must be a JSON object", data, fix="send {...}")
        self.obj: Mapping[str, Any] = data
        self.path = path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}"

    def raw(self, key: str, *, required: bool = True) -> Any:
        if key not in self.obj and required:
            raise ProtocolError(self.at(key), "is required")
        return self.obj.get(key)

    def str_(self, key: str) -> str:
        value = self.raw(key)
        if not isinstance(value, str):
            raise ProtocolError(self.at(key), "must be a string", value)
        return value

    def bool_(self, key: str) -> bool:
        value = self.raw(key)
        if not isinstance(value, bool):
            raise ProtocolError(self.at(key), "must be true or false", value)
        return value

    def int_(self, key: str, *, minimum: int | None = 0, required: bool = True) -> int:
        value = self.raw(key, required=required)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(self.at(key), "must be an integer", value)
        if minimum is not None and value < minimum:
            raise ProtocolError(self.at(key), f"must be >= {minimum}", value)
        return value

    def list_(self, key: str) -> list[Any]:
        value = self.raw(key)
        if not isinstance(value, list):
            raise ProtocolError(self.at(key), "must be a JSON list", value)
        return value

    def ints(self, key: str, *, required: bool = True) -> list[int]:
        """A list of integers (token ids); absent and not ``required``: empty."""
        if not required and key not in self.obj:
            return []
        value = self.list_(key)
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int):
                raise ProtocolError(f"{self.at(key)}[{i}]", "must be an integer", item)
        return list(value)

    def opt_str(self, key: str) -> str | None:
        return None if self.obj.get(key) is None else self.str_(key)

    def opt_int(self, key: str, *, minimum: int | None = 0) -> int | None:
        if self.obj.get(key) is None:
            return None
        return self.int_(key, minimum=minimum)

    def num(self, key: str, *, minimum: float | None = None, finite: bool = True) -> float:
        """A number; ``finite=False`` lets NaN and infinities through (a diverged loss)."""
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(self.at(key), "must be a number", value)
        number = float(value)
        if finite and not math.isfinite(number):
            raise ProtocolError(self.at(key), "must be a finite number", value)
        if minimum is not None and number < minimum:
            raise ProtocolError(self.at(key), f"must be >= {minimum}", value)
        return number

    def opt_num(
        self, key: str, *, minimum: float | None = None, finite: bool = True
    ) -> float | None:
        if self.obj.get(key) is None:
            return None
        return self.num(key, minimum=minimum, finite=finite)

    def choice(self, key: str, options: tuple[str, ...]) -> Any:
        value = self.raw(key)
        if value not in options:
            raise ProtocolError(
                self.at(key), f"must be one of {', '.join(map(repr, options))}", value
            )
        return value

    def counts(self, key: str, what: str) -> dict[str, int]:
        """An optional ``{name: integer >= 0}`` object (absent: empty); ``what`` says what
        it maps (``worker names to policy versions``)."""
        value = self.raw(key, required=False)
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in value.items()
        ):
            raise ProtocolError(self.at(key), f"must map {what} (>= 0)", value)
        return dict(value)

    def nested(self, key: str, parse: Callable[[object, str], _T]) -> _T | None:
        """The object at ``key`` read by ``parse(value, path)`` (a ``from_dict``); None when
        absent or null."""
        value = self.obj.get(key)
        return None if value is None else parse(value, self.at(key))

    def mapping(self, key: str) -> dict[str, Any]:
        value = self.raw(key)
        if not isinstance(value, Mapping):
            raise ProtocolError(self.at(key), "must be a JSON object", value)
        return dict(value)


def activity(value: object, path: str) -> Activity:
    """Check that ``value`` is an activity name (``longtail_api.harvest.Activity``)."""
    if not isinstance(value, str) or value not in get_args(Activity):
        known = ", ".join(get_args(Activity))
        raise ProtocolError(path, f"must be an activity ({known})", value)
    return value  # type: ignore[return-value]


# --- drafter training: sub-bodies of the statuses ----------------------------------------------


@dataclass(frozen=True)
class BufferStats:
    """``buffer``: what a rollout buffer holds (``longtail_workers.spot.buffer``)."""

    tokens: int = 0
    bytes: int = 0
    """Tokens plus hidden states."""
    sequences: int = 0
    max_tokens: int = 0
    max_bytes: int = 0
    steps: tuple[int, ...] = ()
    """RL steps of the sequences held."""
    policy_versions: tuple[int, ...] = ()
    """Policy versions of the sequences held."""
    dropped: dict[str, int] = field(default_factory=dict)
    """Sequences refused, by reason."""
    evicted: dict[str, int] = field(default_factory=dict)
    """Sequences evicted, by reason."""

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "bytes": self.bytes, "sequences": self.sequences,
                "maxTokens": self.max_tokens, "maxBytes": self.max_bytes,
                "steps": list(self.steps), "policyVersions": list(self.policy_versions),
                "dropped": dict(self.dropped), "evicted": dict(self.evicted)}  # fmt: skip

    @classmethod
    def from_dict(cls, data: object, path: str = "buffer") -> BufferStats:
        r = Reader(data, path)
        return cls(r.int_("tokens"), r.int_("bytes"), r.int_("sequences"), r.int_("maxTokens"),
                   r.int_("maxBytes"), tuple(r.ints("steps")), tuple(r.ints("policyVersions")),
                   r.counts("dropped", "reasons to sequences"),
                   r.counts("evicted", "reasons to sequences"))  # fmt: skip


@dataclass(frozen=True)
class SpotTrainerStatus:
    """``trainer`` of a drafter training: its spot trainer (``longtail_workers.spot.trainer``),
    not the RL trainer's :class:`TrainerStatus`."""

    state: SpotTrainerState
    window_steps: int
    """Optimizer steps of the current (or last) window."""
    max_steps: int
    """That window's step budget."""
    total_steps: int
    pairs_since_base: int
    """Training pairs since :attr:`base_version`."""
    last_loss: float | None
    base_version: int | None
    """The published drafter version it trains from (None: the initial drafter)."""
    error: str | None
    """The training thread's crash (state ``failed``)."""
    rejected_windows: int
    """Trained weights dropped by the quality gate (worse than their base on held-out data)."""

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "windowSteps": self.window_steps, "maxSteps": self.max_steps,
                "totalSteps": self.total_steps, "pairsSinceBase": self.pairs_since_base,
                "lastLoss": self.last_loss, "baseVersion": self.base_version,
                "error": self.error, "rejectedWindows": self.rejected_windows}  # fmt: skip

    @classmethod
    def from_dict(cls, data: object, path: str = "trainer") -> SpotTrainerStatus:
        r = Reader(data, path)
        return cls(r.choice("state", get_args(SpotTrainerState)), r.int_("windowSteps"),
                   r.int_("maxSteps"), r.int_("totalSteps"), r.int_("pairsSinceBase"),
                   r.opt_num("lastLoss", finite=False), r.opt_int("baseVersion"),
                   r.opt_str("error"), r.int_("rejectedWindows"))  # fmt: skip


@dataclass
class AcceptanceStats:
    """Speculative-decoding counters of the sequences generated under one version; mutable:
    ``longtail_workers.spot.acceptance`` adds them up."""

    sequences: int = 0
    spec_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def mean_accepted_length(self) -> float | None:
        """(accepted + spec_steps) / spec_steps; None while SD never ran."""
        if self.spec_steps == 0:
            return None
        return (self.accepted_tokens + self.spec_steps) / self.spec_steps

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None

    def to_dict(self) -> dict[str, Any]:
        """The counters and, for reading, the two ratios (not read back)."""
        return {"sequences": self.sequences, "specSteps": self.spec_steps,
                "draftedTokens": self.drafted_tokens, "acceptedTokens": self.accepted_tokens,
                "meanAcceptedLength": self.mean_accepted_length,
                "acceptanceRate": self.acceptance_rate}  # fmt: skip

    @classmethod
    def from_dict(cls, data: object, path: str) -> AcceptanceStats:
        r = Reader(data, path)
        return cls(r.int_("sequences"), r.int_("specSteps"), r.int_("draftedTokens"),
                   r.int_("acceptedTokens"))  # fmt: skip


@dataclass(frozen=True)
class AcceptanceSnapshot:
    """``acceptance`` in a rollout worker's status: SD counters by the version generated with
    (JSON keys: the version numbers as strings)."""

    by_policy_version: dict[int, AcceptanceStats] = field(default_factory=dict)
    by_drafter_version: dict[int, AcceptanceStats] = field(default_factory=dict)
    """-1: the unpublished initial drafter."""

    def to_dict(self) -> dict[str, Any]:
        return {
            key: {str(v): stats.to_dict() for v, stats in table.items()}
            for key, table in (
                ("byPolicyVersion", self.by_policy_version),
                ("byDrafterVersion", self.by_drafter_version),
            )
        }

    @classmethod
    def from_dict(cls, data: object, path: str = "acceptance") -> AcceptanceSnapshot:
        r = Reader(data, path)
        return cls(*(_by_version(r, key) for key in ("byPolicyVersion", "byDrafterVersion")))


def _by_version(r: Reader, key: str) -> dict[int, AcceptanceStats]:
    table = {}
    for version, stats in r.mapping(key).items():
        at = f"{r.at(key)}.{version}"
        if not re.fullmatch(r"-?[0-9]+", version):
            raise ProtocolError(at, "must be keyed by a version number", version)
        table[int(version)] = AcceptanceStats.from_dict(stats, at)
    return table


@dataclass(frozen=True)
class DrafterTrainingStatus:
    """``drafterTraining`` of the trainer and of a drafter worker: drafter windows trained on
    given answers (``longtail_workers.spot.sequences``)."""

    buffer: BufferStats
    trainer: SpotTrainerStatus
    pending_sequences: int
    """Answers waiting for their hidden states."""
    captured_sequences: int
    """Answers captured into the buffer (whole run)."""
    error: str | None = None
    """The trainer's last failed window (None from a drafter worker: see its ``lastError``)."""

    def to_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer.to_dict(), "trainer": self.trainer.to_dict(),
                "pendingSequences": self.pending_sequences,
                "capturedSequences": self.captured_sequences, "error": self.error}  # fmt: skip

    @classmethod
    def from_dict(cls, data: object, path: str = "drafterTraining") -> DrafterTrainingStatus:
        r = Reader(data, path)
        return cls(
            BufferStats.from_dict(r.raw("buffer"), r.at("buffer")),
            SpotTrainerStatus.from_dict(r.raw("trainer"), r.at("trainer")),
            r.int_("pendingSequences"),
            r.int_("capturedSequences"),
            r.opt_str("error"),
        )


# --- rollout worker ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RoleState:
    """``role`` in a worker's status: what was asked last and what it does now."""

    desired: Activity
    observed: Activity
    since: float
    """Unix time the observed activity began."""

    def to_dict(self) -> dict[str, Any]:
        return {"desired": self.desired, "observed": self.observed, "since": self.since}

    @classmethod
    def from_dict(cls, data: object, path: str = "role") -> RoleState:
        r = Reader(data, path)
        return cls(
            desired=activity(r.raw("desired"), r.at("desired")),
            observed=activity(r.raw("observed"), r.at("observed")),
            since=r.num("since", minimum=0.0),
        )


@dataclass(frozen=True)
class WorkerVersions:
    """Policy and drafter versions a worker generates with, and its current RL step."""

    policy: int
    drafter: int
    """-1: the unpublished initial drafter."""
    step: int

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "drafter": self.drafter, "step": self.step}

    @classmethod
    def from_dict(cls, data: object, path: str = "versions") -> WorkerVersions:
        r = Reader(data, path)
        return cls(r.int_("policy"), r.int_("drafter", minimum=-1), r.int_("step"))


@dataclass(frozen=True)
class RolloutWorkerStatus:
    """Body of a rollout worker's ``GET /v1/status``."""

    worker: str
    state: WorkerState
    role: RoleState
    generating: bool
    running: int
    waiting: int
    idle_since: float | None
    idle_seconds: float | None
    """Seconds since the last generation finished; None while generating."""
    versions: WorkerVersions
    buffer: BufferStats = field(default_factory=BufferStats)
    trainer: SpotTrainerStatus | None = None
    """None: the worker does not train a drafter."""
    acceptance: AcceptanceSnapshot = field(default_factory=AcceptanceSnapshot)

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "state": self.state,
            "role": self.role.to_dict(),
            "generating": self.generating,
            "running": self.running,
            "waiting": self.waiting,
            "idleSince": self.idle_since,
            "idleSeconds": self.idle_seconds,
            "versions": self.versions.to_dict(),
            "buffer": self.buffer.to_dict(),
            "trainer": None if self.trainer is None else self.trainer.to_dict(),
            "acceptance": self.acceptance.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: object) -> RolloutWorkerStatus:
        r = Reader(data, "status")
        return cls(
            worker=r.str_("worker"),
            state=r.choice("state", get_args(WorkerState)),
            role=RoleState.from_dict(r.raw("role"), r.at("role")),
            generating=r.bool_("generating"),
            running=r.int_("running"),
            waiting=r.int_("waiting"),
            idle_since=r.opt_num("idleSince", minimum=0.0),
            idle_seconds=r.opt_num("idleSeconds", minimum=0.0),
            versions=WorkerVersions.from_dict(r.raw("versions"), r.at("versions")),
            buffer=r.nested("buffer", BufferStats.from_dict) or BufferStats(),
            trainer=r.nested("trainer", SpotTrainerStatus.from_dict),
            acceptance=r.nested("acceptance", AcceptanceSnapshot.from_dict) or AcceptanceSnapshot(),
        )

    @property
    def mean_accepted_length(self) -> float | None:
        """Mean accepted length under the drafter version the worker uses now, if measured."""
        stats = self.acceptance.by_drafter_version.get(self.versions.drafter)
        return None if stats is None else stats.mean_accepted_length


@dataclass(frozen=True)
class RoleRequest:
    """Body of ``PUT /v1/role``."""

    role: Activity

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role}

    @classmethod
    def from_dict(cls, data: object) -> RoleRequest:
        r = Reader(data, "request")
        return cls(activity(r.raw("role"), "role"))


@dataclass(frozen=True)
class RoleAck:
    """``role`` in the answer to ``PUT /v1/role``."""

    desired: Activity
    observed: Activity
    since: float
    pending: bool
    """True while the switch is still completing (HTTP 202): observed != desired."""
    switch_seconds: float
    """Time the worker took to answer."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "desired": self.desired,
            "observed": self.observed,
            "since": self.since,
            "pending": self.pending,
            "switchSeconds": self.switch_seconds,
        }

    @classmethod
    def from_dict(cls, data: object, path: str = "role") -> RoleAck:
        r = Reader(data, path)
        return cls(
            desired=activity(r.raw("desired"), r.at("desired")),
            observed=activity(r.raw("observed"), r.at("observed")),
            since=r.num("since", minimum=0.0),
            pending=r.bool_("pending"),
            switch_seconds=r.num("switchSeconds", minimum=0.0),
        )


@dataclass(frozen=True)
class RoleAnswer:
    """Body of a 200/202 answer to ``PUT /v1/role``."""

    worker: str
    role: RoleAck

    def to_dict(self) -> dict[str, Any]:
        return {"worker": self.worker, "role": self.role.to_dict()}

    @classmethod
    def from_dict(cls, data: object) -> RoleAnswer:
        r = Reader(data, "response")
        return cls(r.str_("worker"), RoleAck.from_dict(r.raw("role"), r.at("role")))


# --- trainer ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepSeconds:
    """Wall time of the last completed RL step, split by phase."""

    rollout: float
    """Whole rollout phase (includes the tail)."""
    tail: float
    """Part of the rollout after the first worker went idle (the long tail)."""
    train: float
    """Reward, advantages and the policy update."""
    sync_pause: float | None = None
    """The weight sync of the policy version the step's rollout used: from the trainer's
    publish until the last rollout worker held it (the step row's ``sync_pause_s``); None when
    not booked (a trainer of an older version, or a version published before a restart)."""
    sync_gb_per_s: float | None = None
    """That sync's bytes over its pause, GB/s (None: the publisher did not count its bytes)."""

    def to_dict(self) -> dict[str, Any]:
        return {"rollout": self.rollout, "tail": self.tail, "train": self.train,
                "syncPause": self.sync_pause, "syncGBPerSecond": self.sync_gb_per_s}  # fmt: skip

    @classmethod
    def from_dict(cls, data: object, path: str = "stepSeconds") -> StepSeconds:
        r = Reader(data, path)
        return cls(
            r.num("rollout", minimum=0.0),
            r.num("tail", minimum=0.0),
            r.num("train", minimum=0.0),
            r.opt_num("syncPause", minimum=0.0),
            r.opt_num("syncGBPerSecond", minimum=0.0),
        )


@dataclass(frozen=True)
class TrainerStatus:
    """Body of the trainer's ``GET /v1/status``; the operator copies it into the RLJob status.

    ``phase``: ``running`` (steps in progress), ``checkpointing`` (writing a checkpoint; asked
    by ``POST /v1/checkpoint`` or periodic), ``complete`` (``totalSteps`` done: the job
    succeeds), ``failed`` (``message`` says why: the job fails with reason TrainerFailed).
    """

    step: int
    """Completed RL steps."""
    total_steps: int
    phase: TrainerPhase
    policy_version: int
    drafter_version: int
    """Newest published drafter version (-1: none published yet)."""
    reward_mean: float | None = None
    """Mean reward of step :attr:`figures_step`."""
    accuracy: float | None = None
    """Fraction of correct answers in step :attr:`figures_step`, in [0, 1]."""
    accepted_length: float | None = None
    """Mean accepted length of speculative decoding in step :attr:`figures_step`."""
    acceptance_collapsed: bool = False
    """Speculation accepts almost nothing after it once worked (``longtail_api.acceptance``):
    the drafter no longer matches the policy."""
    last_checkpoint_step: int | None = None
    """Step of the newest complete checkpoint."""
    step_seconds: StepSeconds | None = None
    message: str = ""
    """Human-readable detail (the error when ``phase`` is ``failed``)."""
    eval_accuracy: float | None = None
    """Greedy accuracy on the eval split at the last evaluation, in [0, 1]."""
    eval_sampled_accuracy: float | None = None
    """Share of correct answers among ``algorithm.evalSamples`` sampled per eval prompt at the
    last evaluation, in [0, 1]; None when the job evaluates greedily only."""
    sd_fraction: float | None = None
    """Share of the last rollout's tokens generated by speculative steps, in [0, 1]."""
    rollout_active: bool = False
    """A step's rollout is in progress (the harvest coordinator's ``rollout_active``)."""
    pending_workers: tuple[str, ...] = ()
    """Rollout workers that hold unanswered requests of the current rollout."""
    answers_done: int = 0
    answers_total: int = 0
    """Progress of the current rollout, in answers."""
    role: RoleState | None = None
    """The trainer's own activity (``train`` or ``drafter-train``), as a rollout worker reports
    it; None from a trainer without a role surface (older versions)."""
    idle_since: float | None = None
    """Unix time the trainer began waiting for the current rollout; None outside a rollout."""
    idle_seconds: float | None = None
    """Seconds it has waited for the current rollout (the harvest's idleness); None outside."""
    harvested_seconds: float = 0.0
    """Seconds the trainer spent training the drafter while it waited (whole run)."""
    drafter_training: DrafterTrainingStatus | None = None
    """The trainer's own drafter training; None when trainer harvesting is off."""
    figures_step: int | None = None
    """The step whose figures (reward, accuracy, accepted length, SD share, step seconds) this
    status carries: the last step completed with its eval, if it had one. It lags :attr:`step`
    while a trained step publishes its weights and evaluates; None before the first step of
    this trainer process completes."""
    worker_policy_versions: dict[str, int] = field(default_factory=dict)
    """Policy version each rollout worker holds, by worker name, as its last generate reply
    said (a worker not called yet by this trainer process is absent)."""

    def to_dict(self) -> dict[str, Any]:
        dt = self.drafter_training
        return {
            "step": self.step,
            "totalSteps": self.total_steps,
            "phase": self.phase,
            "policyVersion": self.policy_version,
            "drafterVersion": self.drafter_version,
            "rewardMean": self.reward_mean,
            "accuracy": self.accuracy,
            "acceptedLength": self.accepted_length,
            "acceptanceCollapsed": self.acceptance_collapsed,
            "lastCheckpointStep": self.last_checkpoint_step,
            "stepSeconds": None if self.step_seconds is None else self.step_seconds.to_dict(),
            "message": self.message,
            "evalAccuracy": self.eval_accuracy,
            "evalSampledAccuracy": self.eval_sampled_accuracy,
            "sdFraction": self.sd_fraction,
            "rolloutActive": self.rollout_active,
            "pendingWorkers": list(self.pending_workers),
            "answersDone": self.answers_done,
            "answersTotal": self.answers_total,
            "role": None if self.role is None else self.role.to_dict(),
            "idleSince": self.idle_since,
            "idleSeconds": self.idle_seconds,
            "harvestedSeconds": self.harvested_seconds,
            "drafterTraining": None if dt is None else dt.to_dict(),
            "figuresStep": self.figures_step,
            "workerPolicyVersions": dict(self.worker_policy_versions),
        }

    @classmethod
    def from_dict(cls, data: object) -> TrainerStatus:
        r = Reader(data, "status")
        accuracy = r.opt_num("accuracy", minimum=0.0)
        if accuracy is not None and accuracy > 1.0:
            raise ProtocolError(r.at("accuracy"), "must be in [0, 1]", accuracy)
        message = r.obj.get("message") or ""
        if not isinstance(message, str):
            raise ProtocolError(r.at("message"), "must be a string", message)
        return cls(
            step=r.int_("step"),
            total_steps=r.int_("totalSteps"),
            phase=r.choice("phase", get_args(TrainerPhase)),
            policy_version=r.int_("policyVersion"),
            drafter_version=r.int_("drafterVersion", minimum=-1),
            reward_mean=r.opt_num("rewardMean"),
            accuracy=accuracy,
            accepted_length=r.opt_num("acceptedLength", minimum=0.0),
            acceptance_collapsed=bool(r.obj.get("acceptanceCollapsed", False)),
            last_checkpoint_step=r.opt_int("lastCheckpointStep"),
            step_seconds=r.nested("stepSeconds", StepSeconds.from_dict),
            message=message,
            eval_accuracy=r.opt_num("evalAccuracy", minimum=0.0),
            eval_sampled_accuracy=r.opt_num("evalSampledAccuracy", minimum=0.0),
            sd_fraction=r.opt_num("sdFraction", minimum=0.0),
            rollout_active=bool(r.obj.get("rolloutActive", False)),
            pending_workers=_names(r.obj.get("pendingWorkers", []), r.at("pendingWorkers")),
            answers_done=r.int_("answersDone", required=False) if "answersDone" in r.obj else 0,
            answers_total=r.int_("answersTotal", required=False) if "answersTotal" in r.obj else 0,
            role=r.nested("role", RoleState.from_dict),
            idle_since=r.opt_num("idleSince", minimum=0.0),
            idle_seconds=r.opt_num("idleSeconds", minimum=0.0),
            harvested_seconds=r.opt_num("harvestedSeconds", minimum=0.0) or 0.0,
            drafter_training=r.nested("drafterTraining", DrafterTrainingStatus.from_dict),
            figures_step=r.opt_int("figuresStep"),
            worker_policy_versions=r.counts(
                "workerPolicyVersions", "worker names to policy versions"
            ),
        )


def _names(value: object, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProtocolError(path, "must be a list of worker names", value)
    return tuple(value)


@dataclass(frozen=True)
class CheckpointAnswer:
    """Body of a 200 answer to the trainer's ``POST /v1/checkpoint``: the checkpoint is
    complete on disk when the answer is sent."""

    step: int
    location: str
    """Directory of the checkpoint inside the trainer pod."""

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "location": self.location}

    @classmethod
    def from_dict(cls, data: object) -> CheckpointAnswer:
        r = Reader(data, "response")
        return cls(r.int_("step"), r.str_("location"))


# --- drafter worker -----------------------------------------------------------------------------

DrafterWorkerState = Literal["waiting", "training", "failed"]


@dataclass(frozen=True)
class CandidateSummary:
    """``lastCandidate`` in a drafter worker's status: the newest candidate it submitted."""

    base_version: int | None
    """The published drafter version its window trained from (None: the initial drafter)."""
    tokens: int
    """Training pairs since that version: its weight in the merge."""
    steps: int
    """The spot trainer's optimizer steps when the window ended."""

    def to_dict(self) -> dict[str, Any]:
        return {"baseVersion": self.base_version, "tokens": self.tokens, "steps": self.steps}

    @classmethod
    def from_dict(cls, data: object, path: str = "lastCandidate") -> CandidateSummary:
        r = Reader(data, path)
        return cls(r.opt_int("baseVersion"), r.int_("tokens"), r.int_("steps"))


@dataclass(frozen=True)
class DrafterWorkerStatus:
    """Body of a dedicated drafter worker's ``GET /v1/status``."""

    worker: str
    state: DrafterWorkerState
    """``waiting`` for a step's answers, ``training`` a window, ``failed`` (the spot trainer
    crashed: the process exits 1)."""
    step: int
    """The newest RL step whose answers were trained on (0: none yet)."""
    policy_version: int | None
    """The policy version loaded (None: the one loaded at start, not synced yet)."""
    drafter_base_version: int | None
    """The published drafter version the spot trainer trains from (None: the initial one)."""
    windows: int
    """Windows run since the process started."""
    outcomes: dict[str, int]
    """Windows by outcome: ``submitted``, ``dropped`` (quality gate), ``stale``, ``empty``."""
    last_candidate: CandidateSummary | None
    last_error: str | None
    """The last failed turn's error (the trainer's endpoints), or the crash when ``failed``."""
    drafter_training: DrafterTrainingStatus

    def to_dict(self) -> dict[str, Any]:
        last = self.last_candidate
        return {
            "worker": self.worker,
            "role": "drafter",
            "state": self.state,
            "step": self.step,
            "policyVersion": self.policy_version,
            "drafterBaseVersion": self.drafter_base_version,
            "windows": self.windows,
            "outcomes": dict(self.outcomes),
            "lastCandidate": None if last is None else last.to_dict(),
            "lastError": self.last_error,
            "drafterTraining": self.drafter_training.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: object) -> DrafterWorkerStatus:
        r = Reader(data, "status")
        return cls(
            worker=r.str_("worker"),
            state=r.choice("state", get_args(DrafterWorkerState)),
            step=r.int_("step"),
            policy_version=r.opt_int("policyVersion"),
            drafter_base_version=r.opt_int("drafterBaseVersion"),
            windows=r.int_("windows"),
            outcomes=r.counts("outcomes", "outcomes to window counts"),
            last_candidate=r.nested("lastCandidate", CandidateSummary.from_dict),
            last_error=r.opt_str("lastError"),
            drafter_training=DrafterTrainingStatus.from_dict(
                r.raw("drafterTraining"), r.at("drafterTraining")
            ),
        )
