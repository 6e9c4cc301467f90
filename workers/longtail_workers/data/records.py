"""Turning one raw dataset row into an :class:`Example`.

Every file format (jsonl, parquet) ends up with one Python ``dict`` per row; this module holds
what happens after that and is shared by all of them: looking up a (possibly dotted) key,
checking and converting the prompt and the gold answer, and the :class:`DatasetError` every
problem is reported as. Callers: :mod:`~longtail_workers.data.readers` (file rows) and
:mod:`~longtail_workers.data.loader` (built-in task items); the public names are re-exported
from ``loader`` and the package.

Errors are strict on purpose: a dataset that silently loses rows, or trains on ``None`` as a
gold answer, costs a GPU-day before anyone notices, while an error naming the row, the key and
the fix costs a minute.
"""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class DatasetError(ValueError):
    """A dataset cannot be loaded as given; the message names the file, the row and the fix."""


@dataclass(frozen=True)
class Example:
    """One training or evaluation prompt with its gold answer."""

    prompt: str
    """The user turn, before any chat template is applied."""
    answer: str
    """The gold answer the reward compares the model's final answer against."""
    index: int
    """0-based row number in the source (the record number in a jsonl file, blank lines not
    counted; the row number in a parquet file; the item number of a built-in task)."""
    system: str = ""
    """System message that came with a chat-style prompt (veRL / Eurus-2-RL files); empty for
    plain-text prompts. :func:`longtail_workers.data.prompts.format_prompt` places it."""
    source: str | None = None
    """The row's ``data_source`` (veRL files: ``openai/gsm8k``, ``lighteval/MATH``...), which
    ``dataset.rewardBySource`` routes to a reward; ``None`` when the row has no text there."""


SOURCE_KEY = "data_source"
"""Column naming a row's origin in veRL-format files; ``dataset.rewardBySource`` keys on it."""


class Missing:
    """Why a key lookup failed, in words fit for an error message."""

    def __init__(self, detail: str) -> None:
        self.detail = detail


def lookup(row: Mapping[str, Any], key: str, _parent: str = "") -> Any:
    """Value of ``key`` in ``row``; dots descend into nested objects, or a :class:`Missing`.

    A key that exists literally (dots included) wins over the nested reading, so a flat column
    named ``"a.b"`` keeps working. Otherwise the longest dotted prefix that exists is taken
    first, which resolves ``"reward_model.ground_truth"`` into the ``reward_model`` struct.
    """
    if key in row:
        return row[key]
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        head, rest = ".".join(parts[:cut]), ".".join(parts[cut:])
        if head not in row:
            continue
        inner, path = row[head], f"{_parent}{head}"
        if isinstance(inner, Mapping):
            return lookup(inner, rest, f"{path}.")
        if inner is None:
            return Missing(f"{path!r} is null")
        return Missing(f"{path!r} is a {type(inner).__name__}, not an object with key {rest!r}")
    keys = ", ".join(repr(k) for k in row) or "none"
    if _parent:
        return Missing(f"{_parent[:-1]!r} has no key {key!r} (its keys: {keys})")
    return Missing(f"no key {key!r} (keys in this row: {keys})")


_CHAT_ROLES = ("system", "user")


def to_source(row: Mapping[str, Any]) -> str | None:
    """The row's ``data_source`` text, or ``None`` (no such key, null, or not text)."""
    value = row.get(SOURCE_KEY)
    return value if isinstance(value, str) and value else None


def to_prompt(value: Any, key: str, where: str) -> tuple[str, str]:
    """Prompt text and system message from a row's prompt value.

    Plain strings are taken as they are. A list of ``{"role", "content"}`` messages (veRL,
    DAPO-Math, Eurus-2-RL parquet files) is accepted when it holds exactly one user turn and
    optional system turns: that is all a prompt for one rollout can be. Anything else is an
    error rather than ``str(value)``, which would train on a Python repr.
    """
    if isinstance(value, str):
        if not value.strip():
            raise DatasetError(f"{where}: prompt {key!r} is empty; remove the row or fix it")
        return value, ""
    if isinstance(value, list | tuple) and value and all(isinstance(m, Mapping) for m in value):
        return _messages_to_prompt(value, key, where)
    raise DatasetError(
        f"{where}: prompt {key!r} is {_describe(value)}, expected text or a list of chat "
        f"messages; set dataset.promptKey to the column holding the question text"
    )


def _messages_to_prompt(messages: Any, key: str, where: str) -> tuple[str, str]:
    roles = [m.get("role") for m in messages]
    contents = [m.get("content") for m in messages]
    if any(r not in _CHAT_ROLES for r in roles) or roles.count("user") != 1:
        raise DatasetError(
            f"{where}: prompt {key!r} is a chat with roles {roles}; Longtail supports one "
            f"'user' message plus optional 'system' messages (no few-shot assistant turns)"
        )
    if not all(isinstance(c, str) for c in contents):
        raise DatasetError(f"{where}: prompt {key!r} has a message whose 'content' is not text")
    user = contents[roles.index("user")]
    if not user.strip():
        raise DatasetError(f"{where}: prompt {key!r} has an empty user message")
    system = "\n\n".join(c for r, c in zip(roles, contents, strict=True) if r == "system")
    return user, system


# GSM8K keeps its gold answer after a "#### " marker at the end of the worked solution.
_GSM8K_MARKER = "####"
_NUMBER_WITH_COMMAS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")


def to_answer(value: Any, key: str, where: str) -> str:
    """Gold answer as text; numbers become their natural spelling (42, 0.5, not 42.0)."""
    # bool is an int subclass; "True" as a gold math answer is almost surely a wrong column.
    if isinstance(value, bool) or value is None:
        raise DatasetError(
            f"{where}: answer {key!r} is {_describe(value)}; set dataset.answerKey to the "
            f"column holding the gold answer"
        )
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float | decimal.Decimal):
        return _number_text(value, key, where)
    if isinstance(value, str):
        return _answer_text(value, key, where)
    hint = ""
    if isinstance(value, Mapping):
        fields = ", ".join(f"{key}.{k}" for k in value)
        hint = f"; point dataset.answerKey at one of its fields: {fields}"
    raise DatasetError(
        f"{where}: answer {key!r} is {_describe(value)}, expected text or a number{hint}"
    )


def _answer_text(text: str, key: str, where: str) -> str:
    if _GSM8K_MARKER in text:
        # GSM8K stores "<worked solution>\n#### 72": only the part after the marker is gold.
        # Thousands separators go too ("1,000" -> "1000"), as in veRL's GSM8K preparation.
        tail = text.rsplit(_GSM8K_MARKER, 1)[1].strip()
        if tail:
            text = tail.replace(",", "") if _NUMBER_WITH_COMMAS.match(tail) else tail
    text = text.strip()
    if not text:
        raise DatasetError(f"{where}: answer {key!r} is empty; remove the row or fix it")
    return text


def _number_text(value: float | decimal.Decimal, key: str, where: str) -> str:
    if not math.isfinite(value):
        raise DatasetError(f"{where}: answer {key!r} is {value}, not a usable gold answer")
    if isinstance(value, decimal.Decimal):
        # "72.00" in a decimal column means 72; format "f" avoids "7.2E+1".
        return format(value.normalize(), "f")
    # Parquet and pandas store integer answers in float columns once any row is null: 72.0
    # must compare equal to a model's "72". Non-integers keep Python's shortest round-trip repr.
    return str(int(value)) if value.is_integer() else repr(value)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return f"an object with keys {', '.join(repr(k) for k in value)}"
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"a {type(value).__name__} ({shown})"
