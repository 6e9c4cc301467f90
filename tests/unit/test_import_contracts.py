"""The import walls hold, and the contracts really catch a violation.

The negative test copies the packages into a temporary tree, adds an operator module that
imports torch, and runs the real `lint-imports` with the project's own contracts on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")
PACKAGES = {
    "api": "longtail_api",
    "operator": "longtail_operator",
    "workers": "longtail_workers",
    "cli": "longtail_cli",
}


def _copy_tree(dst: Path) -> dict[str, str]:
    for folder, pkg in PACKAGES.items():
        shutil.copytree(
            REPO / folder / pkg, dst / folder / pkg, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(REPO / "pyproject.toml", dst / "pyproject.toml")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(dst / f) for f in PACKAGES)
    return env


def _lint(cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_contracts_kept_on_the_real_tree() -> None:
    out = _lint(REPO, dict(os.environ))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_operator_importing_torch_breaks_the_contract(tmp_path: Path) -> None:
    env = _copy_tree(tmp_path)
    bad = tmp_path / "operator" / "longtail_operator" / "sneaky.py"
    bad.write_text('"""A module that must not exist."""\n\nimport torch  # noqa: F401\n')
    out = _lint(tmp_path, env)
    assert out.returncode != 0
    assert "Operator never imports torch" in out.stdout and "BROKEN" in out.stdout
    assert "longtail_operator.sneaky -> torch" in out.stdout, out.stdout


def test_api_importing_workers_breaks_the_contract(tmp_path: Path) -> None:
    env = _copy_tree(tmp_path)
    bad = tmp_path / "api" / "longtail_api" / "sneaky.py"
    bad.write_text('"""A module that must not exist."""\n\nimport longtail_workers  # noqa: F401\n')
    out = _lint(tmp_path, env)
    assert out.returncode != 0
    assert "longtail_api.sneaky -> longtail_workers" in out.stdout, out.stdout
