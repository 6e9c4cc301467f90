"""The GPU suite's extra RL-step arms (``bench/gpu/rl_step_gpu.py --extra-arms``): each arm's
job is a valid RLJob that differs from the job as written only where the arm says.

The arms themselves run ``longtail run`` like the two main arms (``test_rl_step_bench.py``
runs those end to end); here, without a run, what each arm asks the engine to do.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from longtail_api.manifest import validate_file
from longtail_api.spec import RLJobSpec

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
import rl_step_gpu  # noqa: E402

JOB = ROOT / "examples" / "06-small-arith-gpu.yaml"


def arm_spec(arm: str, tmp_path: Path) -> RLJobSpec:
    path = rl_step_gpu.extra_arm_job(JOB, arm, tmp_path / f"{arm}.yaml")
    (manifest,) = validate_file(path)
    assert manifest.errors == [], manifest.errors
    assert manifest.spec is not None
    return manifest.spec


def test_the_history_arm_speculates_with_history_alone_and_trains_no_drafter(
    tmp_path: Path,
) -> None:
    spec = arm_spec("history", tmp_path)
    assert {s.drafter for s in spec.speculative.strategies} == {"history"}
    assert [s.draft_depth for s in spec.speculative.strategies] == [4, 8]
    assert spec.speculative.enabled
    assert not spec.drafter_training.enabled and not spec.drafter_training.initial_drafter
    assert not spec.harvest.enabled
    written = validate_file(JOB)[0].spec
    assert written is not None  # the rest of the job is the job as written
    assert spec.algorithm == written.algorithm and spec.rollout == written.rollout


def test_the_engine_set_arm_gets_the_engines_default_strategies(tmp_path: Path) -> None:
    spec = arm_spec("engine-set", tmp_path)
    kinds = [(s.drafter, s.draft_depth) for s in spec.speculative.strategies]
    assert ("history", 8) in kinds and ("hybrid", 4) in kinds and ("learned", 6) in kinds
    assert spec.drafter_training.enabled


def test_an_unknown_arm_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"unknown arm 'fast'.*history, engine-set"):
        rl_step_gpu.extra_arm_job(JOB, "fast", tmp_path / "x.yaml")
