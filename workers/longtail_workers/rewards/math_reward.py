"""The built-in ``math`` reward: final-answer correctness for math and arithmetic reasoning.

Registered under the name ``math`` (the RLJob default); the verifier service calls it once per
(answer, gold) pair via :func:`~longtail_workers.rewards.registry.get_reward`, and trainers in
local mode may call :func:`math_reward` directly. It extracts the model's final answer
(``\\boxed{...}`` or an ``Answer:`` line, see ``extract.py``), folds look-alike Unicode on both
sides (``prepare.py``), has math-verify judge equivalence in a checker process under a time
limit per answer (``checker.py``, ``mathcheck.py``), and mixes in the optional format component
(``result.py``).

The gold answer is taken as-is: it is *not* searched for a box or an ``Answer:`` line first,
except that a gold answer written as ``\\boxed{...}`` is unwrapped (some datasets store it so).
"""

from __future__ import annotations

import logging

from longtail_workers.rewards.checker import Verdict, math_checker
from longtail_workers.rewards.extract import find_final_answer, last_boxed, require_str
from longtail_workers.rewards.prepare import prepare_answer
from longtail_workers.rewards.registry import register_reward
from longtail_workers.rewards.result import RewardResult, check_format_weight, combine

log = logging.getLogger(__name__)

MAX_CHECK_CHARS = 1024
"""Answers (or gold answers) longer than this are compared as whitespace-collapsed text
instead of being parsed: a final answer is short, and parsing cost grows with length."""


@register_reward("math")
def math_reward(answer: str, gold: str, *, format_weight: float = 0.0) -> RewardResult:
    """Score ``answer`` (full model output) against ``gold`` (the reference final answer).

    Returns ``reward = (1 - format_weight) * correct + format_weight * formatted``; ``reason``
    says why an answer was not judged on its maths (no final answer, math-verify gave up).
    Never raises on ``str`` inputs; raises ``TypeError`` for non-``str`` inputs and
    ``TypeError``/``ValueError`` for a ``format_weight`` that is not a number in [0, 1].
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
            reason="no final answer: no \\boxed{...} or Answer: line at the end of the output",
        )
    verdict = answers_match_verdict(found.text, gold_answer_text(gold))
    return RewardResult(
        reward=combine(correct=verdict.correct, formatted=True, format_weight=weight),
        correct=verdict.correct,
        extracted=found.text,
        formatted=True,
        reason=verdict.reason,
    )


def answers_match(answer: str, gold: str) -> bool:
    """True when math-verify finds the final-answer text ``answer`` equal to ``gold``."""
    return answers_match_verdict(answer, gold).correct


def answers_match_verdict(answer: str, gold: str) -> Verdict:
    """:func:`answers_match` with the reason when no verdict on the maths was reached."""
    require_str(answer, "answer")
    require_str(gold, "gold")
    answer, gold = prepare_answer(answer), prepare_answer(gold)
    if not answer or not gold:
        # An empty gold answer is a dataset bug, not a free reward for an empty answer.
        side = "answer" if not answer else "gold answer"
        return Verdict(False, f"the {side} is empty after clean-up")
    if max(len(answer), len(gold)) > MAX_CHECK_CHARS:
        same = " ".join(answer.split()) == " ".join(gold.split())
        return Verdict(
            same,
            f"over {MAX_CHECK_CHARS} characters: compared as text, not parsed "
            f"(answer {len(answer)}, gold {len(gold)} characters)",
        )
    verdict = math_checker().check(gold, answer)
    if verdict.reason is not None:
        log.warning("math reward: %s (answer %.80r, gold %.80r)", verdict.reason, answer, gold)
    return verdict


def gold_answer_text(gold: str) -> str:
    """The gold answer with a surrounding ``\\boxed{...}`` removed, if it is written that way."""
    require_str(gold, "gold")
    stripped = gold.strip()
    if stripped.startswith(("\\boxed", "\\fbox")) and stripped.endswith("}"):
        inner = last_boxed(stripped)
        if inner is not None:
            return inner
    return gold
