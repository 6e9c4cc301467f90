"""Exact numeric reading of answers: integers, decimals and fractions as ``fractions.Fraction``.

Called by :func:`longtail_workers.rewards.normalize.normalize_answer` after LaTeX clean-up, on
both the model's answer and the gold answer. Comparing ``Fraction`` values instead of floats
makes ``0.5``, ``1/2``, ``\\frac{1}{2}`` and ``.50`` equal while keeping ``0.3333`` different
from ``1/3`` (a reward must not depend on float rounding).

Accepted forms (after whitespace has been collapsed): ``42``, ``+42``, ``-0042``, ``1,234,567``
(thousands separators only in groups of three), ``0.50``, ``.5``, ``5.``, ``1.5e3`` (exponent of
at most three digits, so ``1e999999999`` cannot allocate a giant integer), ``3/4``,
``-(1)/(2)``, ``(-3)``. Anything else is "not a number" and is compared as a string.
"""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction

_DECIMAL = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?"
# ``re.ASCII`` so ``\d`` means 0-9 only: other scripts' digits are folded to ASCII beforehand
# by :func:`fold_unicode`, and must not reach ``Fraction`` any other way.
_PLAIN = re.compile(_DECIMAL, re.ASCII)
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?", re.ASCII)
_PARENTHESISED = re.compile(r"\( ?(" + _DECIMAL + r") ?\)", re.ASCII)
_RATIO = re.compile(
    r"(?P<sign>[+-]?) ?(?P<num>" + _DECIMAL + r") ?/ ?(?P<den>" + _DECIMAL + r")", re.ASCII
)

# Characters that mean "minus" in model output; NFKC leaves these alone.
_MINUS_SIGNS = dict.fromkeys(map(ord, "\u2212\u2796\u2013\ufe63"), "-")
# Superscript digits become ``^d`` before NFKC would turn ``x²`` into ``x2``.
_SUPERSCRIPTS = {ord(c): f"^{d}" for d, c in enumerate("⁰¹²³⁴⁵⁶⁷⁸⁹")}
_FRACTION_SLASH = {0x2044: "/"}  # NFKC turns ``½`` into ``1⁄2`` with this slash


def fold_unicode(text: str) -> str:
    """Map look-alike characters to ASCII: minus signs, full-width and non-Latin digits, ``½``.

    NFKC handles full-width forms and vulgar fractions; digits of other scripts (Arabic-Indic,
    Devanagari...) are decimal digits to ``unicodedata`` but not to NFKC, so they are mapped
    one by one.
    """
    text = text.translate(_SUPERSCRIPTS)
    text = unicodedata.normalize("NFKC", text)
    text = text.translate(_MINUS_SIGNS).translate(_FRACTION_SLASH)
    if text.isascii():
        return text
    return "".join(_ascii_digit(ch) for ch in text)


def _ascii_digit(ch: str) -> str:
    if ch.isascii() or not ch.isdecimal():
        return ch
    return str(unicodedata.decimal(ch))


def parse_number(text: str) -> Fraction | None:
    """The exact value of ``text`` if it is a plain number or a ratio of two, else ``None``.

    ``text`` should already be LaTeX-cleaned and whitespace-collapsed (see ``normalize.py``).
    Never raises: a zero denominator or an unreadable form gives ``None``.
    """
    text = text.strip()
    if text.startswith("(") and text.endswith(")"):
        # ``(1/2)``: one pair of parentheses around a whole ratio. Not ``(1,234)``: that is
        # more likely a tuple than a number with a thousands separator.
        inner = text[1:-1].strip()
        if "/" in inner and not any(c in inner for c in "(),"):
            text = inner
    text = _PARENTHESISED.sub(r"\1", text)  # ``(-1)/(2)`` -> ``-1/2``, ``(5)`` -> ``5``
    if _THOUSANDS.fullmatch(text):
        return _fraction(text.replace(",", ""))
    if _PLAIN.fullmatch(text):
        return _fraction(text)
    ratio = _RATIO.fullmatch(text)
    if ratio is None:
        return None
    num = _fraction(ratio.group("num"))
    den = _fraction(ratio.group("den"))
    if num is None or den is None or den == 0:
        return None
    value = num / den
    return -value if ratio.group("sign") == "-" else value


def _fraction(text: str) -> Fraction | None:
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        # The regexes above only admit forms Fraction reads; this is a second fence, e.g. for
        # a string over Python's int-digit limit.
        return None


def format_number(value: Fraction) -> str:
    """Canonical text of a number: ``"42"``, ``"-1/2"``; equal values give equal text."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"
