"""Fixtures of the ``longtail run`` end-to-end tests.

``builtin:tiny`` and its drafter are built once, before the first test starts its ``longtail
run``: on a fresh machine the builds take minutes (docs/performance.md), longer than one test's
wait for its run, and a run would otherwise spend them inside that wait. Cached under
``~/.cache/longtail`` after.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def built_tiny_model() -> None:
    from longtail_workers.models.builtin import ensure_tiny
    from longtail_workers.warmstart.builtin import ensure_builtin_drafter

    ensure_tiny()
    ensure_builtin_drafter("builtin:tiny", "longtail")
