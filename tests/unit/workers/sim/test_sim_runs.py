"""Replaying a finished run (``--lengths run:DIR``), the sensitivity table and the timeline PNG,
on hand-computed cases with the constant-latency profile of ``test_sim_step``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from test_sim_step import (
    DECODE_S,
    DRAFT_S,
    OVERHEADS,
    VERIFY_S,
    flat_profile,
    sd,
    shape,
)  # conftest.py puts this directory on sys.path

from longtail_api.policies import HarvestSpec
from longtail_api.steprow import METRICS_FILE, StepRow
from longtail_workers.sim.job import LognormalModel
from longtail_workers.sim.runs import mean_results, read_run, replay, run_accepted_length
from longtail_workers.sim.sensitivity import format_rows, sensitivity


def row(step: int, lengths: list[int], accepted: float | None, prompts: list[int]) -> StepRow:
    return StepRow(step=step, policy_version=step, drafter_version=-1, reward_mean=0.0,
                   accuracy=0.0, rollout_s=1.0, tail_s=0.5, train_s=1.0, step_s=2.0,
                   mean_accepted_length=accepted, response_lengths=lengths,
                   prompt_lengths=prompts)  # fmt: skip


def write_run(tmp_path: Path, rows: list[StepRow]) -> Path:
    (tmp_path / METRICS_FILE).write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rows))
    return tmp_path


def test_a_run_replays_each_step_with_its_own_lengths_and_accepted_length(tmp_path: Path) -> None:
    # One worker, 1 prompt x 2 answers, SD at <= 1 running, depth 4. Step 1: lengths 3 and 11,
    # accepted length 3: the prefill gives both their first token, 2 plain steps at 2 running
    # (the short one done; the long one at 3), then 8 tokens at 3 a step = 3 SD steps. Step 2:
    # lengths 2 and 2: 1 plain step. Prompts of 10 tokens: 0.2 s of prefill per step.
    run = write_run(tmp_path, [row(1, [3, 11], 3.0, [10]), row(2, [2, 2], 0.0, [10])])
    s = shape(group=2, speculative=sd(1, depth=4))
    steps = replay(s, read_run(run), flat_profile())
    (b1, l1), (b2, l2) = steps
    assert l1.rollout_s == pytest.approx(0.2 + 2 * DECODE_S + 3 * (4 * DRAFT_S + VERIFY_S))
    assert b1.rollout_s == pytest.approx(0.2 + 10 * DECODE_S)
    assert b2.rollout_s == l2.rollout_s == pytest.approx(0.2 + DECODE_S)
    mean = mean_results([l1, l2])
    assert mean.rollout_s == pytest.approx((l1.rollout_s + l2.rollout_s) / 2)
    assert mean.response_tokens == 9


def test_a_step_that_did_not_speculate_takes_the_runs_mean_accepted_length(tmp_path: Path) -> None:
    rows = read_run(write_run(tmp_path, [row(1, [2, 2], 4.0, []), row(2, [3, 11], 0.0, [])]))
    assert run_accepted_length(rows) == 4.0
    s = shape(group=2, speculative=sd(1, depth=4))
    (_, lt) = replay(s, rows, flat_profile())[1]
    # 2 plain steps, then 8 tokens at 4 a step.
    assert lt.workers[0].speculative_steps == 2
    (_, fixed) = replay(s, rows, flat_profile(), accepted_length=2.0)[1]
    assert fixed.workers[0].speculative_steps == 4


def test_a_replayed_run_pays_its_own_merges_and_its_first_steps_warm_up(tmp_path: Path) -> None:
    # 2 workers, 2 prompts x 1 answer, harvest after 0 s: worker 1 runs dry and is harvested
    # every step. Step 1 recorded no merge (its window's training did not pass the worker's
    # gate), step 2 merged 2 candidates, step 3 was written before the field (None): one per
    # harvested worker. Only step 1 pays the warm-ups.
    rows = [row(i, [2, 8], 2.0, [4, 4]) for i in (1, 2, 3)]
    rows[0].drafter_candidates, rows[1].drafter_candidates = 0, 2
    profile = dataclasses.replace(flat_profile(), overheads=OVERHEADS)
    s = shape(rollout_workers=2, prompts=2, group=1, harvest=HarvestSpec(idle_seconds=0.0))
    steps = replay(s, read_run(write_run(tmp_path, rows)), profile)
    assert [lt.merge_s for _, lt in steps] == pytest.approx([0.0, 0.4 + 0.1, 0.4])
    assert [b.merge_s for b, _ in steps] == [0.0, 0.0, 0.0]  # the baseline never merges
    warm = [b.trainer_s - steps[2][0].trainer_s for b, _ in steps]
    assert warm == pytest.approx([OVERHEADS.trainer_warmup_s, 0.0, 0.0])


def test_a_run_without_lengths_or_of_another_shape_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no metrics\.jsonl"):
        read_run(tmp_path)
    old = row(1, [], None, [])
    with pytest.raises(ValueError, match="none recorded response_lengths"):
        read_run(write_run(tmp_path, [old]))
    rows = read_run(write_run(tmp_path, [row(1, [5, 5, 5], None, [])]))
    with pytest.raises(ValueError, match="has 3 answers; the job asks prompts x group = 1 x 4"):
        replay(shape(), rows, flat_profile())
    (tmp_path / METRICS_FILE).write_text('{"step": 1}\n')
    with pytest.raises(ValueError, match="line 1 is not a step row"):
        read_run(tmp_path)


def test_sensitivity_varies_one_input_at_a_time() -> None:
    s = shape(rollout_workers=2, prompts=4, group=4, max_running=16, speculative=sd(4, depth=6),
              accepted_length=3.0, harvest=HarvestSpec(idle_seconds=0.0))  # fmt: skip
    model = LognormalModel(median=20, p99_ratio=10, cap=200, cap_fraction=0.02)
    rows = sensitivity(s, model, flat_profile())
    by = {(r.parameter, r.value): r for r in rows}
    assert {p for p, _ in by} == {"accepted length", "p99/median", "capped share", "SD threshold"}
    assert [v for p, v in by if p == "SD threshold"] == ["1", "2", "4*", "8", "16"]
    base = by[("accepted length", "3*")]
    assert by[("p99/median", "10*")].longtail_step_s == pytest.approx(base.longtail_step_s)
    # The baseline does not speculate: the accepted length moves only the Longtail side.
    assert by[("accepted length", "6.53")].baseline_step_s == base.baseline_step_s
    assert by[("accepted length", "6.53")].longtail_step_s < base.longtail_step_s
    assert "| SD threshold | 4* |" in format_rows(rows)


def test_the_timeline_png_is_written(tmp_path: Path) -> None:
    from longtail_workers.sim.plot import timeline_png
    from longtail_workers.sim.step import compare

    s = shape(rollout_workers=2, prompts=2, group=1, speculative=sd(1), accepted_length=2.0,
              harvest=HarvestSpec(idle_seconds=0.0), weight_sync_s=0.1)  # fmt: skip
    base, lt = compare(s, [10, 2], flat_profile())
    out = tmp_path / "plots" / "timeline.png"
    timeline_png(base, lt, out, "test profile")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_cli_replays_a_run_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from longtail_workers.sim.main import main

    job = Path(__file__).parents[4] / "examples" / "01-tiny-arith.yaml"  # 16 prompts x 8
    run = write_run(tmp_path, [row(1, [5] * 127 + [60], 3.0, [20] * 16),
                               row(2, [9] * 128, 0.0, [20] * 16)])  # fmt: skip
    profile = tmp_path / "profile.json"
    flat_profile().write(profile)
    png = tmp_path / "timeline.png"
    # flat_profile has no per-phase weight-sync costs: the sync is given.
    given = [str(job), "--weight-sync-s", "0.1", "--profile", str(profile)]
    args = [*given, "--lengths", f"run:{run}", "--plot", str(png)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"lengths: 2 steps of run {run}" in out and "measured profile" in out
    assert f"timeline: {png}" in out and png.is_file()
    assert main([*args[:7], "--sensitivity"]) == 2
    assert "--sensitivity varies the lognormal length model" in capsys.readouterr().err
    assert main([*given, "--kv-tokens", "-1"]) == 2
    assert "--kv-tokens -1: must be >= 0" in capsys.readouterr().err


def test_each_answer_speculates_at_its_own_accepted_length(tmp_path: Path) -> None:
    # One worker, 1 prompt x 2 answers of 11 tokens, SD on from the start (threshold 2, depth
    # 4). The run recorded answer A at 2 steps / 4 accepted drafts (3 tokens a step) and B at 5
    # steps / 0 accepted (1 a step): after the prefill's first token, A needs 4 steps (3+3+3+1)
    # and B 10, so the worker runs 10 speculative steps (the step's mean, 2.0, would need 5).
    r = row(1, [11, 11], 2.0, [])
    r.answer_spec_steps, r.answer_accepted_drafts = [2, 5], [4, 0]
    s = shape(group=2, speculative=sd(2, depth=4))
    ((_, lt),) = replay(s, read_run(write_run(tmp_path, [r])), flat_profile())
    assert (lt.workers[0].speculative_steps, lt.response_tokens) == (10, 22)
    assert lt.rollout_s == pytest.approx(10 * (4 * DRAFT_S + VERIFY_S))
    ((_, mean),) = replay(s, read_run(tmp_path), flat_profile(), accepted_length=2.0)
    assert mean.workers[0].speculative_steps == 5
