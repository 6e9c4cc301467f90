"""LaTeX and markup clean-up for answers, so that equal answers written differently look equal.

Called by :func:`longtail_workers.rewards.normalize.normalize_answer` (which first bounds the
input length) on both the model's extracted answer and the gold answer. It rewrites the handful
of LaTeX idioms that models and datasets use for the same value: math-mode wrappers, ``\\left``/
``\\right``, spacing commands, ``\\dfrac``/``\\tfrac``, ``\\frac{a}{b}`` (rewritten to
``(a)/(b)`` so the number parser can read it), ``\\text{...}`` wrappers, degree and percent
signs. It is deliberately not a LaTeX parser: anything it does not recognise is left alone and
then compared as a string, which errs on the side of "not equal".

Every regular expression here is linear: no nested quantifiers, and brace groups are matched as
``[^{}]*`` (innermost only), with a fixed cap on how many times nested forms are re-scanned.
"""

from __future__ import annotations

import re

# Math-mode wrappers and escaped dollars (``\$5``: a price, not math mode). Removing every ``$``
# is safe because answers never legitimately contain a bare dollar sign after extraction.
_MATH_WRAPPERS = re.compile(r"\\\$|\$|\\\(|\\\)|\\\[|\\\]")
# ``\left(`` / ``\right)``: sizing only, keep the delimiter. The lookahead keeps ``\leftarrow``.
_SIZING = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)[lr]?(?![A-Za-z])")
# Spacing: ``\,`` ``\;`` ``\:`` ``\!`` (``1\,234`` is a thousands separator) and word spacing.
_THIN_SPACE = re.compile(r"\\[,;:!]")
_WIDE_SPACE = re.compile(r"\\(?:quad|qquad)(?![A-Za-z])|\\ |~")
_FRAC_VARIANT = re.compile(r"\\[dtc]frac(?![A-Za-z])")
_FRAC_BRACED = re.compile(r"\\frac[ \t]*\{([^{}]*)\}[ \t]*\{([^{}]*)\}")
# Shorthand that LaTeX accepts: ``\frac12``, ``\frac1{2}``, ``\frac{1}2``.
_FRAC_SHORT = re.compile(
    r"\\frac[ \t]*(?:(\d)[ \t]*(\d)|(\d)[ \t]*\{([^{}]*)\}|\{([^{}]*)\}[ \t]*(\d))"
)
_SQRT_SHORT = re.compile(r"\\sqrt[ \t]*(\d)")
_TEXT_CMD = r"\\(?:text|textrm|textbf|textit|mathrm|mathbf|mbox|operatorname)"
_TEXT_GROUP = re.compile(_TEXT_CMD + r"[ \t]*\{([^{}]*)\}")
_TRAILING_TEXT_GROUP = re.compile(_TEXT_CMD + r"[ \t]*\{([^{}]*)\}[ \t]*$")
# Only the superscript forms: a bare ``\circ`` is function composition, not degrees.
_DEGREES = re.compile(
    r"\^[ \t]*\{[ \t]*\\circ[ \t]*\}|\^[ \t]*\\circ(?![A-Za-z])|°|\\degree(?![A-Za-z])"
)
_PERCENT = re.compile(r"\\%|%")
_SINGLE_CHAR_GROUP = re.compile(r"([\^_])\{(\w)\}")  # ``x^{2}`` -> ``x^2``
_LATEX_COMMA = re.compile(r"\{,\}")  # ``1{,}234``

_MAX_NESTED_PASSES = 8
"""Nested ``\\frac`` / brace forms are rewritten innermost-first, at most this many times."""


def strip_math_wrappers(text: str) -> str:
    """Remove ``$...$``, ``\\(...\\)``, ``\\[...\\]`` wrappers and escaped dollars."""
    return _MATH_WRAPPERS.sub("", text)


def split_trailing_text(text: str) -> tuple[str, str] | None:
    """Split ``"12 \\text{cm}"`` into ``("12", "cm")``; ``None`` without a trailing text group.

    The caller decides whether the group is a unit that may be dropped (only when the head is
    a number): ``\\text{yes}`` alone or ``x \\text{ if } y`` must survive.
    """
    match = _TRAILING_TEXT_GROUP.search(text)
    if match is None:
        return None
    head = text[: match.start()].strip()
    return (head, match.group(1).strip()) if head else None


def rewrite_fracs(text: str) -> str:
    """Rewrite ``\\frac{a}{b}`` (and ``\\dfrac``, ``\\tfrac``, ``\\frac12``) as ``(a)/(b)``.

    Only innermost fractions match ``[^{}]*``, so nested ones need repeated passes; the pass
    count is capped so that hostile nesting cannot make this quadratic in practice.
    """
    text = _FRAC_VARIANT.sub(r"\\frac", text)
    text = _FRAC_SHORT.sub(_short_frac, text)
    for _ in range(_MAX_NESTED_PASSES):
        rewritten = _FRAC_BRACED.sub(
            lambda m: f"({m.group(1).strip()})/({m.group(2).strip()})", text
        )
        if rewritten == text:
            break
        text = rewritten
    return text


def _short_frac(match: re.Match[str]) -> str:
    groups = [g for g in match.groups() if g is not None]
    return f"({groups[0].strip()})/({groups[1].strip()})"


def strip_outer_braces(text: str) -> str:
    """Remove braces that wrap the whole string (``{42}`` -> ``42``), however many layers."""
    for _ in range(_MAX_NESTED_PASSES):
        if not (text.startswith("{") and text.endswith("}")) or not _wraps_whole(text):
            break
        text = text[1:-1].strip()
    return text


def _wraps_whole(text: str) -> bool:
    """True when the first ``{`` of ``text`` is closed by its last character."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i == len(text) - 1
    return False


def clean_latex(text: str) -> str:
    """Apply every LaTeX rewrite that does not depend on whether the answer is a number.

    Order matters: wrappers and sizing go first so that ``\\left(\\frac{1}{2}\\right)`` exposes
    the fraction; text groups are unwrapped after fractions so ``\\frac{\\text{a}}{2}`` works.
    """
    text = strip_math_wrappers(text)
    text = _SIZING.sub("", text)
    text = _THIN_SPACE.sub("", text)
    text = _WIDE_SPACE.sub(" ", text)
    text = _LATEX_COMMA.sub(",", text)
    text = _DEGREES.sub("", text)
    text = _PERCENT.sub("", text)
    text = _SQRT_SHORT.sub(r"\\sqrt{\1}", text)  # before fractions: ``\frac{\sqrt3}{2}``
    text = rewrite_fracs(text)
    text = _SINGLE_CHAR_GROUP.sub(r"\1\2", text)
    return strip_outer_braces(text.strip())


def unwrap_text_groups(text: str) -> str:
    """Replace ``\\text{abc}`` (and ``\\mathrm``, ``\\mbox``...) by ``abc``."""
    return _TEXT_GROUP.sub(lambda m: m.group(1), text)
