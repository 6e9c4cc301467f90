"""What moves the projection most: ``longtail simulate ... --sensitivity``.

Called by ``sim/main.py``. Starting from the job's shape and a log-normal length model, one input
is varied at a time, the others held at the base case, and each variant is simulated baseline
vs Longtail (:func:`longtail_workers.sim.step.compare`):

* **accepted length** (how good the drafter is): 1.5, 2, 3, 4.59 and 6.53 (TLT's reported range
  before and after online training) and the base value;
* **tail share**: the length model's p99/median ratio (5, 10, 20) and the share of answers that
  hit ``maxNewTokens`` (1%, 2%, 5%);
* **SD threshold** (``speculative.batchThreshold``): a quarter, half, the job's, twice and four
  times the job's, capped at the running batch.

Pure Python; the rows are printed by :func:`format_rows`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from longtail_api.profile import EngineProfile
from longtail_workers.sim.job import LognormalModel
from longtail_workers.sim.step import JobShape, compare

ACCEPTED_LENGTHS = (1.5, 2.0, 3.0, 4.59, 6.53)
P99_RATIOS = (5.0, 10.0, 20.0)
CAP_FRACTIONS = (0.01, 0.02, 0.05)
THRESHOLD_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)


@dataclass(frozen=True)
class SensitivityRow:
    """One variant: which input, its value, and the two simulated steps' figures."""

    parameter: str
    """The input varied (``accepted length``, ``p99/median``, ``capped share``, ``threshold``)."""
    value: str
    """Its value in this variant (``*`` marks the base case)."""
    baseline_step_s: float
    """Baseline step seconds."""
    longtail_step_s: float
    """Longtail step seconds."""
    rollout_speedup: float
    """Baseline rollout / Longtail rollout."""
    idle_gpu_s: float
    """Baseline idle rollout GPU-seconds."""
    harvested_gpu_s: float
    """Longtail harvested GPU-seconds."""

    @property
    def step_speedup(self) -> float:
        """Baseline step / Longtail step."""
        return self.baseline_step_s / self.longtail_step_s


def sensitivity(
    shape: JobShape, model: LognormalModel, profile: EngineProfile
) -> list[SensitivityRow]:
    """Every variant of the module text, base case included once per parameter."""
    rows: list[SensitivityRow] = []

    def run(parameter: str, value: str, s: JobShape, m: LognormalModel) -> None:
        base, lt = compare(s, m.lengths(s.prompts, s.group), profile)
        rows.append(SensitivityRow(parameter, value, base.step_s, lt.step_s,
                                   base.rollout_s / lt.rollout_s, base.idle_gpu_s,
                                   lt.harvested_gpu_s))  # fmt: skip

    def mark(is_base: bool, text: str) -> str:
        return f"{text}*" if is_base else text

    def variants(values: tuple[float, ...], current: float) -> list[float]:
        return sorted(set(values) | {current})

    for a in variants(ACCEPTED_LENGTHS, shape.accepted_length):
        s = dataclasses.replace(shape, accepted_length=a)
        run("accepted length", mark(a == shape.accepted_length, f"{a:g}"), s, model)
    for r in variants(P99_RATIOS, model.p99_ratio):
        m = dataclasses.replace(model, p99_ratio=r)
        run("p99/median", mark(r == model.p99_ratio, f"{r:g}"), shape, m)
    for f in variants(CAP_FRACTIONS, model.cap_fraction):
        m = dataclasses.replace(model, cap_fraction=f)
        run("capped share", mark(f == model.cap_fraction, f"{f:.0%}"), shape, m)
    job = shape.speculative.batch_threshold
    thresholds = sorted({max(1, min(shape.max_running, round(job * f))) for f in THRESHOLD_FACTORS})
    for t in thresholds:
        s = dataclasses.replace(
            shape, speculative=dataclasses.replace(shape.speculative, batch_threshold=t)
        )
        run("SD threshold", mark(t == job, str(t)), s, model)
    return rows


COLUMNS: tuple[tuple[str, Callable[[SensitivityRow], str]], ...] = (
    ("baseline step s", lambda r: f"{r.baseline_step_s:.1f}"),
    ("longtail step s", lambda r: f"{r.longtail_step_s:.1f}"),
    ("step speedup", lambda r: f"{r.step_speedup:.2f}x"),
    ("rollout speedup", lambda r: f"{r.rollout_speedup:.2f}x"),
    ("idle GPU-s", lambda r: f"{r.idle_gpu_s:.0f}"),
    ("harvested GPU-s", lambda r: f"{r.harvested_gpu_s:.0f}"),
)


def format_rows(rows: list[SensitivityRow]) -> str:
    """A Markdown table (``*``: the base case)."""
    head = ["input", "value", *(name for name, _ in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.parameter, r.value, *(fmt(r) for _, fmt in COLUMNS)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
