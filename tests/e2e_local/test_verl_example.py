"""Example 08 (a veRL-format parquet file) at CI size under ``longtail run``: real processes.

The example's file has veRL's columns (chat-message prompts, ``reward_model.ground_truth``,
``data_source`` routed by ``rewardBySource``); this runs one CI-sized step of it on
``builtin:tiny`` and checks that the run completes, the trainer read the file's rows with their
sources routed, and the verifier's math-verify checker processes scored the answers. The same
run is tracked by ``--tracking tensorboard`` (the example's own ``tracking`` block removed, so
the flag alone turns it on): TensorBoard's event reader reads the step back, with the idle
GPU-seconds ``longtail run`` adds at the end and the report's summary. Needs ``builtin:tiny`` and
its drafter (built before the first test: ``conftest.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "08-verl-parquet.yaml"
pytestmark = pytest.mark.slow


def test_example_08_runs_a_verl_parquet_file(tmp_path: Path) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    spec = doc["spec"]
    spec["dataset"].update(path=str(REPO / spec["dataset"]["path"]), evalSize=8)
    spec["algorithm"].update(
        totalSteps=1, groupSize=2, promptsPerStep=4, maxNewTokens=48, evalEverySteps=0
    )
    spec.pop("tracking")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "longtail_cli.main", "run", str(job), "--output", str(run_dir),
           "--tracking", "tensorboard"]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"longtail run did not finish in 300 s:\n{exc.stdout!r}")
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["answers"] == 8 and 0.0 <= row["reward_mean"] <= 1.0
    trainer_log = (run_dir / "logs" / "trainer.log").read_text()
    assert "rewards by data_source: longtail/arith -> math (200 rows)" in trainer_log
    assert "math reward: no math check" not in (run_dir / "logs" / "verifier.log").read_text()
    assert_tensorboard_run(run_dir, row)


def assert_tensorboard_run(run_dir: Path, row: dict[str, object]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert yaml.safe_load((run_dir / "job.yaml").read_text())["spec"]["tracking"] == {
        "tensorboard": {}
    }
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    [reward] = acc.Scalars("reward/mean")
    assert reward.step == 1 and reward.value == pytest.approx(row["reward_mean"])
    [idle] = acc.Scalars("gpu_seconds/idle")  # from longtail run's harvest books, at the end
    assert idle.step == 1 and idle.value >= 0.0
    assert "report/summary.md/text_summary" in acc.Tags()["tensors"]  # the report, as text
