"""The operator's plain types: what a reconcile observed, the plan it made, and their parts.

The floor the planner stands on: ``derive.py``, ``conditions.py`` and ``placement.py`` read an
:class:`Observed` and fill a :class:`Plan`; ``reconcile.py`` builds the one and executes the
other; ``kube.py`` and ``checkpoints.py`` post :class:`Event` s; ``harvester.py`` hands the
plan a :class:`HarvestSnapshot`. Types only, so every one of them can import this module without
an import circle, and the planner names the harvest snapshot without importing the harvest
transport's network client (import-linter contracts in pyproject.toml keep both true).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal, NamedTuple

from longtail_api.spec import RLJobSpec
from longtail_api.status import RLJobStatus, WorkerStatus
from longtail_api.workerapi import TrainerStatus
from longtail_operator.builders import JobRef
from longtail_operator.kueue import View
from longtail_operator.observe import PodView
from longtail_operator.specgate import SpecGate

PlanPhase = Literal["running", "Queued", "Suspended", "Succeeded", "Failed"]
"""The phase the plan decides before it counts pods: ``running`` (the job's pods are wanted)
becomes ``Running``, ``Initializing`` or ``Pending`` in the status (its
:data:`longtail_api.status.Phase`) once readiness is known; the others are written as they are."""

RUNNING: Final = "running"

Terminal = Literal["Succeeded", "Failed"]
TERMINAL: Final[tuple[Terminal, ...]] = ("Succeeded", "Failed")
"""Phases a job never leaves."""


class ObjectKey(NamedTuple):
    """One Kubernetes object the operator owns, as the API names it."""

    api_version: str
    kind: str
    name: str


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the RLJob (``type`` is ``Normal`` or ``Warning``)."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class HarvestSnapshot:
    """What the status derivation needs from the harvest loop (``Harvester.snapshot``)."""

    workers: tuple[WorkerStatus, ...] = ()
    idle_gpus: int = 0
    harvested_gpus: int = 0
    harvested_gpu_seconds: float = 0.0
    training_workers: int = 0
    unacknowledged: tuple[str, ...] = ()
    accepted_length: float | None = None
    """Mean accepted length reported by the workers (their current drafter version)."""
    unreachable: tuple[str, ...] = ()
    """``NAME: last error`` of each worker whose status polls keep failing, sorted."""
    source: str = "workers"
    """The idleness source (``spec.harvest.source``) of the last step."""
    source_error: str | None = None
    """Why the last read of the source gave nothing (Prometheus down or misconfigured)."""


@dataclass
class Observed:
    """Everything ``reconcile.py`` read for one RLJob, the plan's only input."""

    job: JobRef
    spec: RLJobSpec | None
    """The spec to run under (``specgate.decide``); None when the job never had a valid one."""
    raw_spec: dict[str, Any]
    """The same as stored (the ConfigMap's content)."""
    errors: tuple[str, ...]
    """Validation errors of the spec as written (the edit)."""
    previous: RLJobStatus
    pods: tuple[PodView, ...]
    services: frozenset[str]
    configmap: dict[str, Any] | None
    """The ConfigMap's ``data``; None when it does not exist."""
    now: datetime
    trainer: TrainerStatus | None = None
    harvest: HarvestSnapshot | None = None
    counted: frozenset[str] = frozenset()
    """UIDs of failed pods already counted against backoffLimit."""
    rejected: tuple[str, ...] = ()
    """The API server's refusals of objects made from the spec as written (``Kube.refusal``:
    a dry run of every object a plan creates), each naming the object and the API's message;
    handled as validation errors, with reason ``ChildRejected``."""
    network_policy: bool | None = None
    """Whether the job's NetworkPolicy exists; None when the operator manages none."""
    trainer_policy: bool | None = None
    """Whether the trainer group's NetworkPolicy exists; None when the operator manages none
    (or did not look)."""
    weight_sync_policy: bool | None = None
    """Whether the weight-sync NetworkPolicy (``broadcast`` jobs) exists; None when the
    operator manages none (or did not look)."""
    gate: SpecGate | None = None
    """Why ``spec`` is or is not the spec as written (``SpecAccepted``); None: accepted."""
    gang_group: bool | None = None
    """Whether the job's gang group object exists (None: not read, the job has no gang)."""
    queue: str | None = None
    """The RLJob's ``kueue.x-k8s.io/queue-name`` label: it asks for admission by Kueue."""
    priority: str | None = None
    """The RLJob's ``kueue.x-k8s.io/priority-class`` label (a WorkloadPriorityClass)."""
    kueue_served: bool | None = None
    """Whether the cluster serves Kueue's Workload API (None: not known, or not asked)."""
    kueue_enabled: bool = True
    """Whether this install does Kueue admission (``Settings.kueue``); False: a labelled job
    waits, told so."""
    workload: View | None = None
    """The job's Kueue Workload (None: none, or no queue label)."""


@dataclass
class Plan:
    """What ``reconcile.py`` does for one RLJob now (``derive.plan`` makes it)."""

    status: RLJobStatus
    events: list[Event] = field(default_factory=list)
    create: list[dict[str, Any]] = field(default_factory=list)
    update: list[dict[str, Any]] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
    delete_objects: list[tuple[str, str]] = field(default_factory=list)
    """(kind, name) of Services/ConfigMaps/NetworkPolicies to delete (TTL, removed roles); a
    custom object's kind is ``apiVersion/Kind``."""
    checkpoint: bool = False
    """Ask the trainer to checkpoint before deleting the pods (suspend, trainer world change)."""
    checkpoint_reason: str = "suspend"
    """Why, as the checkpoint request says it (``suspend``, ``resize``, or a
    ``derive.CHECKPOINT_BEFORE`` value)."""
    counted: list[str] = field(default_factory=list)
    patches: list[tuple[str, str, str, dict[str, Any], bool]] = field(default_factory=list)
    """Merge patches of custom objects: (apiVersion, plural, name, patch, of its status)."""
