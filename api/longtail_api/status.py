"""The RLJob status: what the operator reports under ``status:``.

Typed like the spec (``spec.py``) so the CRD's status schema is generated from the same place
that the operator's status derivation fills in. Conditions follow the ``metav1.Condition``
shape. ``PHASES`` and the condition types are the stable vocabulary dashboards and alerts use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from longtail_api.fields import spec_field

Phase = Literal["Pending", "Queued", "Initializing", "Running", "Suspended", "Succeeded", "Failed"]
PHASES: tuple[str, ...] = (
    "Pending",
    "Queued",
    "Initializing",
    "Running",
    "Suspended",
    "Succeeded",
    "Failed",
)

CONDITION_TYPES: tuple[str, ...] = (
    "RolloutReady",
    "VerifierReady",
    "TrainerReady",
    "DrafterReady",
    "DrafterTraining",
    "Suspended",
    "Complete",
    "Failed",
    "ValidationFailed",
    "SpecAccepted",
    "Queued",
    "RolloutCapacity",
)
"""Condition types the operator sets (``<Role>Ready`` per role). ``SpecAccepted``: whether the
job runs the spec as written (True ``Accepted``), or, False, still the last accepted one:
``InvalidSpec`` (the edit fails validation), ``ImmutableFieldChanged`` (a frozen field changed
while the job runs, ``longtail_api.mutability``) or ``WaitingForPodsToStop`` (a frozen change
while suspended, applied once the job's pods are gone). ``RolloutCapacity`` (elastic rollout,
``spec.rollout.minReplicas`` set): True while at least ``minReplicas`` rollout workers are
ready, False ``BelowMinReplicas`` naming the counts."""

SPEC_ACCEPTED = "SpecAccepted"


@dataclass
class Condition:
    """One condition, with the fields of Kubernetes' metav1.Condition."""

    type: str = spec_field(max_length=316)
    """Condition type in CamelCase, e.g. ``RolloutReady``."""
    status: Literal["True", "False", "Unknown"] = spec_field()
    """Whether the condition holds."""
    reason: str = spec_field(max_length=1024)
    """CamelCase reason for the last transition."""
    last_transition_time: str = spec_field()
    """When the status last changed (RFC 3339)."""
    message: str = spec_field("", max_length=32768)
    """Human-readable detail."""
    observed_generation: int | None = spec_field(None, minimum=0)
    """The spec generation the condition was computed from."""


@dataclass
class DrafterStatus:
    """The drafter's progress."""

    version: int = spec_field(0, minimum=0)
    """Newest published drafter version."""
    acceptance_length: float | None = spec_field(None, minimum=0.0)
    """Mean accepted tokens per verify step in the last rollout."""
    acceptance_length_by_source: dict[str, float] = spec_field(default_factory=dict)
    """``acceptanceLength`` of the rows each draft source drafted (``learned``: the drafter
    model, ``history``: the history drafter, ``speculative.strategies[].drafter``) in the last
    step."""
    sd_fraction_by_source: dict[str, float] = spec_field(default_factory=dict)
    """Share of the last step's tokens committed in speculative steps by the rows each draft
    source drafted, in [0, 1]."""
    last_trained: str | None = spec_field(None)
    """When the newest version was published (RFC 3339)."""
    unpublished: str | None = spec_field(None)
    """Why the trainer has published no online drafter version yet (e.g. every candidate
    scored below the initial drafter on its held-out sample, or no idle window trained one);
    absent once one is published."""


@dataclass
class GpuStatus:
    """GPU accounting for the job."""

    total: int = spec_field(0, minimum=0)
    """GPUs requested by all worker pods."""
    idle: int = spec_field(0, minimum=0)
    """GPUs currently idle."""
    harvested: int = spec_field(0, minimum=0)
    """GPUs currently reassigned to drafter training."""
    harvested_gpu_seconds: float = spec_field(0.0, minimum=0.0)
    """Total GPU-seconds spent on drafter training that would otherwise have idled."""
    drafter: int = spec_field(0, minimum=0)
    """GPUs of the ready dedicated drafter pods (``spec.drafter``): drafter-training capacity
    that trains all the time, in addition to ``harvested`` (and never counted in it)."""


@dataclass
class RoleStatus:
    """Readiness of one role."""

    ready: int = spec_field(0, minimum=0)
    """Ready replicas."""
    total: int = spec_field(0, minimum=0)
    """Desired replicas."""
    failed: int = spec_field(0, minimum=0)
    """Worker pods of this role that failed and were replaced; the job fails (reason
    BackoffLimitExceeded) once this exceeds ``backoffLimit``."""


@dataclass
class WorkerStatus:
    """One worker pod's assigned versus observed role."""

    name: str = spec_field()
    """Pod name."""
    role: str = spec_field()
    """The pod's role in the job (rollout, verifier, trainer, drafter)."""
    assigned_role: str | None = spec_field(None)
    """Activity the operator last assigned (``rollout``, ``train`` for the trainer, or
    ``drafter-train``)."""
    observed_role: str | None = spec_field(None)
    """Activity the worker last acknowledged."""
    since: str | None = spec_field(None)
    """When the assignment was sent (RFC 3339)."""
    message: str | None = spec_field(None, max_length=1024)
    """Why the assignment is not acknowledged yet (the worker's refusal or the last error);
    the operator keeps retrying with backoff."""


@dataclass
class TrainerRestart:
    """One restart of the whole trainer group."""

    time: str = spec_field()
    """When the operator restarted the group (RFC 3339)."""
    reason: str = spec_field(max_length=1024)
    """CamelCase reason: ``TrainerPodFailed``, ``TrainerPodDeleted``, ``TrainerPodExited``
    or ``TrainerWorldChanged`` (``trainer.replicas`` or ``trainer.resources.gpus`` changed)."""
    pod: str = spec_field("", max_length=253)
    """The trainer pod that broke the group (empty for a world change)."""
    message: str = spec_field("", max_length=1024)
    """What happened, for people."""


