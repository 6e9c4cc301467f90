"""Fixtures of the ``longtail run`` end-to-end tests.

``builtin:tiny`` and its drafter are built once, before the first test starts its ``longtail
run``: on a fresh machine the builds take minutes (docs/performance.md), longer than one test's
wait for its run, and a run would otherwise spend them inside that wait. Cached under
``~/.cache/longtail`` after.

The build (or the wait for another process building them: a ``longtail run`` on the same
machine) happens once per session, when collection ends, outside every test's timeout, with a
line saying what it waits for (``models/cache.py``'s ``build_holder``); its wait is bounded by
:data:`BUILD_WAIT_S`. If it fails, every e2e test errors at once with that reason instead of
each one waiting for the lock again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BUILD_WAIT_S = float(os.environ.get("LONGTAIL_E2E_BUILD_WAIT_S", 45 * 60))
"""Longest the session waits for another process's build (a fresh build takes minutes);
``LONGTAIL_E2E_BUILD_WAIT_S`` sets it (the test of this wait uses seconds)."""
_FAILED: list[str] = []


def _targets() -> list[tuple[str, Path, Callable[[], object]]]:
    from longtail_workers.models.builtin import BUILD_INFO_FILE, ensure_tiny, policy_dir
    from longtail_workers.warmstart.builtin import builtin_drafter_dir, ensure_builtin_drafter

    drafter = builtin_drafter_dir("builtin:tiny", "longtail")
    return [
        ("builtin:tiny", policy_dir() / BUILD_INFO_FILE, ensure_tiny),
        ("the builtin:tiny drafter", drafter / BUILD_INFO_FILE,
         lambda: ensure_builtin_drafter("builtin:tiny", "longtail")),
    ]  # fmt: skip


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build or wait once for the models, if any e2e test is to run (module text)."""
    if session.config.option.collectonly:
        return
    if not any(HERE in Path(str(item.path)).parents for item in session.items):
        return
    from longtail_workers.models.cache import build_holder, wait_for_build

    say = session.config.pluginmanager.get_plugin("terminalreporter")
    for what, marker, ensure in _targets():
        if marker.is_file():
            continue
        final = marker.parent
        holder = build_holder(final)
        try:
            if holder is not None:
                if say is not None:
                    say.write_line(
                        f"e2e tests: {what} is being built by {holder} (another longtail run?); "
                        f"waiting for it once for the session, up to {BUILD_WAIT_S / 60:.0f} min"
                    )
                wait_for_build(final, BUILD_WAIT_S)
            elif say is not None:
                say.write_line(f"e2e tests: building {what} once for the session (minutes) ...")
            ensure()
        except (TimeoutError, OSError, RuntimeError, ValueError) as exc:
            _FAILED.append(f"{what} is not available for the e2e tests: {exc}")
            return


@pytest.fixture(scope="session", autouse=True)
def built_tiny_model() -> None:
    """Every e2e test: the models are built (by the hook above), or it errors with why not."""
    if _FAILED:
        pytest.fail(_FAILED[0], pytrace=False)
    for _, marker, ensure in _targets():
        if not marker.is_file():  # collected another way (e.g. a plugin reordered the hooks)
            ensure()
