"""Gang placement of an RLJob's pods: the ``spec.scheduling`` block of the RLJob API.

A gang scheduler starts a job's pods together or not at all, so a trainer group never sits
half-scheduled holding GPUs while the rest waits. The user picks one per job (issue #37):
Volcano, the scheduler-plugins coscheduling plugin or NVIDIA's KAI scheduler. The operator
(``longtail_operator.gang``) turns this block into one group object per RLJob and the pods'
labels, annotations and ``schedulerName``; ``spec.py`` holds it in :class:`RLJobSpec`, the
CRD and the reference docs are generated from it. Frozen while the job runs (a change applies
on the next resume), like every field not listed as live in ``mutability.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from longtail_api.fields import spec_field

GangBackend = Literal["volcano", "coscheduling", "kai"]

DEFAULT_SCHEDULER = {
    "volcano": "volcano",
    "coscheduling": "scheduler-plugins-scheduler",
    "kai": "kai-scheduler",
}
"""``schedulerName`` per backend when ``gang.schedulerName`` is empty: the name each project's
own install gives its scheduler (Volcano's chart, scheduler-plugins' second-scheduler chart,
KAI's chart)."""

_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


@dataclass
class GangSpec:
    """One group object for all the job's pods, placed all together or not at all."""

    backend: GangBackend = spec_field(fix="use volcano, coscheduling or kai")
    """Gang scheduler: ``volcano`` (Volcano ``PodGroup``), ``coscheduling`` (scheduler-plugins
    ``PodGroup``) or ``kai`` (NVIDIA KAI ``PodGroup`` with a subgroup per role)."""
    queue: str | None = spec_field(
        None, pattern=_NAME, pattern_hint="a queue name (lowercase, digits, '-', '.')"
    )
    """The scheduler's queue (Volcano and KAI; coscheduling has none). Empty: Volcano's
    ``default`` queue; KAI needs one."""
    scheduler_name: str | None = spec_field(
        None, pattern=_NAME, pattern_hint="a scheduler name (lowercase, digits, '-', '.')"
    )
    """The pods' ``schedulerName``. Empty: the backend's usual name (``volcano``,
    ``scheduler-plugins-scheduler``, ``kai-scheduler``)."""
    schedule_timeout_seconds: int = spec_field(600, minimum=1, maximum=86_400)
    """How long coscheduling waits for the whole gang before it gives the pods' reservations
    back and retries (its ``scheduleTimeoutSeconds``)."""

    def resolved_scheduler(self) -> str:
        return self.scheduler_name or DEFAULT_SCHEDULER[self.backend]


@dataclass
class SchedulingSpec:
    """How the job's pods are placed on the cluster."""

    gang: GangSpec | None = spec_field(None)
    """Gang placement; absent: the pods are scheduled one by one by the default scheduler."""
