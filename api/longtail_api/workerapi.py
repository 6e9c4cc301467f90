"""Wire types of the worker control surfaces the operator (and local mode) drive.

Two services, one module, so the operator never imports the workers to read them:

- a rollout worker (``longtail_workers.rollout.http``): ``GET /v1/status`` ->
  :class:`RolloutWorkerStatus`, ``PUT /v1/role`` with :class:`RoleRequest` -> :class:`RoleAnswer`
  (200 acknowledged, 202 still completing, 409 refused now, 400 malformed);
- the trainer (the RL-loop service): ``GET /v1/status`` -> :class:`TrainerStatus`,
  ``POST /v1/checkpoint`` -> :class:`CheckpointAnswer`, which the operator sends before it
  deletes pods on ``suspend: true``, and ``PUT /v1/role`` like a rollout worker (activities
  :data:`TRAINER_ACTIVITIES`: ``train``, or ``drafter-train`` while it waits for a rollout when
  ``trainer`` is in ``harvest.eligibleRoles``).

JSON keys are camelCase like the RLJob API. ``from_dict`` checks every field it reads (type and
range) and raises :class:`~longtail_api.protocol.ProtocolError` naming the path, the value and
the fix. Unknown keys in *responses* are ignored on purpose: the operator and the workers are
upgraded independently, and an older operator must keep reading a newer worker's status. Round
trips (``from_dict(x).to_dict() == x`` for a real worker's answer) are tested.

Pure module: standard library and ``longtail_api`` only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

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
WORKER_ACTIVITIES: tuple[Activity, ...] = ("rollout", "drafter-train")
"""Activities a rollout worker can be assigned."""
TRAINER_ACTIVITIES: tuple[Activity, ...] = ("train", "drafter-train")
"""Activities the trainer can be assigned (``drafter-train`` only during a step's rollout)."""


class _Reader:
    """Typed field access on one JSON object, with error paths."""

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

    def opt_int(self, key: str, *, minimum: int | None = 0) -> int | None:
        if self.obj.get(key) is None:
            return None
        return self.int_(key, minimum=minimum)

    def num(self, key: str, *, minimum: float | None = None) -> float:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(self.at(key), "must be a number", value)
        number = float(value)
        if not math.isfinite(number):
            raise ProtocolError(self.at(key), "must be a finite number", value)
        if minimum is not None and number < minimum:
            raise ProtocolError(self.at(key), f"must be >= {minimum}", value)
        return number

    def opt_num(self, key: str, *, minimum: float | None = None) -> float | None:
        return None if self.obj.get(key) is None else self.num(key, minimum=minimum)

    def choice(self, key: str, options: tuple[str, ...]) -> Any:
        value = self.raw(key)
        if value not in options:
            raise ProtocolError(
                self.at(key), f"must be one of {', '.join(map(repr, options))}", value
            )
        return value

    def mapping(self, key: str, *, required: bool = True) -> dict[str, Any] | None:
        value = self.raw(key, required=required)
        if value is None and not required:
            return None
        if not isinstance(value, Mapping):
            raise ProtocolError(self.at(key), "must be a JSON object", value)
        return dict(value)


def activity(value: object, path: str) -> Activity:
    """Check that ``value`` is an activity name (``longtail_api.harvest.Activity``)."""
    if not isinstance(value, str) or value not in get_args(Activity):
        known = ", ".join(get_args(Activity))
        raise ProtocolError(path, f"must be an activity ({known})", value)
    return value  # type: ignore[return-value]


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
        r = _Reader(data, path)
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
        r = _Reader(data, path)
        return cls(r.int_("policy"), r.int_("drafter", minimum=-1), r.int_("step"))


@dataclass(frozen=True)
class RolloutWorkerStatus:
    """Body of a rollout worker's ``GET /v1/status``.

    ``buffer``, ``trainer`` and ``acceptance`` are carried as plain JSON (the operator reads
    only :attr:`mean_accepted_length` from them); the rest is typed.
    """

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
    buffer: dict[str, Any] = field(default_factory=dict)
    trainer: dict[str, Any] | None = None
    acceptance: dict[str, Any] = field(default_factory=dict)

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
            "buffer": self.buffer,
            "trainer": self.trainer,
            "acceptance": self.acceptance,
        }

    @classmethod
    def from_dict(cls, data: object) -> RolloutWorkerStatus:
        r = _Reader(data, "status")
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
            buffer=r.mapping("buffer", required=False) or {},
            trainer=r.mapping("trainer", required=False),
            acceptance=r.mapping("acceptance", required=False) or {},
        )

    @property
    def mean_accepted_length(self) -> float | None:
        """Mean accepted length under the drafter version the worker uses now, if measured."""
        by_drafter = self.acceptance.get("byDrafterVersion")
        if not isinstance(by_drafter, Mapping):
            return None
        stats = by_drafter.get(str(self.versions.drafter))
        value = stats.get("meanAcceptedLength") if isinstance(stats, Mapping) else None
        return float(value) if isinstance(value, int | float) and value > 0 else None


