"""The harness of the ``longtail run`` end-to-end tests (``tests/e2e_local/``): start a run as a
subprocess, wait for it, and read back the step rows it writes.

Imported by name (``tests/conftest.py`` puts this folder on ``sys.path``) by
``test_local_run.py`` and ``test_elastic_rollout.py``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def _as_in_a_terminal() -> None:
    """SIGHUP at its default in the child, as in a terminal session: when the suite itself runs
    under ``nohup`` the child would inherit SIGHUP ignored, and ``longtail run`` then rightly
    keeps ignoring it (``local/run.py::stop_signals``), which the SIGHUP test is not about."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def longtail_run(*args: str) -> subprocess.Popen[str]:
    """``longtail run ARGS`` as a subprocess, its output (stdout and stderr) in one pipe."""
    cmd = [sys.executable, "-m", "longtail_cli.main", "run", *args]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_as_in_a_terminal,
    )


def finish(proc: subprocess.Popen[str], timeout_s: float = 240) -> tuple[int, str]:
    """Exit code and output of the run; the test fails with the output if it does not end."""
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"longtail run did not finish in {timeout_s}s:\n{out}")
    return proc.returncode, out


def rows(run_dir: Path) -> list[dict[str, Any]]:
    """The step rows of ``metrics.jsonl`` written so far."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    lines = path.read_text().splitlines(keepends=True)
    # A line the trainer is appending meanwhile (no newline yet) is the next read's.
    return [json.loads(ln) for ln in lines if ln.strip() and ln.endswith("\n")]


def wait_for(cond: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll ``cond`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)
