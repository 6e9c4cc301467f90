"""The built-in ``math`` reward: final-answer correctness for math and arithmetic reasoning.

Registered under the name ``math`` (the RLJob default); the verifier service calls it once per
(answer, gold) pair via :func:`~longtail_workers.rewards.registry.get_reward`, and trainers in
local mode may call :func:`math_reward` directly. It extracts the model's final answer
(``\\boxed{...}`` or an ``Answer:`` line, see ``extract.py``), normalises it and the gold answer
(``normalize.py``), compares numbers exactly as fractions and everything else as normalised
strings, and mixes in the optional format component (``result.py``).

The gold answer is taken as-is: it is *not* searched for a box or an ``Answer:`` line first,
except that a gold answer written as ``\\boxed{...}`` is unwrapped (some datasets store it so).
"""

from __future__ import annotations

from longtail_workers.rewards.extract import find_final_answer, last_boxed, require_str
from longtail_workers.rewards.normalize import normalize_answer
from longtail_workers.rewards.registry import register_reward
from longtail_workers.rewards.result import RewardResult, check_format_weight, combine


@register_reward("math")
def math_reward(answer: str, gold: str, *, format_weight: float = 0.0) -> RewardResult:
    """Score ``answer`` (full model output) against ``gold`` (the reference final answer).

    Returns ``reward = (1 - format_weight) * correct + format_weight * formatted``. Never raises
    on ``str`` inputs; raises ``TypeError`` for non-``str`` inputs and ``TypeError``/
    ``ValueError`` for a ``format_weight`` that is not a number in [0, 1].
    """
    require_str(answer, "answer")
    require_str(gold, "gold")
    weight = check_format_weight(format_weight)
    found = find_final_answer(answer)
    if found is None:
        return RewardResult(
            reward=combine(correct=False, formatted=False, format_weight=weight),
            correct=False,
            extracted=None,
            formatted=False,
        )
    correct = normalize_answer(found.text).matches(normalize_answer(gold_answer_text(gold)))
    return RewardResult(
        reward=combine(correct=correct, formatted=True, format_weight=weight),
        correct=correct,
        extracted=found.text,
        formatted=True,
    )


def gold_answer_text(gold: str) -> str:
    """The gold answer with a surrounding ``\\boxed{...}`` removed, if it is written that way."""
    require_str(gold, "gold")
    stripped = gold.strip()
    if stripped.startswith(("\\boxed", "\\fbox")) and stripped.endswith("}"):
        inner = last_boxed(stripped)
        if inner is not None:
            return inner
    return gold
