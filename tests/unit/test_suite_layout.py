"""``make test`` runs every test file: the Makefile names its test folders (``unit`` runs
``tests/unit`` then ``tests/e2e_local``; ``integration`` runs ``tests/integration``), so a test
file in any other folder would never run in CI. This test fails naming such a file, and fails
if the Makefile's recipes stop naming the folders this test expects."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def recipe(target: str) -> str:
    """The recipe lines of ``target`` in the Makefile."""
    text = (ROOT / "Makefile").read_text()
    m = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", text, re.M)
    assert m, f"no {target!r} target in the Makefile"
    return m.group(1)


def run_folders() -> set[str]:
    """The folders under tests/ that the unit and integration recipes pass to pytest."""
    found = set()
    for target in ("unit", "integration"):
        found |= set(re.findall(r"\btests/(\w+)", recipe(target)))
    return found


def test_every_test_file_is_in_a_folder_make_test_runs() -> None:
    folders = run_folders()
    assert {"unit", "e2e_local", "integration"} <= folders, folders
    stray = [
        str(p.relative_to(ROOT))
        for p in TESTS.rglob("test_*.py")
        if p.relative_to(TESTS).parts[0] not in folders
    ]
    assert not stray, (
        f"test files that `make test` never runs (add their folder to a recipe): {stray}"
    )


def test_make_test_runs_unit_and_integration_and_the_e2e_runs_last() -> None:
    body = recipe("test")
    assert "integration" in body and "unit" in body
    unit = recipe("unit")
    assert unit.index("tests/unit") < unit.index("tests/e2e_local"), unit
