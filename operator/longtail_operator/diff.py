"""One diff: the desired set (``children.py``) against the observed owned objects.

Pure; ``derive.plan`` calls :func:`diff` with :func:`observed` (the pods, the other owned
objects and the Kueue Workload ``reconcile.py`` read, as one map by
:class:`~.model.ObjectKey`) and puts the rows in ``Plan.changes``; ``reconcile.py`` executes
them. The rules, the same for every kind:

- desired and not found: create;
- found and not desired: delete, unless it is already being deleted (a pod with a deletion
  timestamp: it goes by itself, and is made again once gone);
- both: a ConfigMap whose ``data`` differs is replaced; nothing else is ever updated (pods are
  replaced, not changed: the desired set leaves a finished pod out; the Workload's own changes
  are patches, ``placement.workload_actions``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from longtail_operator import kueue
from longtail_operator.model import Change, ObjectKey, Observed
from longtail_operator.observe import PodView

Found = PodView | dict[str, Any]
"""An observed object: a pod as :class:`PodView`, anything else as the API returned it."""


def observed(obs: Observed) -> dict[ObjectKey, Found]:
    """Everything the job owns that this reconcile read, by key."""
    out: dict[ObjectKey, Found] = {ObjectKey("v1", "Pod", p.name): p for p in obs.pods}
    out.update(obs.owned)
    if obs.workload is not None:
        key = ObjectKey(kueue.API_VERSION, "Workload", obs.workload.name)
        out[key] = obs.workload.raw
    return out


def _stale(key: ObjectKey, found: Found, want: dict[str, Any]) -> str | None:
    """Why an object found and desired must be replaced (None: it is as it should be)."""
    changed = isinstance(found, dict) and (found.get("data") or {}) != want.get("data")
    return "rendered job config changed" if key.kind == "ConfigMap" and changed else None


def diff(
    desired: Mapping[ObjectKey, dict[str, Any]], found: Mapping[ObjectKey, Found]
) -> list[Change]:
    """The rows turning ``found`` into ``desired``: creates in the desired set's order, then
    updates, then deletes in the order found."""
    rows = [Change("create", k, v, "missing") for k, v in desired.items() if k not in found]
    for key, want in desired.items():
        have = found.get(key)
        why = _stale(key, have, want) if have is not None else None
        if why is not None:
            rows.append(Change("update", key, want, why))
    for key, have in found.items():
        if key not in desired and not (isinstance(have, PodView) and have.deleting):
            rows.append(Change("delete", key, None, "not desired"))
    return rows
