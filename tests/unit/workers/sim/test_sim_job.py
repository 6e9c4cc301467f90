"""The simulator's inputs from an RLJob (example 02) and the parametric long-tail lengths."""

from __future__ import annotations

from pathlib import Path

import pytest

from longtail_api.manifest import validate_file
from longtail_workers.sim.job import lognormal_lengths, parse_lengths, shape_from_job

EXAMPLE_02 = Path(__file__).parents[4] / "examples" / "02-qwen2.5-7b-gpu.yaml"


def test_shape_of_example_02() -> None:
    (res,) = validate_file(EXAMPLE_02)
    assert res.spec is not None
    shape, notes = shape_from_job(res.spec, max_running=256, prompt_tokens=256,
                                  accepted_length=3.0)  # fmt: skip
    assert (shape.rollout_workers, shape.gpus_per_worker) == (8, 1)
    assert (shape.prompts, shape.group, shape.trainer_replicas) == (128, 16, 8)
    assert [s.draft_depth for s in shape.speculative.strategies] == [3, 6]
    assert notes == []  # vLLM chains only: nothing to drop
    assert shape.harvest.idle_seconds == 30


def test_lognormal_lengths_have_the_asked_tail() -> None:
    lengths = lognormal_lengths(400, 16, median=1000, p99_ratio=10, cap=20_000,
                                cap_fraction=0.02)  # fmt: skip
    s = sorted(lengths)
    assert len(s) == 6400
    assert 800 < s[len(s) // 2] < 1250
    assert 6000 < s[int(0.99 * len(s))] <= 20_000
    assert lengths.count(20_000) >= 0.02 * len(lengths)
    assert lengths == lognormal_lengths(400, 16, median=1000, p99_ratio=10, cap=20_000,
                                        cap_fraction=0.02)  # fmt: skip


def test_parse_lengths_reads_the_cli_form_and_names_bad_keys() -> None:
    model = parse_lengths("lognormal:median=50,p99_ratio=4,cap_fraction=0.1,seed=3", 100)
    got = model.lengths(4, 2)
    assert len(got) == 8 and max(got) == 100 and model.seed == 3
    with pytest.raises(ValueError, match="known keys"):
        parse_lengths("lognormal:mean=50", 100)
    with pytest.raises(ValueError, match="expected lognormal"):
        parse_lengths("uniform:median=50", 100)
    with pytest.raises(ValueError, match="p99_ratio"):
        parse_lengths("lognormal:median=50,p99_ratio=0.5", 100)


def test_simulate_cli_prints_a_labelled_table(capsys: pytest.CaptureFixture[str]) -> None:
    from longtail_workers.sim.main import main

    job = EXAMPLE_02.parent / "01-tiny-arith.yaml"
    assert main([str(job), "--roofline", "Qwen2-0.5B", "--lengths", "lognormal:median=8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("profile: ROOFLINE PROJECTION")
    assert "projected speedup" in out and "harvested GPU-seconds" in out


def test_simulate_cli_reports_a_bad_profile(capsys: pytest.CaptureFixture[str]) -> None:
    from longtail_workers.sim.main import main

    assert main([str(EXAMPLE_02), "--profile", "/nonexistent.json"]) == 2
    assert "cannot read a profile" in capsys.readouterr().err