@dataclass
class TrainerGroupStatus:
    """The trainer group: ``replicas`` pods that form one torch.distributed world."""

    replicas: int = spec_field(0, minimum=0)
    """Trainer pods in the group (``trainer.replicas``)."""
    local_world_size: int = spec_field(0, minimum=0)
    """Trainer ranks per pod: one per GPU, one on CPU."""
    world_size: int = spec_field(0, minimum=0)
    """All trainer ranks: ``replicas`` x ``localWorldSize``."""
    restarts: int = spec_field(0, minimum=0)
    """Restarts of the whole group after one of its pods failed, was deleted or exited (each
    failure or deletion also counts in ``roles.trainer.failed``, against ``backoffLimit``).
    The trainer pods carry it as label ``longtail.dev/trainer-group``."""
    formed: bool = spec_field(False)
    """Every pod of the current group has existed at once; from then on a missing pod means
    the group lost a rank and restarts."""
    last_restart: TrainerRestart | None = spec_field(None)
    """The newest restart of the group, and why."""


@dataclass
class WeightSyncStatus:
    """How policy versions reach the rollout workers, and which one each worker holds."""

    transport: str | None = spec_field(None)
    """The transport in use: ``http`` or ``broadcast`` (``spec.weightSync.transport``, with
    ``auto`` resolved)."""
    worker_policy_versions: dict[str, int] = spec_field(default_factory=dict)
    """Policy version each rollout worker holds, by worker name, from the trainer (each
    worker's last generate reply says which version it generated with). Phase timings and
    GB/s are metrics (``longtail_weight_sync_*``) and step rows, not status."""


@dataclass
class RolloutShrink:
    """Rollout workers the job lost without a crash of their own, or by one (elastic rollout)."""

    time: str = spec_field()
    """When the operator saw it (RFC 3339)."""
    reason: str = spec_field(max_length=1024)
    """CamelCase: ``PodDeleted`` (deleted or evicted through the Eviction API by someone else:
    a drain, a preemption; not charged to ``backoffLimit``), ``PodEvicted`` (the kubelet or a
    controller marked it evicted or disrupted; not charged) or ``PodFailed`` (its container
    failed by itself; charged to ``backoffLimit``)."""
    pods: list[str] = spec_field(default_factory=list)
    """The rollout pods lost."""
    message: str = spec_field("", max_length=1024)
    """What happened, for people."""


@dataclass
class RolloutCapacityStatus:
    """The rollout workers an elastic job wants, was given and has (``spec.rollout.minReplicas``
    set; absent otherwise)."""

    desired: int = spec_field(0, minimum=0)
    """``spec.rollout.replicas``: the most the job runs with."""
    min_replicas: int = spec_field(0, minimum=0)
    """``spec.rollout.minReplicas``: the fewest it runs with."""
    admitted: int | None = spec_field(None, minimum=0)
    """Rollout pods Kueue admitted (its partial admission); absent without Kueue."""
    ready: int = spec_field(0, minimum=0)
    """Ready rollout workers now."""
    below_min_since: str | None = spec_field(None)
    """Since when fewer than ``minReplicas`` are ready after the job had them (RFC 3339);
    past ``belowMinGraceSeconds`` the job checkpoints and waits."""
    last_shrink: RolloutShrink | None = spec_field(None)
    """The newest loss of rollout workers, and why."""


@dataclass
class RLJobStatus:
    """Observed state of an RLJob."""

    phase: Phase = spec_field("Pending")
    """Lifecycle phase."""
    conditions: list[Condition] = spec_field(default_factory=list)
    """Current conditions."""
    observed_generation: int | None = spec_field(None, minimum=0)
    """The spec generation this status reflects."""
    step: int = spec_field(0, minimum=0)
    """Completed RL steps."""
    total_steps: int | None = spec_field(None, minimum=0)
    """RL steps the job will run."""
    reward_mean: float | None = spec_field(None)
    """Mean reward of the last completed step."""
    policy_version: int = spec_field(0, minimum=0)
    """Version of the policy weights rollout workers load."""
    drafter: DrafterStatus = spec_field(default_factory=DrafterStatus)
    """Drafter progress."""
    gpus: GpuStatus = spec_field(default_factory=GpuStatus)
    """GPU accounting."""
    roles: dict[str, RoleStatus] = spec_field(default_factory=dict)
    """Readiness per role name."""
    ready: str | None = spec_field(None, pattern=r"^[0-9]+/[0-9]+$", pattern_hint="ready/total")
    """Ready worker pods of every role over the pods the spec asks for, e.g. ``3/4`` (the
    Ready column, as for Deployments)."""
    trainer: TrainerGroupStatus = spec_field(default_factory=TrainerGroupStatus)
    """The trainer group's world size and restarts."""
    workers: list[WorkerStatus] = spec_field(default_factory=list)
    """Per worker: assigned versus observed role."""
    weight_sync: WeightSyncStatus = spec_field(default_factory=WeightSyncStatus)
    """The weight-sync transport and each rollout worker's held policy version."""
    rollout: RolloutCapacityStatus | None = spec_field(None)
    """Elastic rollout: desired, admitted and ready rollout workers and the last shrink
    (absent unless ``spec.rollout.minReplicas`` is set)."""
    start_time: str | None = spec_field(None)
    """When the job started running (RFC 3339)."""
    completion_time: str | None = spec_field(None)
    """When the job succeeded or failed (RFC 3339)."""
