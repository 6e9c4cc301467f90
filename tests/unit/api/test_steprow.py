"""The trainer's per-step row: what it writes to ``metrics.jsonl`` reads back the same, rows
of older versions still load, and a malformed row is refused naming the key."""

from __future__ import annotations

import json
import math
import re

import pytest

from longtail_api.protocol import ProtocolError
from longtail_api.steprow import SYNC_PHASES, StepRow

OLD_ROW = {  # a row as `longtail run` wrote it before the later fields existed
    "step": 3, "policy_version": 3, "drafter_version": 2, "reward_mean": 0.3, "accuracy": 0.25,
    "answers": 8, "mean_length": 30.0, "max_length": 64, "rollout_s": 4.0, "tail_s": 1.5,
    "train_s": 2.0, "sync_s": 0.1, "step_s": 6.1, "sd_fraction": 0.25,
    "mean_accepted_length": 2.5, "redispatched": 0, "failed_workers": [],
}  # fmt: skip


def test_a_full_row_round_trips_through_json() -> None:
    row = StepRow(step=4, policy_version=4, drafter_version=-1, reward_mean=0.5, accuracy=0.5,
                  rollout_s=3.0, tail_s=1.0, train_s=1.0, step_s=5.5, sync_s=0.5,
                  failed_workers=["w1"], train={"loss": 0.1, "tokens": 12},
                  trainer_harvested_s=1.5, eval_accuracy=0.4, response_lengths=[5, 64, 7, 1],
                  worker_generate_s={"rollout-0": 1.25, "rollout-1": 2.0},
                  answer_spec_steps=[0, 3, 0, 0], answer_accepted_drafts=[0, 5, 0, 0],
                  prompt_lengths=[12, 30])  # fmt: skip
    data = json.loads(json.dumps(row.to_dict()))
    assert data["train_loss"] == 0.1 and data["train_s"] == 1.0 and "idle_s" not in data
    assert data["response_lengths"] == [5, 64, 7, 1] and list(data)[-1] == "answer_accepted_drafts"
    assert StepRow.from_dict(data) == row


def test_old_rows_load_with_defaults() -> None:
    row = StepRow.from_dict(OLD_ROW)
    assert row.drafter_candidates_rejected == 0 and row.acceptance_collapsed is False
    assert row.trainer_harvested_s is None and row.train == {}
    assert row.response_lengths == [] and "response_lengths" not in row.to_dict()
    assert {k: v for k, v in row.to_dict().items() if k in OLD_ROW} == OLD_ROW


def test_weight_sync_figures_round_trip_and_old_rows_have_none() -> None:
    row = StepRow.from_dict({
        **OLD_ROW, "sync_version": 2, "sync_transport": "broadcast", "sync_gather_s": 0.5,
        "sync_pack_s": 0.25, "sync_wire_s": 1.0, "sync_load_s": 0.75, "sync_pause_s": 2.5,
        "sync_bytes": 3_000_000_000, "sync_gb_per_s": 1.2, "worker_load_s": {"rollout-0": 0.75},
    })  # fmt: skip
    assert (row.sync_version, row.sync_transport, row.sync_bytes) == (2, "broadcast", 3 * 10**9)
    assert [getattr(row, f"sync_{p}_s") for p in SYNC_PHASES] == [0.5, 0.25, 1.0, 0.75, 2.5]
    assert row.worker_load_s == {"rollout-0": 0.75}
    assert StepRow.from_dict(json.loads(json.dumps(row.to_dict()))) == row
    old = StepRow.from_dict(OLD_ROW)
    assert old.sync_version is None and old.sync_pause_s is None and old.worker_load_s == {}
    assert not any(k.startswith("sync_") and k != "sync_s" for k in old.to_dict())


def test_a_diverged_loss_still_loads() -> None:
    row = StepRow.from_dict({**OLD_ROW, "train_loss": float("nan")})
    assert math.isnan(row.train["loss"])


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"step": "3"}, "row.step: must be an integer"),
        ({"reward_mean": None}, "row.reward_mean: must be a number"),
        ({"reward_mean": float("nan")}, "row.reward_mean: must be a finite number"),
        ({"sync_pause_s": float("inf")}, "row.sync_pause_s: must be a finite number"),
        ({"failed_workers": "w1"}, "row.failed_workers: must be a list"),
        ({"train_loss": "x"}, "row.train_loss: must be a number"),
        ({"response_lengths": [3, -1]}, "row.response_lengths[1]: must be >= 0"),
        ({"prompt_lengths": [2.5]}, "row.prompt_lengths[0]: must be an integer"),
        ({"worker_generate_s": {"w": "x"}}, "row.worker_generate_s.w: must be a number"),
        ({"sync_transport": 3}, "row.sync_transport: must be a string"),
        ({"sync_load_s": -1.0}, "row.sync_load_s: must be >= 0"),
        ({"sync_bytes": 1.5}, "row.sync_bytes: must be an integer"),
        ({"worker_load_s": [1.0]}, "row.worker_load_s: must be a mapping"),
    ],
)
def test_malformed_rows_are_refused_naming_the_key(change: dict[str, object], named: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(named)):
        StepRow.from_dict({**OLD_ROW, **change})


def test_a_missing_required_key_is_named() -> None:
    missing = dict(OLD_ROW)
    del missing["step_s"]
    with pytest.raises(ProtocolError, match=re.escape("row.step_s: is required")):
        StepRow.from_dict(missing)
