"""What a tracker receives: the spec as flat parameters, and each step's figures.

Called by ``tracking/sink.py`` (the trainer's :class:`~longtail_workers.tracking.sink.Tracker`)
and ``local/run.py`` (the idle and harvested GPU-seconds, known only to ``longtail run``'s
harvest books, added per step at the end). Every figure comes from the trainer's
:class:`~longtail_api.steprow.StepRow`; a figure the row does not have for a step (eval accuracy
on steps that do not evaluate, speculation when it is off) is left out rather than logged as 0.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from longtail_api.fields import json_name
from longtail_api.spec import RLJobSpec
from longtail_api.steprow import StepRow

PARAM_VALUE_LIMIT = 500
"""Longest parameter value MLflow accepts in every version; longer ones are cut."""


def spec_params(spec: RLJobSpec) -> dict[str, str]:
    """The spec as ``dotted.camelCase`` keys with string values (``algorithm.groupSize``)."""
    out: dict[str, str] = {}
    _flatten(spec, "", out)
    return out


def _flatten(value: Any, prefix: str, out: dict[str, str]) -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _flatten(getattr(value, f.name), f"{prefix}{json_name(f)}.", out)
        return
    if isinstance(value, dict) and value:
        for key, item in value.items():
            _flatten(item, f"{prefix}{key}.", out)
        return
    out[prefix.rstrip(".")] = str(value)[:PARAM_VALUE_LIMIT]


def _percentile(sorted_values: list[int], q: float) -> float:
    """Nearest-rank percentile (the value of an actual answer)."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def step_figures(row: StepRow) -> dict[str, float]:
    """The row's figures under tracker keys grouped by panel (``reward/mean``, ``time/step_s``)."""
    out: dict[str, float | None] = {
        "reward/mean": row.reward_mean,
        "reward/std": row.reward_std,
        "reward/accuracy": row.accuracy,
        "eval/accuracy": row.eval_accuracy,
        "eval/sampled_accuracy": row.eval_sampled_accuracy,
        "response_length/mean": row.mean_length,
        "response_length/max": row.max_length,
        "train/kl_ref": row.train.get("kl_ref"),
        "train/approx_kl": row.train.get("approx_kl"),
        "train/loss": row.train.get("loss"),
        "train/grad_norm": row.train.get("grad_norm"),
        "train/learning_rate": row.train.get("learning_rate"),
        "train/clip_fraction": row.train.get("clip_fraction"),
        "policy/entropy": row.train.get("entropy"),
        "time/step_s": row.step_s,
        "time/rollout_s": row.rollout_s,
        "time/tail_s": row.tail_s,
        "time/update_s": row.train_s,
        "time/sync_s": row.sync_s,
        "speculative/sd_token_share": row.sd_fraction,
        "speculative/accepted_length": row.mean_accepted_length,
        "drafter/version": row.drafter_version,
        "gpu_seconds/trainer_harvested": row.trainer_harvested_s,
        "gpu_seconds/idle": row.idle_s,
        "gpu_seconds/harvested": row.harvested_s,
        "policy/version": row.policy_version,
        "rollout/workers": row.rollout_workers,
    }
    if row.response_lengths:
        lengths = sorted(row.response_lengths)
        out["response_length/p50"] = _percentile(lengths, 50)
        out["response_length/p99"] = _percentile(lengths, 99)
    for source, share in row.sd_fraction_by_source.items():
        out[f"speculative/sd_token_share_{source}"] = share
    for source, length in row.accepted_length_by_source.items():
        out[f"speculative/accepted_length_{source}"] = length
    return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}


def harvest_figures(row: StepRow) -> dict[str, float]:
    """The ``longtail run``-only figures of a row merged with the harvest books."""
    out = {"gpu_seconds/idle": row.idle_s, "gpu_seconds/harvested": row.harvested_s}
    return {k: float(v) for k, v in out.items() if v is not None}
