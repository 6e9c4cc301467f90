"""``bench/staleness.py``'s arms (issue #49): each arm's job is a valid RLJob that differs from
example 01 only where the arm says (the runs themselves are a benchmark, not a test)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from longtail_api.manifest import validate_manifest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "01-tiny-arith.yaml"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("staleness", ROOT / "bench" / "staleness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["staleness"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("arm", ["frozen", "online", "history", "hybrid", "baseline"])
def test_every_arm_is_a_valid_job_that_changes_only_its_drafting(arm: str) -> None:
    bench = load_bench()
    base = yaml.safe_load(EXAMPLE.read_text())
    doc = bench.arm_job(base, arm, 20)
    result = validate_manifest(doc)
    assert result.ok, result.errors
    spec = result.spec
    assert spec.algorithm.total_steps == 20 and spec.algorithm.eval_every_steps == 20
    kinds = {s.drafter for s in spec.speculative.strategies}
    as_shipped = validate_manifest(base).spec  # the example's strategies, or its engine's set
    assert as_shipped is not None
    shipped = {s.drafter for s in as_shipped.speculative.strategies}
    expected = {"frozen": {"learned"}, "online": {"learned"}, "history": {"history"},
                "hybrid": {"hybrid"}, "baseline": shipped}[arm]  # fmt: skip
    assert kinds == expected
    trains = arm in ("online", "hybrid", "baseline")  # baseline: --no-speculative --no-harvest
    assert spec.drafter_training.enabled == trains and spec.harvest.enabled == trains
    # everything else as the example: same seeds, model, data, batch
    assert spec.algorithm.seed == base["spec"]["algorithm"]["seed"]
    assert spec.model.path == base["spec"]["model"]["path"]
    assert base["spec"]["algorithm"]["totalSteps"] == 20  # the example itself is untouched


def test_an_unknown_arm_is_refused_before_anything_runs() -> None:
    bench = load_bench()
    with pytest.raises(SystemExit, match="unknown arm 'frozn'"):
        bench.arm_job(yaml.safe_load(EXAMPLE.read_text()), "frozn", 2)
