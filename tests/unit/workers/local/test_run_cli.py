"""``longtail run`` argument and job errors, answered before any process starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longtail_cli.main import WORKER_ROLES, main
from longtail_workers.jobspec import load_job_spec
from longtail_workers.local.run import build_parser, read_job

REPO = Path(__file__).resolve().parents[4]


def test_worker_roles_include_rollout_trainer_and_drafter() -> None:
    assert WORKER_ROLES["rollout"] == "longtail_workers.rollout.service:main"
    assert WORKER_ROLES["trainer"] == "longtail_workers.trainer.service:main"
    # The operator starts drafter pods with `longtail worker drafter` (spec.drafter).
    assert WORKER_ROLES["drafter"] == "longtail_workers.drafter_worker.service:main"


def test_a_run_of_the_removed_dist_weight_sync_is_refused_on_resume(tmp_path: Path, capsys) -> None:
    job = REPO / "examples" / "01-tiny-arith.yaml"
    (tmp_path / "job.yaml").write_text(job.read_text())
    run = {"job": "x", "no_speculative": False, "no_harvest": False, "weight_sync": "dist"}
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert main(["run", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "weight_sync 'dist' is not supported any more" in err and "broadcast" in err


def test_invalid_job_is_refused_with_every_error(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: longtail.dev/v1alpha1\nkind: RLJob\nmetadata: {name: x}\n"
        "spec: {model: {path: ''}, dataset: {path: builtin:arith}, "
        "algorithm: {groupSize: 1}}\n"
    )
    assert main(["run", str(bad), "-o", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "spec.model.path" in err and "spec.algorithm.groupSize" in err


def test_resume_needs_a_run_directory(tmp_path: Path, capsys) -> None:
    assert main(["run", "--resume", str(tmp_path)]) == 2
    assert "no run.json there" in capsys.readouterr().err


def test_existing_run_directory_is_not_overwritten(tmp_path: Path, capsys) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"job": "x"}))
    job = REPO / "examples" / "01-tiny-arith.yaml"
    assert main(["run", str(job), "-o", str(tmp_path)]) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_run_help_lists_the_switches(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--output", "--resume", "--no-speculative", "--no-harvest", "--weight-sync"):
        assert flag in out


def test_both_switches_are_written_into_the_job_file_every_process_reads(tmp_path: Path) -> None:
    job = REPO / "examples" / "01-tiny-arith.yaml"
    run = str(tmp_path / "run")
    spec, run_dir, _ = read_job(
        build_parser().parse_args([str(job), "-o", run, "--no-speculative", "--no-harvest"])
    )
    resumed = read_job(build_parser().parse_args(["--resume", run]))[0]
    for s in (spec, load_job_spec(run_dir / "job.yaml"), resumed):
        assert not s.speculative.enabled and not s.harvest.enabled
        assert s.drafter_training == load_job_spec(job).drafter_training  # the rest as written
    plain = read_job(build_parser().parse_args([str(job), "-o", str(tmp_path / "plain")]))[1]
    assert (plain / "job.yaml").read_text() == job.read_text()  # no switch: the file as written


def test_a_missing_initial_drafter_is_refused_before_any_process(tmp_path: Path, capsys) -> None:
    job = REPO / "examples" / "03-tiny-arith-warm-drafter.yaml"
    missing = tmp_path / "no-drafter"
    text = job.read_text().replace(
        "initialDrafter: drafters/tiny-arith", f"initialDrafter: {missing}"
    )
    bad = tmp_path / "job.yaml"
    bad.write_text(text)
    assert main(["run", str(bad), "-o", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"spec.drafterTraining.initialDrafter: '{missing}' is not a drafter directory" in err
    assert f"longtail drafter fit {bad} -o {missing}" in err
    assert not (tmp_path / "run" / "processes.json").exists()  # nothing was started


@pytest.mark.parametrize("name", ["missing.yaml", "a-directory"])
def test_a_missing_file_or_a_directory_is_one_line_exit_2_and_no_run_dir(
    tmp_path: Path, monkeypatch, capsys, name: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-directory").mkdir()
    assert main(["run", name]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {name}: cannot read file") and err.count("\n") == 1, err
    assert "Traceback" not in err and not (tmp_path / "runs").exists()


def test_a_refused_job_leaves_no_run_dir_and_names_the_users_file(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: longtail.dev/v1alpha1\nkind: RLJob\nmetadata: {name: x}\n"
        "spec: {model: {path: ''}, dataset: {path: builtin:arith}}\n"
    )
    too_long = tmp_path / "too-long.yaml"  # valid spec, but 4000 tokens cannot fit 2048
    too_long.write_text(
        (REPO / "examples" / "01-tiny-arith.yaml")
        .read_text()
        .replace("maxNewTokens: 256", "maxNewTokens: 4000")
    )
    for job, field in ((bad, "spec.model.path"), (too_long, "spec.algorithm.maxNewTokens")):
        assert main(["run", str(job)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {job}: 1 error(s)") and field in err, err
        assert "job.yaml" not in err
    assert not (tmp_path / "runs").exists()


def test_a_gpu_job_on_a_machine_without_a_gpu_is_refused_before_anything_is_built(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Example 06 asks for GPUs: without one, local mode would build builtin:small on the CPU
    for hours; it stops at once naming the field and the fix."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    job = REPO / "examples" / "06-small-arith-gpu.yaml"
    assert main(["run", str(job), "-o", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "spec.rollout.resources.gpus: 1, but this machine has no CUDA GPU" in err
    assert "resources.gpus to 0" in err and not (tmp_path / "run").exists()
