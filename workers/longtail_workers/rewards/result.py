"""What a reward function returns, and the one formula that mixes correctness with format.

Every reward function (built-in or registered by a user) returns a :class:`RewardResult`; the
verifier service serialises it per item and the trainer uses ``reward`` as the scalar for GRPO
advantages. :func:`combine` is the shared formula, so that all rewards treat ``format_weight``
the same way:

    reward = (1 - format_weight) * correct + format_weight * formatted

where ``correct`` and ``formatted`` are 0 or 1. With the default ``format_weight = 0`` the reward
is plain correctness. A small weight (e.g. 0.1) gives a model that has not learned to answer in
the expected form yet a gradient toward it; a correct answer always scores 1.0, and the only
way to score 1.0 is to be correct *and* well-formed (a correct answer is always well-formed,
since correctness is judged on the extracted answer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RewardResult:
    """The score of one answer against its gold answer."""

    reward: float
    """Scalar reward in [0, 1] (see :func:`combine`)."""
    correct: bool
    """Whether the extracted final answer equals the gold answer."""
    extracted: str | None
    """The final answer found in the model output, ``None`` if there was none."""
    formatted: bool
    """Whether the output contains a well-formed final answer (box or ``Answer:`` line)."""
    reason: str | None = None
    """Why the answer was not judged on its maths (no final answer, the checker gave up after
    its time limit...), in words for a log; ``None`` when it was."""


def check_format_weight(format_weight: object) -> float:
    """Return ``format_weight`` as a float after checking it is a number in [0, 1].

    Raises ``TypeError`` for non-numbers (``bool`` included: ``True`` is a typo, not 1.0) and
    ``ValueError`` for NaN or values outside [0, 1].
    """
    if isinstance(format_weight, bool) or not isinstance(format_weight, int | float):
        raise TypeError(
            f"format_weight: must be a number in [0, 1], got {type(format_weight).__name__} "
            f"{format_weight!r:.60} (pass e.g. 0.1, or 0 to score correctness only)"
        )
    weight = float(format_weight)
    if math.isnan(weight) or not 0.0 <= weight <= 1.0:
        raise ValueError(
            f"format_weight: must be in [0, 1], got {format_weight!r} "
            f"(0 scores correctness only; 1 scores format only)"
        )
    return weight


def combine(*, correct: bool, formatted: bool, format_weight: float) -> float:
    """``(1 - format_weight) * correct + format_weight * formatted``, in [0, 1]."""
    weight = check_format_weight(format_weight)
    # Same value, rearranged so the common cases are exact in floating point: correct and
    # formatted gives exactly 1.0, formatted only exactly ``format_weight``.
    return float(correct) + weight * (float(formatted) - float(correct))
