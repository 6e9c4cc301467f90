"""Replaying a finished run's steps in the simulator: ``longtail simulate --lengths run:DIR``.

Called by ``sim/main.py`` and ``bench/sim_validate.py``. A run directory's ``metrics.jsonl``
(written by the trainer, one :class:`~longtail_api.steprow.StepRow` per step) holds, per step,
every answer's response length in request order, the prompt lengths and the mean accepted
length of the step's speculative steps. :func:`read_run` loads the steps that carry lengths;
:func:`replay` simulates each of them, baseline and Longtail, with that step's lengths, prompt
lengths and (unless fixed by the caller) accepted lengths and the drafter candidates its
merge judged (a run's step 1 also pays the warm-ups of the profile's ``overheads``), and
:func:`mean_results` sums the figures up per step. Pure Python (no torch).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from longtail_api.profile import EngineProfile
from longtail_api.protocol import ProtocolError
from longtail_api.steprow import METRICS_FILE, StepRow
from longtail_workers.sim.step import JobShape, StepResult, compare


def read_run(run_dir: str | Path) -> list[StepRow]:
    """The steps of a run directory that recorded their response lengths, in step order."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise ValueError(
            f"--lengths run:{run_dir}: no {METRICS_FILE} there; give the output directory of a "
            "`longtail run` (its -o) or a trainer's run directory"
        )
    rows: list[StepRow] = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(StepRow.from_dict(json.loads(line), f"{path.name}:{i}"))
        except (json.JSONDecodeError, ProtocolError) as exc:
            raise ValueError(f"{path}: line {i} is not a step row ({exc})") from exc
    with_lengths = [r for r in rows if r.response_lengths]
    if not with_lengths:
        raise ValueError(
            f"{path}: {len(rows)} steps but none recorded response_lengths (written by "
            "Longtail since #24); rerun the job with this version"
        )
    return with_lengths


def run_accepted_length(rows: Sequence[StepRow]) -> float:
    """Mean accepted length over the run's steps that speculated (1.0 if none did)."""
    values = [r.mean_accepted_length for r in rows if r.mean_accepted_length]
    return sum(values) / len(values) if values else 1.0


def replay(
    shape: JobShape,
    rows: Sequence[StepRow],
    profile: EngineProfile,
    accepted_length: float | None = None,
) -> list[tuple[StepResult, StepResult]]:
    """(baseline, Longtail) per step of ``rows``. A step's accepted length is ``accepted_length``
    when given, else each answer's own where the run recorded it (the step's mean for an answer
    that did not speculate), else the step's (the run's mean for a step that did not)."""
    fallback = run_accepted_length(rows)
    out = []
    for row in rows:
        n = shape.prompts * shape.group
        if len(row.response_lengths) != n:
            raise ValueError(
                f"step {row.step} of the run has {len(row.response_lengths)} answers; the job "
                f"asks prompts x group = {shape.prompts} x {shape.group} = {n}: simulate the job "
                "the run ran"
            )
        prompts = row.prompt_lengths or [shape.prompt_tokens]
        step_shape = dataclasses.replace(
            shape,
            prompt_tokens=round(sum(prompts) / len(prompts)),
            accepted_length=max(1.0, accepted_length or row.mean_accepted_length or fallback),
        )
        lengths = [max(1, x) for x in row.response_lengths]
        per_answer = None if accepted_length else answer_accepted(row, step_shape.accepted_length)
        own = row.prompt_lengths if len(row.prompt_lengths) == shape.prompts else None
        merges = row.drafter_candidates  # None in a run recorded before: one per harvested
        out.append(compare(step_shape, lengths, profile, per_answer, own, row.step == 1, merges))
    return out


def answer_accepted(row: StepRow, default: float) -> list[float] | None:
    """Each answer's accepted length (accepted drafts + 1 per speculative step) where the row
    recorded it, ``default`` for an answer that never speculated; None when not recorded."""
    steps, drafts = row.answer_spec_steps, row.answer_accepted_drafts
    if not steps or len(steps) != len(row.response_lengths) or len(drafts) != len(steps):
        return None
    return [1.0 + a / s if s else default for s, a in zip(steps, drafts, strict=True)]


def mean_results(results: Sequence[StepResult]) -> StepResult:
    """The per-step mean of every figure; workers and segments are the first step's."""
    if not results:
        raise ValueError("no steps to average")
    first = results[0]
    n = len(results)
    numbers = {
        f.name: sum(getattr(r, f.name) for r in results) / n
        for f in dataclasses.fields(StepResult)
        if isinstance(getattr(first, f.name), int | float)
    }
    numbers["response_tokens"] = round(numbers["response_tokens"])
    return dataclasses.replace(first, **numbers)
