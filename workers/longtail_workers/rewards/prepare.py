"""Clean-up of a final answer before math-verify reads it: only what math-verify does not do.

``math_reward.py`` calls :func:`prepare_answer` on the extracted model answer and on the gold
answer. math-verify (``mathcheck.py``) parses LaTeX and plain expressions into sympy and handles
fractions, ``\\dfrac``, ``\\left``, ``\\text{}`` units, ``^\\circ``, ``\\%``, thousands commas,
sets, intervals and assignments (``x = 5``) itself. It does not read look-alike Unicode: a
full-width ``４２``, Arabic-Indic ``٤٢``, ``½``, ``x²`` or ``90°`` come back unparsed and only
ever equal the identical string. Models write those, so they are folded to ASCII or LaTeX here.
A sentence-ending period (``Answer: 42.``) also defeats its parser and is dropped. Plain words
after a number (``Answer: 21 in total``, ``7 dogs``) are read as a product of one-letter
symbols unless math-verify knows the unit, so they are wrapped in ``\text{}``, which it drops.
"""

from __future__ import annotations

import re
import unicodedata

# Characters that mean "minus" in model output; NFKC leaves these alone.
_MINUS_SIGNS = dict.fromkeys(map(ord, "\u2212\u2796\u2013\ufe63"), "-")
# Superscript digits become ``^d`` before NFKC would turn ``x²`` into ``x2``.
_SUPERSCRIPTS = {ord(c): f"^{d}" for d, c in enumerate("⁰¹²³⁴⁵⁶⁷⁸⁹")}
# NFKC turns ``½`` into ``1⁄2`` with U+2044 FRACTION SLASH; the degree sign has a LaTeX form.
_AFTER_NFKC = {0x2044: "/", ord("°"): "^\\circ"}


# A plain number and one to three plain words: ``21 in total``, ``3.5 square meters``. One
# letter is a variable, not a unit (``2 x``), and the words in _MATH_WORDS are maths (``2 pi``).
_WORD_UNIT = re.compile(
    r"([+-]?(?:\d[\d,]{0,30}(?:\.\d{0,30})?|\.\d{1,30})) ([A-Za-z]{2,20}(?: [A-Za-z]{2,20}){0,2})",
    re.ASCII,
)
_MATH_WORDS = frozenset(
    {"pi", "sqrt", "inf", "infty", "infinity", "ln", "log", "sin", "cos", "tan", "or", "and"}
)


def prepare_answer(text: str) -> str:
    """``text`` stripped, Unicode look-alikes folded, a trailing sentence period dropped, plain
    words after a number marked as text."""
    text = _strip_trailing_periods(fold_unicode(text).strip())
    unit = _WORD_UNIT.fullmatch(text)
    if unit is not None and not _MATH_WORDS.intersection(unit.group(2).lower().split()):
        return f"{unit.group(1)}\\text{{ {unit.group(2)}}}"
    return text


def fold_unicode(text: str) -> str:
    """Map look-alike characters to ASCII or LaTeX: minus signs, full-width and non-Latin
    digits, vulgar fractions, superscript digits, the degree sign.

    NFKC handles full-width forms and vulgar fractions; digits of other scripts (Arabic-Indic,
    Devanagari...) are decimal digits to ``unicodedata`` but not to NFKC, so they are mapped
    one by one.
    """
    if text.isascii():
        return text
    text = text.translate(_SUPERSCRIPTS)
    text = unicodedata.normalize("NFKC", text)
    text = text.translate(_MINUS_SIGNS).translate(_AFTER_NFKC)
    return "".join(_ascii_digit(ch) for ch in text)


def _ascii_digit(ch: str) -> str:
    if ch.isascii() or not ch.isdecimal():
        return ch
    return str(unicodedata.decimal(ch))


def _strip_trailing_periods(text: str) -> str:
    # "The answer is 5." and "5." (the same value anyway); "..." becomes empty: no answer.
    return text.rstrip(".").rstrip()
