"""``longtail run`` asks whether the job's built-in model and drafter are built without importing
torch or transformers (``local/run.py::prepare_builtins``): that answer used to cost every run
the seconds of those imports before any process started.

A real subprocess on examples/01 (``builtin:tiny`` and its built-in drafter) with a cache whose
entries are complete (their build records written): it names the cached directories, and torch
is not in its ``sys.modules`` after. An entry without its record is not taken as built (the
builders are called for it: the e2e tests and ``test_build_wait.py`` run those paths). The light
modules name the same directories as the builders.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from longtail_workers.models import builtin
from longtail_workers.models.cache import CACHE_ENV
from longtail_workers.models.recipe import BUILD_INFO_FILE, TINY, policy_dir
from longtail_workers.warmstart import builtin as drafters
from longtail_workers.warmstart.recipe import builtin_drafter_dir

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "01-tiny-arith.yaml"
PROBE = """
import sys
from longtail_workers.jobspec import load_job_spec
from longtail_workers.local.run import _built_drafter, _built_model, prepare_builtins
if sys.argv[2] == "prepare":
    prepare_builtins(load_job_spec(sys.argv[1]))
else:
    model, drafter = _built_model("builtin:tiny"), _built_drafter("builtin:tiny", "longtail")
    print("model", model, "drafter", drafter)
mods = sys.modules
print("torch imported:", "torch" in mods, "transformers imported:", "transformers" in mods)
"""


def probe(what: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(EXAMPLE), what],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture
def entries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Path, Path]:
    """The cache directories of builtin:tiny and its drafter in a fresh cache (not created)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    model, drafter = policy_dir(TINY), builtin_drafter_dir("builtin:tiny", "longtail")
    assert model == builtin.policy_dir(TINY)
    assert drafter == drafters.builtin_drafter_dir("builtin:tiny", "longtail")
    return model, drafter


def test_a_built_model_and_drafter_are_found_without_importing_torch(
    entries: tuple[Path, Path],
) -> None:
    model, drafter = entries
    for d in entries:
        d.mkdir(parents=True)
        (d / BUILD_INFO_FILE).write_text("{}\n")
    out = probe("prepare")
    assert f"using builtin:tiny, cached in {model}" in out, out
    assert f"using the builtin:tiny drafter, cached in {drafter}" in out, out
    assert "torch imported: False transformers imported: False" in out, out


def test_an_entry_without_its_build_record_is_not_built(entries: tuple[Path, Path]) -> None:
    for d in entries:  # a build that died before its record: rebuilt, never used
        d.mkdir(parents=True)
    out = probe("ask")
    assert "model None drafter None" in out, out
    assert "torch imported: False" in out, out
