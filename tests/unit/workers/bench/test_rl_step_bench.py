"""The GPU suite's RL-step stage (``bench/gpu/rl_step_gpu.py``) end to end on ``builtin:tiny``.

What a GPU session runs on ``builtin:small``, here on CPU with a small job: the built-in policy
and drafter prepared, both arms run with ``longtail run`` (Longtail, then ``--no-speculative
--no-harvest``), every step printed, a profile of the job's model taken after them and every
step of both runs replayed on it. The figures are CPU figures and not judged; the files and
their fields are what the GPU session's notes are written from.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[4]


def small_job(tmp_path: Path) -> Path:
    """Example 01 at 4 prompts x 4 answers, answers of at most 48 tokens."""
    doc = yaml.safe_load((ROOT / "examples" / "01-tiny-arith.yaml").read_text())
    doc["spec"]["algorithm"].update(promptsPerStep=4, groupSize=4, maxNewTokens=48)
    doc["spec"]["speculative"]["batchThreshold"] = 4
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_rl_step_stage_runs_both_arms_profiles_and_predicts(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [
        sys.executable, str(ROOT / "bench" / "gpu" / "rl_step_gpu.py"), "--out", str(out),
        "--job", str(small_job(tmp_path)), "--steps", "2", "--eval-size", "4",
        "--profile-args", "--device cpu --quick --threads 1 --batches 1,2 --contexts 16 --depths 2",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Longtail (adaptive SD + harvest), per step" in proc.stdout
    assert "baseline (--no-speculative --no-harvest), per step" in proc.stdout

    rl = json.loads((out / "rl_step.json").read_text())
    assert rl["steps"] == 2
    assert rl["step_time_ratio"] > 0 and rl["rollout_time_ratio"] > 0
    for arm in ("longtail", "baseline"):
        figures = rl[arm]
        keys = ("mean_step_s", "mean_rollout_s", "mean_tail_s", "mean_train_s", "mean_sync_s",
                "mean_reward", "sd_fraction", "idle_s", "harvested_s")  # fmt: skip
        for key in keys:
            assert figures[key] >= 0, (arm, key)
        assert figures["start_eval"] is not None and figures["final_eval"] is not None
    assert rl["baseline"]["sd_fraction"] == 0 and rl["baseline"]["harvested_s"] == 0
    for arm in ("longtail", "baseline"):  # every step's figures, the harvest books' included
        steps = rl["per_step"][arm]
        assert [s["step"] for s in steps] == [1, 2]
        assert all(s["idle_s"] is not None and s["harvested_s"] is not None for s in steps)
    # Lossless SD: the step-0 greedy eval of the two arms is the same text.
    assert rl["eval_step0"]["greedy_items"] == 4
    assert rl["eval_step0"]["greedy_identical"] == 4
    for arm in ("longtail", "baseline"):  # each arm also on its own, written when it ended
        part = json.loads((out / f"rl_step-{arm}.json").read_text())
        assert part["arm"] == arm and part["per_step"] == rl["per_step"][arm]

    for arm in ("longtail", "baseline"):  # is there a long tail at all: lengths and tail share
        for s in rl["per_step"][arm]:
            assert 0 < s["len_p50"] <= s["len_p99"] <= s["len_max"] <= 48, s
            assert 0 <= s["tail_share"] <= 1, s
        # the step-0 greedy texts both arms wrote, kept for a look at any difference
        assert (out / "runs" / arm / "eval-step-000000.jsonl").is_file()
    assert rl["rollout_time_ratio_from_2"] > 0
    rows = [json.loads(ln) for ln in (out / "runs" / "longtail" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["drafter_candidates"] >= 0 for r in rows)  # what the replay merges
    profile = json.loads((out / "profile.json").read_text())
    assert profile["overheads"]["call_s"] > 0 and profile["overheads"]["merge_s"] > 0
    predicted = json.loads((out / "sim_vs_measured.json").read_text())
    for arm in ("longtail", "baseline"):
        f = predicted["arms"][arm]
        assert f["steps"] == 2 and f["measured_step_s"] > 0 and f["predicted_step_s"] > 0
    assert {"build_s", "arms_s", "profile_s"} <= set(predicted["timings_s"])
    assert (out / "build-policy.json").is_file() and (out / "build-drafter.json").is_file()


def test_build_only_builds_and_stops(tmp_path: Path) -> None:
    """The suite's first call (``--suite rl-build``): the builds, their records, no arms."""
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "bench" / "gpu" / "rl_step_gpu.py"), "--out", str(out),
           "--job", str(small_job(tmp_path)), "--build-only"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "build-policy.json").is_file() and (out / "build-drafter.json").is_file()
    assert json.loads((out / "build-timings.json").read_text())["build_s"] >= 0
    assert not (out / "rl_step.json").exists() and "per step" not in proc.stdout


def test_greedy_divergence_compares_plain_and_sd_greedy(tmp_path: Path) -> None:
    """``bench/gpu/greedy_divergence.py`` on CPU: float32 greedy with and without SD is the
    same text (the GPU sitting asks this in bf16 too, and the margin where they differ)."""
    out = tmp_path / "divergence.json"
    cmd = [sys.executable, str(ROOT / "bench" / "gpu" / "greedy_divergence.py"),
           "--job", str(small_job(tmp_path)), "--out", str(out), "--items", "3",
           "--device", "cpu", "--dtypes", "float32", "--max-new-tokens", "24"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())["dtypes"]["float32"]
    assert len(result["items"]) == 3
    assert result["identical"] == 3 and result["plain_repeatable"] == 3, result
    assert all(it["plain_tokens"] > 0 for it in result["items"])
