"""Answer normalisation: turn an extracted answer or a gold answer into a comparable form.

Reward functions call :func:`normalize_answer` on both sides (or :func:`answers_match` for the
pair) after :func:`~longtail_workers.rewards.extract.extract_final_answer`. The pipeline is:

1. fold look-alike Unicode to ASCII (minus sign U+2212, full-width and non-Latin digits, ``½``);
2. drop code fences / inline-code backticks around the answer;
3. clean LaTeX (``$...$``, ``\\left``/``\\right``, ``\\dfrac`` -> ``\\frac`` -> ``(a)/(b)``,
   spacing commands, degree and percent signs; see ``latex.py``);
4. drop a trailing period and a leading single-variable assignment (``x = 5`` -> ``5``);
5. drop a unit, cautiously: only a trailing ``\\text{...}`` group or one or two plain words,
   and only when what remains is a number (``12 \\text{cm}`` -> ``12``; ``\\text{yes}`` stays);
6. read the result as an exact ``Fraction`` when it is a number (see ``numbers.py``), else keep
   it as a string with whitespace collapsed and spaces around operators removed.

Two answers match when both are numbers with equal value, or otherwise when their normalised
strings are equal. Comparison is case-sensitive (``X`` and ``x`` are different variables).
Inputs longer than :data:`MAX_NORMALIZE_CHARS` skip the rewriting and are compared as
whitespace-collapsed strings, so hostile gold data or answers cannot make this expensive.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from longtail_workers.rewards.extract import require_str
from longtail_workers.rewards.latex import clean_latex, split_trailing_text, unwrap_text_groups
from longtail_workers.rewards.numbers import fold_unicode, format_number, parse_number

MAX_NORMALIZE_CHARS = 1024
"""Answers longer than this are compared as whitespace-collapsed strings, without rewriting."""

_WHITESPACE = re.compile(r"\s+")
_AROUND_OPERATOR = re.compile(r" ?([-+*/=,;:()\[\]{}^_<>|]) ?")
_BEFORE_COMMAND = re.compile(r" (?=\\)")
_ASSIGNMENT = re.compile(r"[A-Za-z](?:_\{?\w{1,8}\}?)? ?= ?(?=\S)")
# A number followed by one or two plain words: ``42 apples``, ``3.5 square meters``. Single
# letters are not units (``2 x``, ``3 i``), nor are the math words in _MATH_WORDS (``2 pi``).
_WORD_UNIT = re.compile(r"(\S{1,200}) ([A-Za-z]{2,20}(?: [A-Za-z]{2,20})?)")
_MATH_WORDS = frozenset({"pi", "sqrt", "inf", "infinity", "ln", "log", "sin", "cos", "tan"})


@dataclass(frozen=True)
class NormalizedAnswer:
    """An answer in comparable form."""

    text: str
    """Canonical text: ``format_number(value)`` for numbers, the cleaned string otherwise."""
    value: Fraction | None
    """Exact numeric value, or ``None`` when the answer is not a plain number or ratio."""

    def matches(self, other: NormalizedAnswer) -> bool:
        """True when both are equal numbers, or (otherwise) equal non-empty normalised strings.

        An answer that normalises to nothing (``"..."``, ``"$$"``) never matches, not even
        another empty one: an empty gold answer is a dataset bug, not a free reward.
        """
        if not self.text or not other.text:
            return False
        if self.value is not None and other.value is not None:
            return self.value == other.value
        return self.text == other.text


def normalize_answer(answer: str) -> NormalizedAnswer:
    """Normalise one answer (model or gold). Never raises on ``str``; ``TypeError`` otherwise."""
    require_str(answer, "answer")
    if len(answer) > MAX_NORMALIZE_CHARS:
        return NormalizedAnswer(collapse_whitespace(answer), None)
    text = fold_unicode(answer)
    text = strip_code_fence(text)
    text = clean_latex(text)
    text = _strip_trailing_periods(text)
    text = _strip_assignment(text)
    text = _drop_unit(text)
    text = collapse_whitespace(text)
    value = parse_number(text)
    if value is not None:
        return NormalizedAnswer(format_number(value), value)
    return NormalizedAnswer(tighten(text), None)


def answers_match(answer: str, gold: str) -> bool:
    """True when ``answer`` and ``gold`` normalise to the same value or string."""
    return normalize_answer(answer).matches(normalize_answer(gold))


def collapse_whitespace(text: str) -> str:
    """Runs of whitespace become one space; leading and trailing whitespace is removed."""
    return _WHITESPACE.sub(" ", text).strip()


def tighten(text: str) -> str:
    """Remove spaces that carry no meaning in math: around operators and before ``\\cmd``.

    ``x + 1`` and ``x+1`` compare equal; ``New York`` keeps its space.
    """
    text = _AROUND_OPERATOR.sub(r"\1", text)
    return _BEFORE_COMMAND.sub("", text)


def strip_code_fence(text: str) -> str:
    """Drop a surrounding code fence (with its language tag) and inline-code backticks."""
    text = text.strip()
    if text.startswith("```"):
        first_newline = text.find("\n")
        # "```python\n42\n```": the first line is the fence and its tag; "```42```": no tag.
        text = text[first_newline + 1 :] if first_newline >= 0 else text[3:]
        text = text.rstrip().removesuffix("```")
    return text.strip().strip("`").strip()


def _strip_trailing_periods(text: str) -> str:
    # A sentence-ending period: "The answer is 5." Also removes "5." (same value anyway).
    return text.rstrip().rstrip(".").rstrip()


def _strip_assignment(text: str) -> str:
    """``x = 5`` -> ``5``; only one single-letter (optionally subscripted) variable, one ``=``."""
    if text.count("=") != 1:
        return text
    match = _ASSIGNMENT.match(text.strip())
    return text.strip()[match.end() :] if match else text


def _drop_unit(text: str) -> str:
    """Drop a trailing unit when what is left is a number; unwrap ``\\text{}`` groups otherwise."""
    split = split_trailing_text(text)
    if split is not None and _is_number(split[0]):
        return split[0]
    text = unwrap_text_groups(text)
    word_unit = _WORD_UNIT.fullmatch(collapse_whitespace(text))
    if (
        word_unit is not None
        and _is_number(word_unit.group(1))
        and not _MATH_WORDS.intersection(word_unit.group(2).lower().split())
    ):
        return word_unit.group(1)
    return text


def _is_number(text: str) -> bool:
    return parse_number(collapse_whitespace(_strip_trailing_periods(text))) is not None
