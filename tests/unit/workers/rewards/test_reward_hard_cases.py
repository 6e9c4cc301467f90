"""The ``math`` reward against hard cases whose verdicts were written by hand from the maths.

Cases and conventions: ``reward_hard_cases.py``. Each case must get its hand verdict, except the
known disagreements (math-verify is wrong by the maths there, explained in that file): those
are strict xfails, so a math-verify upgrade that fixes one shows up here and the mark goes.
"""

from __future__ import annotations

import pytest
from reward_hard_cases import CASES, KNOWN_DISAGREEMENTS, Case

from longtail_workers.rewards import math_reward


def _param(case: Case) -> object:
    why = KNOWN_DISAGREEMENTS.get(case.id)
    marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
    return pytest.param(case, id=case.id, marks=marks)


def test_the_set_is_large_and_mixed() -> None:
    assert len(CASES) >= 100
    assert len({c.id for c in CASES}) == len(CASES)
    assert set(KNOWN_DISAGREEMENTS) <= {c.id for c in CASES}
    assert sum(not c.expected for c in CASES) >= 30  # wrong answers too, not only rewrites
    assert {c.category for c in CASES} >= {
        "fraction", "LaTeX form", "unit", "interval", "set", "percentage",
    }  # fmt: skip


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_hand_verdict(case: Case) -> None:
    result = math_reward(case.output, case.gold)
    assert result.formatted, "every hard case has a final answer"
    assert result.reason is None, result.reason  # judged on its maths, not given up
    assert result.correct is case.expected
