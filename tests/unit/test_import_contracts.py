"""The import walls hold, and the contracts really catch a violation.

The negative tests copy the packages into a temporary tree, add one module that breaches a
contract (an operator module importing torch, an upward import between worker layers, ...)
and run the real `lint-imports` with the project's own contracts on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")
PACKAGES = {
    "api": "longtail_api",
    "operator": "longtail_operator",
    "workers": "longtail_workers",
    "cli": "longtail_cli",
    "helm": "longtail_chart",
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
    # A wide terminal, so that no reported import chain is wrapped across lines.
    env = {**env, "COLUMNS": "240"}
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_contracts_kept_on_the_real_tree() -> None:
    out = _lint(REPO, dict(os.environ))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


BREACHES = [
    # (file to add, what it imports, contract name that must break, offending import in the report)
    ("operator/longtail_operator/sneaky.py", "torch", "Operator never imports torch",
     "longtail_operator.sneaky -> torch"),
    ("api/longtail_api/sneaky.py", "longtail_workers", "Shared API package is pure",
     "longtail_api.sneaky -> longtail_workers"),
    ("helm/longtail_chart/sneaky.py", "longtail_workers", "Chart generators import only",
     "longtail_chart.sneaky -> longtail_workers"),
    # an upward import between worker layers: the drafter library must not know the engine
    ("workers/longtail_workers/drafter/sneaky.py", "longtail_workers.engine.native.torch_engine",
     "Worker layers",
     "longtail_workers.drafter.sneaky -> longtail_workers.engine.native.torch_engine"),
    # sibling programs never import each other
    ("workers/longtail_workers/trainer/sneaky.py", "longtail_workers.rollout.control",
     "Worker layers", "longtail_workers.trainer.sneaky -> longtail_workers.rollout.control"),
    # the two engine backends never import each other
    ("workers/longtail_workers/engine/native/sneaky.py",
     "longtail_workers.engine.vllm.vllm_schedule",
     "The native and the vLLM engines never import each other",
     "longtail_workers.engine.native.sneaky -> longtail_workers.engine.vllm.vllm_schedule"),
    # the contract naming a backend's type again (the copy's interface.py is replaced): the cycle
    # interface -> native -> interface that the engine's `drafter` property removed
    ("workers/longtail_workers/engine/interface.py", "longtail_workers.engine.native.specdec",
     "The shared engine modules import neither engine folder",
     "longtail_workers.engine.interface -> longtail_workers.engine.native.specdec"),
    ("workers/longtail_workers/engine/interface.py", "longtail_workers.engine.native.specdec",
     "No import cycles between the engine's modules", ".interface -> .native"),
    # a new worker subpackage must be placed in a layer (exhaustive)
    ("workers/longtail_workers/unplaced/__init__.py", "longtail_workers.auth",
     "Worker layers", "longtail_workers.unplaced"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "imported", "contract", "reported"), BREACHES)
def test_a_breach_breaks_its_contract(
    tmp_path: Path, path: str, imported: str, contract: str, reported: str
) -> None:
    env = _copy_tree(tmp_path)
    bad = tmp_path / path
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_text(f'"""A module that must not exist."""\n\nimport {imported}  # noqa: F401\n')
    out = _lint(tmp_path, env)
    assert out.returncode != 0, out.stdout
    assert contract in out.stdout and "BROKEN" in out.stdout, out.stdout
    assert reported in out.stdout, out.stdout
