"""Read the operator's inputs into small typed views: worker pods, previous status, times.

``reconcile.py`` lists the job's pods and hands them to :meth:`PodView.from_pod`; the pure
status derivation (``derive.py``) works on these views only. ``wirecodec.to_wire`` and
:func:`parse_status` convert :class:`~longtail_api.status.RLJobStatus` to and from the camelCase
JSON the API server stores, so status is typed end to end.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from longtail_api.status import RLJobStatus
from longtail_api.validation import parse
from longtail_operator.builders import (
    LABEL_INDEX,
    LABEL_ROLE,
    LABEL_TRAINER_GROUP,
    LABEL_TRAINER_WORLD,
    ROLES,
)

TERMINAL_POD_PHASES = ("Succeeded", "Failed")
MESSAGE_TAIL = 1500
"""Characters kept of a container's termination message (the end of a traceback matters)."""


@dataclass(frozen=True)
class PodView:
    """What the operator needs to know about one worker pod."""

    name: str
    role: str
    index: int
    uid: str
    phase: str
    """Pod phase: Pending, Running, Succeeded, Failed or Unknown."""
    ready: bool
    ip: str | None
    deleting: bool
    message: str = ""
    """The pod's (or its container's) termination reason and message, when it has one; a
    container's message is its last log lines after a crash (``FallbackToLogsOnError``), kept
    to its last ``MESSAGE_TAIL`` characters."""
    group: int | None = None
    """A trainer pod's group number (label ``longtail.dev/trainer-group``); None when the pod
    has no such label (other roles, or a trainer pod made by an older operator)."""
    world: str | None = None
    """A trainer pod's world, ``<pods>x<ranks per pod>`` (label ``longtail.dev/trainer-world``);
    None when it has no such label."""
    disruption: str | None = None
    """Why the pod was taken away rather than failing by itself: the ``DisruptionTarget``
    condition's reason (Kubernetes 1.26 on: ``EvictionByEvictionAPI``,
    ``PreemptionByScheduler``, ``DeletionByTaintManager``...) or the kubelet's ``Evicted``
    (node pressure, every version); None for anything else. A v1.20 Eviction API call
    leaves no mark: the pod is deleted gracefully (``deleting``)."""
    scheduled: bool = True
    """Bound to a node (``spec.nodeName``): a pod a scheduler has not placed yet is not
    (a required topology no domain can hold keeps it so: ``placement.topology_wait``)."""

    @property
    def active(self) -> bool:
        """Counts as a live replica: not finished and not being deleted."""
        return not self.deleting and self.phase not in TERMINAL_POD_PHASES

    @classmethod
    def from_pod(cls, pod: dict[str, Any]) -> PodView | None:
        """The view of a pod with valid role/index labels; None for anything else."""
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        lbls = meta.get("labels") or {}
        role, raw_index = lbls.get(LABEL_ROLE), lbls.get(LABEL_INDEX, "")
        if role not in ROLES or not str(raw_index).isdigit():
            return None
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        phase = status.get("phase") or "Pending"
        group = str(lbls.get(LABEL_TRAINER_GROUP, ""))
        disrupted = [
            c.get("reason") or "DisruptionTarget"
            for c in status.get("conditions") or []
            if c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        ]
        if status.get("reason") == "Evicted":
            disrupted.append("Evicted")
        return cls(
            name=meta.get("name", ""),
            role=role,
            index=int(raw_index),
            uid=meta.get("uid", ""),
            phase=phase,
            ready=ready and phase == "Running",
            ip=status.get("podIP") or None,
            deleting=meta.get("deletionTimestamp") is not None,
            message=_termination_message(status),
            group=int(group) if group.isdigit() else None,
            world=lbls.get(LABEL_TRAINER_WORLD) or None,
            disruption=disrupted[0] if disrupted else None,
            scheduled=bool((pod.get("spec") or {}).get("nodeName")),
        )


def _termination_message(status: dict[str, Any]) -> str:
    parts = [p for p in (status.get("reason"), status.get("message")) if p]
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or {}
        if term:
            code = term.get("exitCode")
            text = str(term.get("message") or "").strip()
            if len(text) > MESSAGE_TAIL:
                text = "..." + text[-MESSAGE_TAIL:]
            detail = " ".join(str(p) for p in (term.get("reason"), text) if p)
            parts.append(f"container {cs.get('name')} exited {code} {detail}".strip())
    return "; ".join(parts)


def now_utc() -> datetime:
    return datetime.now(UTC)


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def parse_status(raw: Any) -> RLJobStatus:
    """The previous status as stored; an unreadable one (hand-edited) counts as empty."""
    if not isinstance(raw, dict) or not raw:
        return RLJobStatus()
    status, errors = parse(RLJobStatus, raw, "status")
    return status if status is not None and not errors else RLJobStatus()
