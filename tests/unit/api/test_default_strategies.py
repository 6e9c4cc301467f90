"""The strategy set of a job that lists none depends on its engine (``defaulting.py``): the torch
engine speculates with the learned drafter, history and hybrid; vLLM with the learned drafter
only; a torch job with no drafter with history alone. What a user writes is kept as written,
and the CRD carries no default, so the API server stores the job as written and every reader
(CLI, local run, workers, operator) resolves the same set."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from rljobs import MINIMAL, VLLM

from longtail_api.manifest import validate_manifest
from longtail_api.policies import SpeculativeSpec
from longtail_api.spec import RLJobSpec

REPO = Path(__file__).resolve().parents[3]
NO_DRAFTER = {"drafterTraining": {"enabled": False}, "harvest": {"enabled": False}}


def resolved(**spec: Any) -> tuple[list[tuple[int, str]], list[str]]:
    obj = copy.deepcopy(MINIMAL)
    obj["spec"].update(spec)
    result = validate_manifest(obj)
    assert result.spec is not None
    strategies = [(s.draft_depth, s.drafter) for s in result.spec.speculative.strategies]
    return strategies, [str(e) for e in result.errors]


def test_a_torch_job_gets_learned_history_and_hybrid_strategies() -> None:
    strategies, problems = resolved()
    assert problems == []
    assert strategies == [
        (2, "learned"),
        (4, "learned"),
        (6, "learned"),
        (4, "history"),
        (8, "history"),
        (4, "hybrid"),
    ]


def test_a_vllm_job_gets_learned_strategies_only_and_stays_valid() -> None:
    strategies, problems = resolved(**VLLM)
    assert problems == []
    assert strategies == [(2, "learned"), (4, "learned"), (6, "learned")]


def test_a_torch_job_without_a_drafter_speculates_with_history() -> None:
    # Before engine defaults this job was refused: its learned strategies needed a drafter.
    strategies, problems = resolved(**NO_DRAFTER)
    assert problems == []
    assert strategies == [(4, "history"), (8, "history")]
    # An initial drafter is a drafter: the whole set.
    with_initial = {
        **NO_DRAFTER,
        "drafterTraining": {"enabled": False, "initialDrafter": "builtin:tiny"},
    }
    assert len(resolved(**with_initial)[0]) == 6
    # vLLM cannot draft from history, so a vLLM job without a drafter is still refused.
    no_drafter_vllm = {
        **NO_DRAFTER,
        **VLLM,
        "drafterTraining": {"enabled": False, "layout": "eagle1"},
    }
    [message] = resolved(**no_drafter_vllm)[1]
    assert message.startswith("spec.speculative.enabled: speculative decoding needs a drafter")


def test_strategies_the_user_lists_are_kept_as_written() -> None:
    written = {"strategies": [{"draftDepth": 3}]}
    assert resolved(speculative=written)[0] == [(3, "learned")]
    assert resolved(**VLLM, speculative=written)[0] == [(3, "learned")]
    # Other speculative fields given, strategies left out: still the engine's set.
    assert len(resolved(speculative={"batchThreshold": 8})[0]) == 6


@pytest.mark.parametrize(("extra", "ok"), [({}, True), (VLLM, False)])
def test_a_fixed_selector_is_checked_against_the_resolved_set(
    extra: dict[str, Any], ok: bool
) -> None:
    speculative = {"selector": {"type": "fixed", "fixedIndex": 5}}
    problems = resolved(**extra, speculative=speculative)[1]
    assert (problems == []) is ok, problems


def test_the_crd_stores_strategies_as_written_and_the_reference_says_by_engine() -> None:
    crd = yaml.safe_load((REPO / "crds" / "rljob.yaml").read_text())
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    strategies = props["properties"]["speculative"]["properties"]["strategies"]
    assert "default" not in strategies
    # Nor in the default of the speculative block (a job that leaves the block out).
    assert "strategies" not in props["properties"]["speculative"]["default"]
    reference = (REPO / "docs" / "rljob-reference.md").read_text()
    row = next(line for line in reference.splitlines() if line.startswith("| `strategies` |"))
    assert "by engine: torch" in row and "vllm `learned` 2/4/6" in row


def test_a_spec_built_in_code_keeps_the_learned_chains() -> None:
    # Tests, benches and the profiler build SpeculativeSpec() directly: valid on both engines.
    assert [(s.draft_depth, s.drafter) for s in SpeculativeSpec().strategies] == [
        (2, "learned"),
        (4, "learned"),
        (6, "learned"),
    ]
    assert RLJobSpec.__dataclass_fields__["speculative"] is not None
