"""``longtail drafter fit`` refuses bad options and jobs before loading any model."""

from __future__ import annotations

from pathlib import Path

import pytest

from longtail_cli.main import main

REPO = Path(__file__).resolve().parents[4]
JOB = REPO / "examples" / "01-tiny-arith.yaml"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--steps", "0"], "--steps=0: must be >= 1"),
        (["--batch-size", "0"], "--batch-size=0: must be >= 1"),
        (["--prompts", "1"], "--prompts=1: need >= 2"),
        (["--max-new-tokens", "1"], "--max-new-tokens=1: must be >= 2"),
    ],
)
def test_bad_options_name_the_option(tmp_path: Path, capsys, options, message) -> None:
    code = main(["drafter", "fit", str(JOB), "-o", str(tmp_path / "d"), *options])
    assert code == 2
    assert message in capsys.readouterr().err


def test_a_non_empty_output_is_not_overwritten(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert main(["drafter", "fit", str(JOB), "-o", str(tmp_path)]) == 2
    assert "exists and is not empty (choose a new path or --force)" in capsys.readouterr().err
    assert (tmp_path / "config.json").read_text() == "{}"


def test_an_invalid_job_lists_its_errors(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: longtail.dev/v1alpha1\nkind: RLJob\nmetadata: {name: x}\n"
        "spec: {model: {path: ''}, dataset: {path: builtin:arith}}\n"
    )
    assert main(["drafter", "fit", str(bad), "-o", str(tmp_path / "d")]) == 2
    assert "spec.model.path" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
