"""The operator's plain types: what a reconcile observed, the plan it made, and their parts.

The floor the planner stands on: ``derive.py``, ``children.py``, ``diff.py``, ``status.py``,
``conditions.py`` and ``placement.py`` read an :class:`Observed` (the pods, and every other
owned object by :class:`ObjectKey`) and fill a :class:`Plan` (typed :class:`Change` rows and
:class:`Patch` es); ``reconcile.py`` builds the one and ``execute.py`` carries out the other;
``kube.py`` and ``checkpoints.py`` post :class:`Event` s; ``harvester.py`` hands the plan a
:class:`HarvestSnapshot`. Types only, so every one of them can import this module without
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
from longtail_operator.kueue import Priority, View
from longtail_operator.naming import JobRef
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


CORE_APIS: Final = ("v1", "networking.k8s.io/v1")
"""API versions whose kinds ``Kube.delete`` names by the kind alone."""


class ObjectKey(NamedTuple):
    """One Kubernetes object the operator owns, as the API names it."""

    api_version: str
    kind: str
    name: str

    @classmethod
    def of(cls, obj: dict[str, Any]) -> ObjectKey:
        """The key of a manifest (``apiVersion``, ``kind``, ``metadata.name``)."""
        return cls(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])

    @property
    def kube_kind(self) -> str:
        """The kind as ``Kube.delete`` takes it: ``Pod``, ``NetworkPolicy``, or
        ``group/version/Kind`` of a custom object."""
        if self.api_version in CORE_APIS:
            return self.kind
        return f"{self.api_version}/{self.kind}"


Op = Literal["create", "update", "delete"]


class Change(NamedTuple):
    """One row of the diff between the desired and the observed objects (``diff.py``)."""

    op: Op
    key: ObjectKey
    body: dict[str, Any] | None
    """The object to create or replace (None for a delete)."""
    reason: str
    """Why, in words (for the log and the events)."""


class Patch(NamedTuple):
    """A JSON merge patch of a custom object the job owns (its Kueue Workload)."""

    key: ObjectKey
    plural: str
    patch: dict[str, Any]
    status: bool
    """Of its status subresource."""


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
    now: datetime
    owned: dict[ObjectKey, dict[str, Any]] = field(default_factory=dict)
    """The job's other objects as found, by key: its Services, ConfigMap, NetworkPolicies
    (read while ``Settings.network_policy``), gang group (read while the job has a gang). The
    pods are :attr:`pods`, the Workload :attr:`workload`; ``diff.observed`` joins them."""
    trainer: TrainerStatus | None = None
    harvest: HarvestSnapshot | None = None
    counted: frozenset[str] = frozenset()
    """UIDs of failed pods already counted against backoffLimit."""
    known: frozenset[tuple[str, str]] = frozenset()
    """``(name, uid)`` of the rollout pods alive after the last pass and not deleted by it
    (in memory, like :attr:`counted`): one missing now was taken away (``elastic.lost``)."""
    rejected: tuple[str, ...] = ()
    """The API server's refusals of objects made from the spec as written (``Kube.refusal``:
    a dry run of every object a plan creates), each naming the object and the API's message;
    handled as validation errors, with reason ``ChildRejected``."""
    gate: SpecGate | None = None
    """Why ``spec`` is or is not the spec as written (``SpecAccepted``); None: accepted."""
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
    workload_priority: Priority | None = None
    """The priority class the Workload to make names, with its value (``value`` None: no such
    class); read only while Kueue manages the job and its Workload is yet to be made."""


@dataclass
class Plan:
    """What ``reconcile.py`` does for one RLJob now (``derive.plan`` makes it)."""

    status: RLJobStatus
    events: list[Event] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    """Creates, updates and deletes: the desired set's diff against what was observed."""
    patches: list[Patch] = field(default_factory=list)
    checkpoint: bool = False
    """Ask the trainer to checkpoint before deleting the pods (suspend, trainer world change)."""
    checkpoint_reason: str = "suspend"
    """Why, as the checkpoint request says it (``suspend``, ``resize``, or a
    ``derive.CHECKPOINT_BEFORE`` value)."""
    counted: list[str] = field(default_factory=list)

    def bodies(self, op: Op, kind: str | None = None) -> list[dict[str, Any]]:
        return [
            c.body
            for c in self.changes
            if c.op == op and c.body is not None and kind in (None, c.key.kind)
        ]

    @property
    def create(self) -> list[dict[str, Any]]:
        """The objects to create, pods included."""
        return self.bodies("create")

    @property
    def update(self) -> list[dict[str, Any]]:
        """The objects to replace (the ConfigMap)."""
        return self.bodies("update")

    @property
    def delete_pods(self) -> list[str]:
        return [c.key.name for c in self.changes if c.op == "delete" and c.key.kind == "Pod"]

    @property
    def delete_objects(self) -> list[ObjectKey]:
        """The objects other than pods to delete."""
        return [c.key for c in self.changes if c.op == "delete" and c.key.kind != "Pod"]

    def keep_pods(self) -> None:
        """Delete no pod this pass (the trainer's checkpoint is still running)."""
        self.changes = [c for c in self.changes if not (c.op == "delete" and c.key.kind == "Pod")]
