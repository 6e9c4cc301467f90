"""The operator image's builder stage, run for real in a local virtualenv (no Docker here).

Copies exactly what the Dockerfile's ``COPY`` instructions name into a scratch build context,
runs its builder-stage ``RUN`` commands with ``/opt/longtail`` pointed at a scratch virtualenv
(pip from the package index, as a Docker build would), and checks the result: no ML library
installed, the ``longtail`` CLI and the operator's kopf handlers import, and the entry point
``python -m longtail_operator`` starts and rejects a bad setting with its message (exit 2)
before contacting any cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "images"))

from dockerfile import stages  # noqa: E402  (images/dockerfile.py, path above)

ML_LIBRARIES = ("torch", "transformers", "safetensors", "vllm", "numpy")


def test_operator_builder_stage_installs_a_working_operator_without_ml(tmp_path: Path) -> None:
    builder, runtime = stages("operator")
    assert builder[0][1].endswith("AS builder") and runtime[0][1].endswith("AS runtime")
    if shutil.which("python3.11") is None and sys.version_info[:2] != (3, 11):
        pytest.skip("the operator image uses Python 3.11; no python3.11 here")
    python = shutil.which("python3.11") or sys.executable
    context, venv = tmp_path / "src", tmp_path / "venv"
    context.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    copied: list[str] = []
    for word, args in builder:
        if word == "ENV":
            for pair in args.split():
                key, _, value = pair.partition("=")
                env[key] = value
        elif word == "COPY":
            *sources, _dest = args.split()
            for src in sources:
                copied.append(src)
                target = context / src
                if (REPO / src).is_dir():
                    shutil.copytree(
                        REPO / src, target, ignore=shutil.ignore_patterns("__pycache__")
                    )
                else:
                    shutil.copy2(REPO / src, target)
        elif word == "RUN":
            command = args.replace("/opt/longtail", str(venv)).replace(
                "python -m venv", f"{python} -m venv"
            )
            proc = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", command],
                cwd=context,
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert proc.returncode == 0, (
                f"RUN {command}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
            )
    # The build context holds the packages and pyproject.toml, nothing else (no tests, venvs).
    assert sorted(copied) == ["README.md", "api", "cli", "operator", "pyproject.toml", "workers"]
    vpython = venv / "bin" / "python"
    found = subprocess.run(
        [
            str(vpython),
            "-c",
            "import importlib.util as u, sys; "
            f"print(','.join(m for m in {ML_LIBRARIES!r} if u.find_spec(m)))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0 and found.stdout.strip() == "", found
    entry = subprocess.run(
        [str(vpython), "-m", "longtail_operator"],
        env={**env, "LONGTAIL_OPERATOR_METRICS_PORT": "eighty"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert entry.returncode == 2, entry
    assert "LONGTAIL_OPERATOR_METRICS_PORT: must be an integer" in entry.stderr
