"""kopf's discovery of the watched namespaces (``namespaces.py``): a namespace kopf's namespace
watcher first sees in its own initial listing (created between kopf's first namespace LIST and
the watcher's) is watched, as one seen in the first listing or in a watch event is. Without
``namespaces.install`` kopf drops that listing and never watches the namespace (the flaky
``test_the_default_install_acts_within_seconds_of_the_api_servers_return``)."""

from __future__ import annotations

import asyncio
from typing import Any

from kopf._cogs.structs import references
from kopf._core.reactor import observation

from longtail_operator import handlers  # noqa: F401 (installs namespaces.process_namespace_event)

PATTERNS = ["itha-*"]


def seen(*events: dict[str, Any]) -> set[str | None]:
    """The namespaces kopf watches after its namespace watcher processed ``events``."""

    async def run() -> set[str | None]:
        insights = references.Insights()
        for event in events:
            await observation.process_discovered_namespace_event(
                raw_event=event, namespaces=PATTERNS, insights=insights
            )
        return set(insights.namespaces)

    return asyncio.run(run())


def namespace(name: str, kind: str | None) -> dict[str, Any]:
    return {"type": kind, "object": {"metadata": {"name": name}}}


def test_a_namespace_first_in_the_watchers_own_listing_is_watched() -> None:
    assert seen(namespace("itha-new", None)) == {"itha-new"}


def test_watch_events_and_the_patterns_still_decide() -> None:
    assert seen(namespace("itha-a", "ADDED"), namespace("other", None)) == {"itha-a"}
    assert seen(namespace("itha-a", None), namespace("itha-a", "DELETED")) == set()
