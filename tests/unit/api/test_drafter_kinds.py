"""What drafts a strategy (``learned``, ``history``, ``hybrid``) in the spec's validation, the
step row and the trainer's status: history strategies refused on vLLM naming the field, value
and fix, the history index's bounds checked against each other, and the per-source figures of
rows and statuses read back (old ones without them too)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from rljobs import MINIMAL, VLLM

from longtail_api.manifest import validate_manifest
from longtail_api.steprow import StepRow
from longtail_api.wirecodec import from_wire, to_wire
from longtail_api.workerapi import TrainerStatus

REPO = Path(__file__).resolve().parents[3]


def errors(**spec: Any) -> list[str]:
    obj = copy.deepcopy(MINIMAL)
    obj["spec"].update(spec)
    return [str(e) for e in validate_manifest(obj).errors]


@pytest.mark.parametrize("kind", ["history", "hybrid"])
def test_vllm_refuses_history_strategies_naming_field_value_and_fix(kind: str) -> None:
    strategies = [{"draftDepth": 2}, {"draftDepth": 4, "drafter": kind}]
    [message] = errors(**VLLM, speculative={"strategies": strategies})
    assert message.startswith("spec.speculative.strategies[1].drafter: vLLM 0.32 cannot draft")
    assert "'ngram'" in message and "arctic-inference" in message
    assert f"got '{kind}'" in message
    assert "use drafter: learned with rollout.engine: vllm, or rollout.engine: torch" in message
    # Not refused: learned strategies on vLLM, every kind on torch, anything with SD off.
    assert errors(**VLLM, speculative={"strategies": [{"drafter": "learned"}]}) == []
    kinds = [{"drafter": k} for k in ("learned", "history", "hybrid")]
    assert errors(speculative={"strategies": kinds}) == []
    # Speculation off: what would draft does not matter.
    off = {"enabled": False, "strategies": [{"drafter": "history"}]}
    assert errors(**VLLM, speculative=off) == []


def test_the_vllm_doc_says_which_method_and_why() -> None:
    text = (REPO / "docs" / "vllm.md").read_text()
    section = text.split("## History drafting")[1].split("\n## ")[0]
    for words in ("method: ngram", "method: suffix", "arctic-inference", "hybrid"):
        assert words in section, words


@pytest.mark.parametrize(
    ("history", "starts", "ends"),
    [
        (
            {"minMatch": 8, "maxMatch": 4},
            "spec.speculative.history.minMatch: must be <= maxMatch (4)",
            "got 8 (lower minMatch to at most 4, or raise maxMatch)",
        ),
        (
            {"maxTokensPerPrompt": 100_000, "maxTokensTotal": 2048},
            "spec.speculative.history.maxTokensPerPrompt: must be <= maxTokensTotal (2048)",
            "got 100000 (lower maxTokensPerPrompt to at most 2048, or raise maxTokensTotal)",
        ),
    ],
)
def test_history_bounds_are_checked_against_each_other(
    history: dict[str, int], starts: str, ends: str
) -> None:
    found = errors(speculative={"history": history})
    assert len(found) == 1, found
    assert found[0].startswith(starts) and found[0].endswith(ends), found[0]


def test_hybrid_min_match_is_checked_against_max_match_when_a_strategy_is_hybrid() -> None:
    hybrid = {"maxMatch": 3}, [{"drafter": "learned"}, {"drafter": "hybrid"}]
    [message] = errors(speculative={"history": hybrid[0], "strategies": hybrid[1]})
    assert message == (
        "spec.speculative.history.hybridMinMatch: must be <= maxMatch (3) when a strategy is "
        "hybrid (strategies[1]): no match is longer than maxMatch, so the hybrid would never "
        "draft from history, got 4 (lower hybridMinMatch to at most 3, raise maxMatch, or use "
        "drafter: learned)"
    )
    learned = [{"drafter": "learned"}, {"drafter": "history"}]  # no hybrid: nothing to say
    assert errors(speculative={"history": {"maxMatch": 3}, "strategies": learned}) == []
    # The torch engine's default set has a hybrid strategy (strategies[5]); vLLM's has none.
    [default] = errors(speculative={"history": {"maxMatch": 3}})
    assert "when a strategy is hybrid (strategies[5])" in default
    assert errors(**VLLM, speculative={"history": {"maxMatch": 3}}) == []


def test_only_history_strategies_need_no_drafter() -> None:
    no_drafter = {"drafterTraining": {"enabled": False}, "harvest": {"enabled": False}}
    history = {"strategies": [{"drafter": "history", "draftDepth": 4}]}
    assert errors(**no_drafter, speculative=history) == []
    hybrid = {"strategies": [{"drafter": "history"}, {"drafter": "hybrid"}]}
    [message] = errors(**no_drafter, speculative=hybrid)
    assert message.startswith("spec.speculative.enabled: speculative decoding needs a drafter "
                              "for its learned and hybrid strategies")  # fmt: skip
    assert "use only strategies with drafter: history" in message


ROW = {  # a row as the trainer wrote it before the split by draft source
    "step": 3, "policy_version": 3, "drafter_version": 2, "reward_mean": 0.3, "accuracy": 0.25,
    "answers": 8, "mean_length": 30.0, "max_length": 64, "rollout_s": 4.0, "tail_s": 1.5,
    "train_s": 2.0, "sync_s": 0.1, "step_s": 6.1, "sd_fraction": 0.5,
    "mean_accepted_length": 2.5, "redispatched": 0, "failed_workers": [],
}  # fmt: skip


def test_a_step_row_with_figures_by_draft_source_round_trips() -> None:
    fractions, lengths = {"learned": 0.125, "history": 0.375}, {"learned": 1.5, "history": 3.25}
    row = StepRow.from_dict(
        {**ROW, "sd_fraction_by_source": fractions, "accepted_length_by_source": lengths}
    )
    assert row.sd_fraction_by_source == fractions and row.accepted_length_by_source == lengths
    data = json.loads(json.dumps(row.to_dict()))
    assert data["sd_fraction_by_source"] == fractions
    assert StepRow.from_dict(data) == row


def test_a_row_without_them_reads_and_writes_as_before() -> None:
    row = StepRow.from_dict(ROW)
    assert row.sd_fraction_by_source == {} and row.accepted_length_by_source == {}
    assert row.to_dict() == {**ROW, "drafter_candidates_rejected": 0, "acceptance_collapsed": False}


def test_a_malformed_figure_by_source_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"row\.accepted_length_by_source\.history: must be >= 0"):
        StepRow.from_dict({**ROW, "accepted_length_by_source": {"history": -1.0}})


def test_the_trainer_status_carries_them_and_an_older_status_reads() -> None:
    status = TrainerStatus(3, 5, "running", 3, 2, sd_fraction=0.5,
                           sd_fraction_by_source={"learned": 0.125, "history": 0.375},
                           accepted_length_by_source={"learned": 1.5, "history": 3.25})  # fmt: skip
    wire = to_wire(status)
    assert wire["sdFractionBySource"] == {"learned": 0.125, "history": 0.375}
    assert wire["acceptedLengthBySource"] == {"learned": 1.5, "history": 3.25}
    assert from_wire(TrainerStatus, json.loads(json.dumps(wire)), "status") == status
    old = {k: v for k, v in wire.items() if not k.endswith("BySource")}
    assert from_wire(TrainerStatus, old, "status").sd_fraction_by_source == {}
