"""kopf's discovery of the namespaces matching ``LONGTAIL_OPERATOR_NAMESPACES``, without its gap.

``handlers.py`` calls :func:`install` when it is imported, before kopf starts. With namespace
patterns (``itha-*``, ``team-*``), kopf (1.45, pinned in pyproject.toml) learns the namespaces
to watch in two steps: a first LIST of namespaces, then a watcher that LISTs again and WATCHes
from that second listing. kopf's processor drops the second listing's objects (events of type
None) and takes only the watch events that follow it, so a namespace created between the two
LISTs is in neither: no RLJob or pod in it is ever seen until the operator restarts (nothing
later sends an event for an unchanged namespace). That happens to a namespace created while
the operator starts (tests/integration/test_operator_restarts.py failed so: a job applied just
after the operator took its Lease stayed without a status for 60 s while the jobs of the
namespaces of the first listing were acted on). :func:`install` makes the watcher's own listing
count too, so every namespace is in one of the two listings or a watch event after them.
"""

from __future__ import annotations

from typing import Any

from kopf._core.reactor import observation

_original = observation.process_discovered_namespace_event


async def process_namespace_event(
    *,
    raw_event: Any,
    namespaces: Any,
    insights: Any,
    **kwargs: Any,
) -> None:
    """kopf's processor of namespace events, which also takes the watcher's initial listing
    (events of type None) into the namespaces to watch."""
    if raw_event["type"] is None:
        async with insights.revised:
            observation.revise_namespaces(
                raw_events=[raw_event], insights=insights, namespaces=namespaces
            )
            insights.revised.notify_all()
        return
    await _original(raw_event=raw_event, namespaces=namespaces, insights=insights, **kwargs)


def install() -> None:
    """Use :func:`process_namespace_event` for kopf's namespace watcher (idempotent)."""
    observation.process_discovered_namespace_event = process_namespace_event
