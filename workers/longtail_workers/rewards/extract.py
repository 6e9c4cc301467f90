"""Final-answer extraction: find the answer a model committed to inside its free-form output.

Reward functions (``math_reward.py`` and user-registered ones) call :func:`extract_final_answer`
on every rollout answer before comparing it with the gold answer. Two conventions are
recognised, in this order of precedence:

1. ``\\boxed{...}`` (also ``\\fbox{...}``): the LAST balanced, non-empty box wins, so a model
   that revises itself is scored on its final word. Nested braces are matched; LaTeX escaped
   braces ``\\{`` / ``\\}`` do not count as structure. A box whose braces never close is ignored.
2. An ``Answer:`` line (case-insensitive, optionally ``Final answer:``, markdown bold or a
   heading marker in front): the LAST such line with a non-empty value wins.

Model output is untrusted and can be adversarial, so the work is bounded: only the last
:data:`MAX_SCAN_CHARS` characters are looked at (final answers live at the end), every pass is a
single linear scan, and no regular expression here can backtrack catastrophically. The functions
never raise on ``str`` input; they raise ``TypeError`` for anything else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

MAX_SCAN_CHARS = 4096
"""How many trailing characters of an answer are searched for the final answer."""

AnswerSource = Literal["boxed", "answer_line"]

# One token per match: an escaped brace (ignored), a box opener, or a plain brace. The regex has
# no nested quantifiers, so it runs in linear time; ``[ \t]*`` is bounded by the scan window.
_BOX_TOKENS = re.compile(r"\\[{}]|\\(?:boxed|fbox)[ \t]*\{|[{}]")

# ``Answer: 42``, ``**Final Answer:** 42``, ``## answer: x = 3``. Anchored at line start with
# MULTILINE, and the character classes around the colon cannot cross a newline.
_ANSWER_LINE = re.compile(
    r"^[ \t>#*_`-]*(?:final[ \t]+)?answer[ \t*_]*[:：][ \t*_]*(?P<value>[^\n]*)$",
    re.IGNORECASE | re.MULTILINE,
)


@dataclass(frozen=True)
class ExtractedAnswer:
    """A final answer found in model output, and which convention it came from."""

    text: str
    """The answer text, stripped of surrounding whitespace; never empty."""
    source: AnswerSource
    """``"boxed"`` for ``\\boxed{...}``, ``"answer_line"`` for an ``Answer:`` line."""


def require_str(value: object, name: str) -> str:
    """Return ``value`` if it is a ``str``; raise a ``TypeError`` naming the argument otherwise."""
    if not isinstance(value, str):
        raise TypeError(
            f"{name}: must be a str, got {type(value).__name__} {value!r:.60} "
            f"(decode bytes with .decode('utf-8') and pass text)"
        )
    return value


def find_final_answer(text: str) -> ExtractedAnswer | None:
    """The model's final answer with its source, or ``None`` when it gave no recognisable one."""
    require_str(text, "text")
    window = text[-MAX_SCAN_CHARS:]
    boxed = last_boxed(window)
    if boxed is not None:
        return ExtractedAnswer(boxed, "boxed")
    line = last_answer_line(window)
    if line is not None:
        return ExtractedAnswer(line, "answer_line")
    return None


def extract_final_answer(text: str) -> str | None:
    """The text of the model's final answer, or ``None`` when there is none.

    Examples: ``"so it is \\boxed{42}."`` gives ``"42"``; ``"...\\nAnswer: x = 3"`` gives
    ``"x = 3"``; ``"I am not sure"`` gives ``None``.
    """
    found = find_final_answer(text)
    return None if found is None else found.text


def last_boxed(text: str) -> str | None:
    """Content of the last balanced, non-empty ``\\boxed{...}`` in ``text``, or ``None``.

    One left-to-right pass keeps a stack of open braces, each remembering whether it opened a
    box; a box is recorded when its own closing brace is reached. "Last" means the box that
    closes last, so for ``\\boxed{a \\boxed{b}}`` the outer box wins. Stray closing braces are
    ignored rather than popping an unrelated opener (models often emit unbalanced LaTeX).
    """
    require_str(text, "text")
    stack: list[int] = []  # for each open brace: content start if it opened a box, else -1
    best: str | None = None
    for match in _BOX_TOKENS.finditer(text):
        token = match.group()
        if token.startswith("\\") and len(token) == 2:  # escaped brace: literal, not structure
            continue
        if token == "}":
            if not stack:
                continue
            start = stack.pop()
            if start >= 0:
                content = text[start : match.start()].strip()
                if content:
                    best = content
        elif token == "{":
            stack.append(-1)
        else:  # a box opener, which includes its "{"
            stack.append(match.end())
    return best


def last_answer_line(text: str) -> str | None:
    """Value of the last ``Answer: ...`` line with a non-empty value, or ``None``.

    Markdown decoration that models add around the value (bold markers, inline code backticks)
    is trimmed here; the rest is prepare.py's and math-verify's job.
    """
    require_str(text, "text")
    best: str | None = None
    for match in _ANSWER_LINE.finditer(text):
        value = _trim_decoration(match.group("value"))
        if value:
            best = value
    return best


def _trim_decoration(value: str) -> str:
    """Strip whitespace, markdown emphasis and inline-code backticks around an answer value."""
    return value.strip("*_` \t\r")