@dataclass(frozen=True)
class RoleRequest:
    """Body of ``PUT /v1/role``."""

    role: Activity

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role}

    @classmethod
    def from_dict(cls, data: object) -> RoleRequest:
        r = _Reader(data, "request")
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
        r = _Reader(data, path)
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
        r = _Reader(data, "response")
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
        r = _Reader(data, path)
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
    drafter_training: dict[str, Any] | None = None
    """The trainer's own drafter training (buffer, spot trainer), as plain JSON; None when
    trainer harvesting is off."""
    figures_step: int | None = None
    """The step whose figures (reward, accuracy, accepted length, SD share, step seconds) this
    status carries: the last step completed with its eval, if it had one. It lags :attr:`step`
    while a trained step publishes its weights and evaluates; None before the first step of
    this trainer process completes."""
    worker_policy_versions: dict[str, int] = field(default_factory=dict)
    """Policy version each rollout worker holds, by worker name, as its last generate reply
    said (a worker not called yet by this trainer process is absent)."""

    def to_dict(self) -> dict[str, Any]:
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
            "drafterTraining": self.drafter_training,
            "figuresStep": self.figures_step,
            "workerPolicyVersions": dict(self.worker_policy_versions),
        }

    @classmethod
    def from_dict(cls, data: object) -> TrainerStatus:
        r = _Reader(data, "status")
        accuracy = r.opt_num("accuracy", minimum=0.0)
        if accuracy is not None and accuracy > 1.0:
            raise ProtocolError(r.at("accuracy"), "must be in [0, 1]", accuracy)
        seconds = r.obj.get("stepSeconds")
        message = r.obj.get("message") or ""
        if not isinstance(message, str):
            raise ProtocolError(r.at("message"), "must be a string", message)
        role = r.obj.get("role")
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
            step_seconds=None if seconds is None else StepSeconds.from_dict(seconds),
            message=message,
            eval_accuracy=r.opt_num("evalAccuracy", minimum=0.0),
            eval_sampled_accuracy=r.opt_num("evalSampledAccuracy", minimum=0.0),
            sd_fraction=r.opt_num("sdFraction", minimum=0.0),
            rollout_active=bool(r.obj.get("rolloutActive", False)),
            pending_workers=_names(r.obj.get("pendingWorkers", []), r.at("pendingWorkers")),
            answers_done=r.int_("answersDone", required=False) if "answersDone" in r.obj else 0,
            answers_total=r.int_("answersTotal", required=False) if "answersTotal" in r.obj else 0,
            role=None if role is None else RoleState.from_dict(role, r.at("role")),
            idle_since=r.opt_num("idleSince", minimum=0.0),
            idle_seconds=r.opt_num("idleSeconds", minimum=0.0),
            harvested_seconds=r.opt_num("harvestedSeconds", minimum=0.0) or 0.0,
            drafter_training=r.mapping("drafterTraining", required=False),
            figures_step=r.opt_int("figuresStep"),
            worker_policy_versions=_versions(r, "workerPolicyVersions"),
        )


def _versions(r: _Reader, key: str) -> dict[str, int]:
    """An optional ``{worker: version}`` object (absent from trainers of older versions)."""
    value = r.raw(key, required=False)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in value.items()
    ):
        raise ProtocolError(r.at(key), "must map worker names to policy versions (>= 0)", value)
    return dict(value)


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
        r = _Reader(data, "response")
        return cls(r.int_("step"), r.str_("location"))
