"""Carrying out a plan against the API: the dry run first, then the changes in order.

``reconcile.py`` calls :func:`refusals` before it executes anything (a server-side dry run of
every object the plan creates or replaces, in parallel: ``Kube.refusal``) and :func:`execute`
for the plan's rows (``diff.py``): the objects other than pods first (pods mount the ConfigMap,
and the gang group must exist before its pods), the ConfigMap's replacement, the pods, the
Workload's merge patches, then every delete, each group in parallel. :func:`patch_for` and
:func:`prune_none` turn the planned status into the merge patch ``reconcile.py`` writes.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from longtail_operator.kube import Kube
from longtail_operator.model import ObjectKey, Plan
from longtail_operator.naming import JobRef


def prune_none(value: Any) -> Any:
    """``value`` without null mapping entries (as the API server stores a merge-patched object)."""
    if isinstance(value, dict):
        return {k: prune_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [prune_none(v) for v in value]
    return value


def patch_for(old: Any, new: Any) -> Any:
    """A JSON merge patch turning ``old`` into ``new`` (null deletes keys gone from ``new``)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    out = {k: patch_for(old.get(k), v) for k, v in new.items()}
    out.update({k: None for k in old if k not in new})
    return out


REFUSALS_SHOWN = 3
"""Refused objects named in full in the condition (the rest are counted)."""
REFUSAL_CHARS = 1500
"""Longest API message kept of one refusal (a refused value can be echoed back in full)."""


def shown_refusals(found: list[str]) -> tuple[str, ...]:
    """The API server's refusals as the status shows them: the first :data:`REFUSALS_SHOWN`,
    each cut to :data:`REFUSAL_CHARS` (its start, which names the object and the field, and
    its end), then a count of the others."""
    out = []
    for text in found[:REFUSALS_SHOWN]:
        if len(text) > REFUSAL_CHARS:
            cut = len(text) - REFUSAL_CHARS
            text = f"{text[: REFUSAL_CHARS - 300]} [{cut} characters cut] {text[-300:]}"
        out.append(text)
    if len(found) > REFUSALS_SHOWN:
        out.append(f"and {len(found) - REFUSALS_SHOWN} more object(s) refused")
    return tuple(out)


def refusals(kube: Kube, pool: ThreadPoolExecutor, plan: Plan) -> tuple[str, ...]:
    """The API server's refusals for good of the objects ``plan`` creates or replaces (a
    dry run of each, in parallel); empty when it would take them all."""
    asks = [(m, False) for m in plan.create] + [(m, True) for m in plan.update]
    if not asks:
        return ()
    ask = lambda a: kube.refusal(a[0], replace=a[1])  # noqa: E731
    return shown_refusals([r for r in pool.map(ask, asks) if r is not None])


def execute(kube: Kube, pool: ThreadPoolExecutor, job: JobRef, plan: Plan) -> None:
    """The plan's changes and patches, in the order of the module text."""
    first = [m for m in plan.create if m["kind"] != "Pod"]
    list(pool.map(kube.create, first))
    for cm in plan.update:
        kube.replace_configmap(cm)
    list(pool.map(kube.create, plan.bodies("create", "Pod")))
    for p in plan.patches:
        kube.patch_custom(p.key.api_version, p.plural, job.namespace, p.key.name, p.patch, p.status)
    deletes = [c.key for c in plan.changes if c.op == "delete"]

    def delete(key: ObjectKey) -> None:
        kube.delete(key.kube_kind, job.namespace, key.name)

    list(pool.map(delete, deletes))
