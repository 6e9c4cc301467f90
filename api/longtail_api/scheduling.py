"""Gang placement of an RLJob's pods: the ``spec.scheduling`` block of the RLJob API.

A gang scheduler starts a job's pods together or not at all, so a trainer group never sits
half-scheduled holding GPUs while the rest waits. The user picks one per job (issue #37):
Volcano, the scheduler-plugins coscheduling plugin, NVIDIA's KAI scheduler or core Kubernetes
gang scheduling (``scheduling.k8s.io/v1alpha2``, alpha in 1.35/1.36, behind the
``GenericWorkload`` and ``GangScheduling`` gates); the operator's install may set a default
(:class:`DefaultGang`, from the chart's ``scheduling.defaultGang``) that ``backend: none`` opts
a job out of. The block also holds the pods' ``priorityClassName`` and the topology request
(``topology.py``: its entries, and what each placer can express, :func:`scheduling_problems`;
issue #52). The operator
(``longtail_operator.gang``) turns this block into one group object per RLJob and the pods'
labels, annotations and ``schedulerName``; ``spec.py`` holds it in :class:`RLJobSpec`, the
CRD and the reference docs are generated from it. Frozen while the job runs (a change applies
on the next resume), like every field not listed as live in ``mutability.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from longtail_api.fields import spec_field
from longtail_api.topology import TopologySpec, topology_problems

GangBackend = Literal["volcano", "coscheduling", "kai", "kubernetes", "none"]
BACKENDS: tuple[str, ...] = ("volcano", "coscheduling", "kai", "kubernetes")
"""The gang schedulers (``none`` is the opt-out, not a backend)."""

GROUP_APIS: dict[str, tuple[str, str]] = {
    "volcano": ("scheduling.volcano.sh", "v1beta1"),
    "coscheduling": ("scheduling.x-k8s.io", "v1alpha1"),
    "kai": ("scheduling.run.ai", "v2alpha2"),
    "kubernetes": ("scheduling.k8s.io", "v1alpha2"),
}
"""``(group, version)`` of each backend's ``PodGroup`` (plural ``podgroups``, namespaced); the
operator builds them, the chart grants them (one RBAC rule per backend)."""

DEFAULT_SCHEDULER = {
    "volcano": "volcano",
    "coscheduling": "scheduler-plugins-scheduler",
    "kai": "kai-scheduler",
    "kubernetes": "default-scheduler",
}
"""``schedulerName`` per backend when ``gang.schedulerName`` is empty: the name each project's
own install gives its scheduler (Volcano's chart, scheduler-plugins' second-scheduler chart,
KAI's chart; core gang scheduling is a plugin of kube-scheduler itself)."""
QUEUED_BACKENDS = ("volcano", "kai")
"""Backends with queues; the others refuse ``queue``."""

_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A DNS-1123 subdomain: the name of a PriorityClass (and of most cluster objects)."""


@dataclass
class GangSpec:
    """One group object for all the job's pods, placed all together or not at all."""

    backend: GangBackend = spec_field(fix="use volcano, coscheduling, kai, kubernetes or none")
    """Gang scheduler: ``volcano`` (Volcano ``PodGroup``), ``coscheduling`` (scheduler-plugins
    ``PodGroup``), ``kai`` (NVIDIA KAI ``PodGroup`` with a subgroup per role), ``kubernetes``
    (core ``scheduling.k8s.io/v1alpha2`` ``PodGroup`` with a gang policy; Kubernetes >= 1.36
    with the ``GenericWorkload`` and ``GangScheduling`` feature gates), or ``none``: no gang,
    even where the operator's install sets a default one."""
    queue: str | None = spec_field(
        None, pattern=_NAME, pattern_hint="a queue name (lowercase, digits, '-', '.')"
    )
    """The scheduler's queue (Volcano and KAI; coscheduling and kubernetes have none). Empty:
    Volcano's ``default`` queue; KAI needs one."""
    scheduler_name: str | None = spec_field(
        None, pattern=_NAME, pattern_hint="a scheduler name (lowercase, digits, '-', '.')"
    )
    """The pods' ``schedulerName``. Empty: the backend's usual name (``volcano``,
    ``scheduler-plugins-scheduler``, ``kai-scheduler``, ``default-scheduler``)."""
    schedule_timeout_seconds: int = spec_field(600, minimum=1, maximum=86_400)
    """How long coscheduling waits for the whole gang before it gives the pods' reservations
    back and retries (its ``scheduleTimeoutSeconds``). The other backends use their own
    (kube-scheduler's gang plugin: a fixed 5 minutes in 1.36)."""
    topology_name: str | None = spec_field(
        None, pattern=DNS_SUBDOMAIN, pattern_hint="a KAI Topology name", max_length=253
    )
    """KAI only: the cluster's KAI ``Topology`` object (``kai.scheduler/v1alpha1``) whose
    levels ``scheduling.topology`` names; needed when the job asks for a topology with
    ``backend: kai``."""

    def resolved_scheduler(self) -> str:
        return self.scheduler_name or DEFAULT_SCHEDULER[self.backend]


@dataclass(frozen=True)
class DefaultGang:
    """The gang the operator's install gives a job whose spec names none (chart value
    ``scheduling.defaultGang``; ``LONGTAIL_OPERATOR_DEFAULT_GANG_*``)."""

    backend: str = ""
    """One of :data:`BACKENDS`; empty: no default, jobs without ``scheduling.gang`` run
    ungrouped."""
    queue: str = ""
    """The default's queue (Volcano, KAI)."""
    scheduler_name: str = ""
    """The default's ``schedulerName``; empty: the backend's usual one."""

    def problems(self) -> list[str]:
        """What is wrong with this default (empty: usable), each naming the fix."""
        if not self.backend:
            return ["queue or schedulerName set without a backend"] if self.queue else []
        if self.backend not in BACKENDS:
            return [f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}"]
        gang = GangSpec(self.backend, self.queue or None, self.scheduler_name or None)  # type: ignore[arg-type]
        return [f"{field}: {why}; {fix}" for field, why, fix in gang_problems(gang)]


def gang_problems(gang: GangSpec) -> list[tuple[str, str, str]]:
    """``(field, what is wrong, fix)`` of a gang block's cross-field rules (``rules.py`` turns
    them into field errors; :class:`DefaultGang` into a settings error)."""
    if gang.backend == "kai" and not gang.queue:
        why = "the KAI scheduler places a PodGroup only in a queue, and none is set"
        return [("queue", why, "set it to one of the cluster's KAI queues")]
    if gang.queue and gang.backend not in QUEUED_BACKENDS:
        why = f"{gang.backend} has no queues, but queue is {gang.queue!r}"
        return [("queue", why, "remove the queue, or use backend volcano or kai")]
    if gang.topology_name and gang.backend != "kai":
        why = f"only KAI names a Topology object, but the backend is {gang.backend!r}"
        return [("topologyName", why, "remove topologyName, or use backend kai")]
    return []


def effective_gang(spec_gang: GangSpec | None, default: DefaultGang) -> GangSpec | None:
    """The gang a job is placed by: its own block (``backend: none``: no gang), else the
    install's default, else none."""
    if spec_gang is not None:
        return None if spec_gang.backend == "none" else spec_gang
    if not default.backend:
        return None
    queue, name = default.queue or None, default.scheduler_name or None
    return GangSpec(default.backend, queue, name)  # type: ignore[arg-type]


@dataclass
class SchedulingSpec:
    """How the job's pods are placed on the cluster."""

    gang: GangSpec | None = spec_field(None)
    """Gang placement; absent: the operator's default (chart value
    ``scheduling.defaultGang``), if it sets one, else the pods are scheduled one by one."""
    priority_class_name: str | None = spec_field(
        None, pattern=DNS_SUBDOMAIN, pattern_hint="a PriorityClass name", max_length=253
    )
    """The ``PriorityClass`` of every pod of the job (``priorityClassName``; the gang's group
    object and, without a ``kueue.x-k8s.io/priority-class`` label, the Kueue Workload's
    priority too). Empty: the cluster's default class, if any, else priority 0."""
    topology: list[TopologySpec] = spec_field(default_factory=list, max_items=3)
    """Groups of the job's pods to place within one topology domain (a node label's value),
    at most one entry per group; empty: no topology request. Placed by Kueue when the job has
    a queue label, else by the gang backend (volcano, kai, kubernetes; coscheduling has
    none)."""


def scheduling_problems(
    scheduling: SchedulingSpec, gang: GangSpec | None, kueue: bool
) -> list[tuple[str, str, str]]:
    """``(field under spec.scheduling, what is wrong, fix)`` of the topology against what
    places the job: ``gang`` the gang in use (:func:`effective_gang`; None: none), ``kueue``
    the job is admitted through Kueue. The operator calls it with the install's default gang
    too, which ``rules.py`` cannot see."""
    backend = gang.backend if gang is not None and gang.backend != "none" else None
    kai = gang.topology_name if gang is not None else None
    return topology_problems(scheduling.topology, backend, kueue, kai)
