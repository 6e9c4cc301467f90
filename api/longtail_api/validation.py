"""Parse a user's dict into the typed API dataclasses, collecting every error at once.

Used by ``longtail validate``, by local mode before it starts anything, and by the operator
(which cannot rely on the cluster enforcing CEL rules). Each error names the field path in the
user's camelCase spelling, the bad value, and how to fix it, e.g.
``spec.rollout.replicas: must be >= 1, got 0``. Field-level checks come from the dataclass
types and :class:`~longtail_api.fields.Constraints`; cross-field rules live in ``rules.py``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import functools
import json
import math
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union

from longtail_api.fields import Constraints, constraints, format_number, json_name

T = TypeVar("T")

_NO_VALUE: Any = object()


@dataclass(frozen=True)
class FieldError:
    """One problem in a user's manifest."""

    path: str
    """Dotted path in the user's spelling, e.g. ``spec.rollout.replicas``."""
    message: str
    """What is wrong, phrased as the rule: ``must be >= 1``."""
    value: Any = _NO_VALUE
    """The offending value, when there is one."""
    fix: str | None = None
    """How to fix it, when the rule alone does not say."""

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}"
        if self.value is not _NO_VALUE:
            text += f", got {show_value(self.value)}"
        if self.fix:
            text += f" ({self.fix})"
        return text


def show_value(value: Any, limit: int = 60) -> str:
    """A short, YAML-flavoured rendering of a value for error messages."""
    if isinstance(value, str):
        text = repr(value)
    elif value is None or isinstance(value, bool | int | float):
        text = json.dumps(value)
    else:
        text = json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_PLAIN: dict[type, tuple[type, ...]] = {int: (int,), float: (int, float), str: (str,)}
"""Unconstrained list items read without a per-item walk: item type -> JSON types it takes
(``type(v) is``: a bool is not an int here, as in :meth:`_Parser.parse_value`)."""


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A dataclass's resolved field types, once per class (resolving them is most of a parse)."""
    return typing.get_type_hints(cls, include_extras=True)


class _Parser:
    """One parse: walks types and data together, appending to ``errors``."""

    def __init__(
        self, unknown: Literal["error", "ignore"], names: Callable[[dataclasses.Field[Any]], str]
    ) -> None:
        self.errors: list[FieldError] = []
        self.unknown = unknown
        self.names = names

    def fail(self, path: str, message: str, value: Any = _NO_VALUE, fix: str | None = None) -> Any:
        self.errors.append(FieldError(path, message, value, fix))
        return _NO_VALUE

    def parse_dataclass(self, cls: type[T], data: Any, path: str) -> Any:
        if not isinstance(data, dict):
            return self.fail(path, "must be a mapping", data)
        fields = {self.names(f): f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        for key in data:
            if key not in fields and self.unknown == "error":
                close = difflib.get_close_matches(str(key), fields, n=1, cutoff=0.6)
                hint = f"did you mean '{close[0]}'?" if close else "remove it."
                self.fail(
                    f"{path}.{key}", "unknown field", fix=f"{hint} Known: {', '.join(fields)}"
                )
        hints = _hints(cls)  # type: ignore[arg-type]
        kwargs: dict[str, Any] = {}
        complete = True
        for name, f in fields.items():
            sub = f"{path}.{name}"
            if name in data:
                value = self.parse_value(hints[f.name], data[name], sub, constraints(f))
                if value is not _NO_VALUE:
                    kwargs[f.name] = value
                    continue
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                self.fail(sub, "is required", fix=constraints(f).fix)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                complete = False  # invalid or missing required field: no default to stand in
        return cls(**kwargs) if complete else _NO_VALUE

    def parse_value(self, tp: Any, data: Any, path: str, cons: Constraints) -> Any:
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin is Annotated:  # a wire alias: Annotated[int, Constraints(minimum=0)]
            return self.parse_value(args[0], data, path, args[1])
        if origin in (Union, types.UnionType):
            return self._union(args, data, path, cons)
        if dataclasses.is_dataclass(tp):
            return self.parse_dataclass(tp, data, path)  # type: ignore[arg-type]
        if origin is Literal:
            return self._literal(args, data, path, cons)
        if origin is list or origin is collections.abc.Sequence:  # read as a list
            return self._list(args[0], data, path, cons)
        if origin is tuple and args[1:] == (...,):
            items = self._list(args[0], data, path, cons)
            return items if items is _NO_VALUE else tuple(items)
        if origin is dict:
            return self._dict(args, data, path, cons)
        if tp is bool:
            return (
                data if isinstance(data, bool) else self.fail(path, "must be true or false", data)
            )
        if tp is int:
            if isinstance(data, bool) or not isinstance(data, int):
                return self.fail(path, "must be an integer", data)
            return self._bounds(data, path, cons)
        if tp is float:
            if isinstance(data, bool) or not isinstance(data, int | float):
                return self.fail(path, "must be a number", data)
            return self._bounds(float(data), path, cons)
        if tp is str or tp is Path:  # a Path (wire bodies only) is sent as its string
            if not isinstance(data, str):
                return self.fail(path, "must be a string", data)
            text = self._string(data, path, cons)
            return Path(text) if tp is Path and text is not _NO_VALUE else text
        raise TypeError(f"{path}: unsupported annotation {tp!r} in the API model")

    def _union(self, args: tuple[Any, ...], data: Any, path: str, cons: Constraints) -> Any:
        members = [a for a in args if a is not type(None)]
        if data is None and len(members) < len(args):
            return None
        if set(members) == {int, str}:  # Kubernetes int-or-string (quantities)
            if isinstance(data, bool) or not isinstance(data, int | str):
                return self.fail(path, "must be an integer or a string", data)
            return self._string(str(data), path, cons) if data is not _NO_VALUE else data
        if len(members) != 1:
            raise TypeError(f"{path}: unsupported union {args!r} in the API model")
        return self.parse_value(members[0], data, path, cons)

    def _literal(self, options: tuple[Any, ...], data: Any, path: str, cons: Constraints) -> Any:
        if data in options and type(data) is type(options[0]):
            return data
        close = difflib.get_close_matches(str(data), [str(o) for o in options], n=1)
        fix = f"did you mean '{close[0]}'?" if close else cons.fix
        allowed = ", ".join(repr(o) for o in options)
        return self.fail(path, f"must be one of {allowed}", data, fix)

    def _list(self, item_tp: Any, data: Any, path: str, cons: Constraints) -> Any:
        if not isinstance(data, list):
            return self.fail(path, "must be a list", data)
        if cons.min_items is not None and len(data) < cons.min_items:
            return self.fail(path, f"must have at least {cons.min_items} item(s)", data, cons.fix)
        if cons.max_items is not None and len(data) > cons.max_items:
            return self.fail(path, f"must have at most {cons.max_items} items", data, cons.fix)
        if (
            isinstance(item_tp, type)
            and item_tp in _PLAIN
            and all(type(v) in _PLAIN[item_tp] for v in data)
        ):
            return [item_tp(v) for v in data]  # token ids, log-probs: no per-item walk
        items = [
            self.parse_value(item_tp, v, f"{path}[{i}]", Constraints()) for i, v in enumerate(data)
        ]
        return _NO_VALUE if any(i is _NO_VALUE for i in items) else items

    def _dict(self, args: tuple[Any, ...], data: Any, path: str, cons: Constraints) -> Any:
        if not isinstance(data, dict):
            return self.fail(path, "must be a mapping", data)
        if cons.free_form:
            return data
        key_tp, value_tp = args
        out: dict[Any, Any] = {}
        for k, v in data.items():
            key: Any = str(k)
            if key_tp is int:  # JSON keys are strings: "-1", "3"
                key = (
                    int(k)
                    if re.fullmatch(r"-?[0-9]+", key)
                    else self.fail(f"{path}.{k}", "must be keyed by an integer", k)
                )
            out[key] = self.parse_value(value_tp, v, f"{path}.{k}", Constraints())
        if any(v is _NO_VALUE for v in (*out, *out.values())):
            return _NO_VALUE
        return out

    def _bounds(self, value: float, path: str, c: Constraints) -> Any:
        if c.finite and not math.isfinite(value):
            return self.fail(path, "must be a finite number", value, c.fix)
        if c.minimum is not None and (
            value <= c.minimum if c.exclusive_minimum else value < c.minimum
        ):
            op = ">" if c.exclusive_minimum else ">="
            return self.fail(path, f"must be {op} {format_number(c.minimum)}", value, c.fix)
        if c.maximum is not None and (
            value >= c.maximum if c.exclusive_maximum else value > c.maximum
        ):
            op = "<" if c.exclusive_maximum else "<="
            return self.fail(path, f"must be {op} {format_number(c.maximum)}", value, c.fix)
        return value

    def _string(self, value: str, path: str, c: Constraints) -> Any:
        if c.min_length is not None and len(value) < c.min_length:
            word = (
                "must not be empty"
                if c.min_length == 1
                else f"must be at least {c.min_length} characters"
            )
            return self.fail(path, word, value, c.fix)
        if c.max_length is not None and len(value) > c.max_length:
            return self.fail(path, f"must be at most {c.max_length} characters", value, c.fix)
        if c.pattern is not None and not re.search(c.pattern, value):
            return self.fail(
                path, f"must be {c.pattern_hint or 'match ' + c.pattern}", value, c.fix
            )
        return value


def parse(
    cls: type[T],
    data: Any,
    path: str,
    unknown: Literal["error", "ignore"] = "error",
    names: Callable[[dataclasses.Field[Any]], str] = json_name,
) -> tuple[T | None, list[FieldError]]:
    """Parse ``data`` into ``cls``; returns the instance (``None`` when it cannot be built) and
    every field-level error found, in document order. ``unknown="ignore"`` skips keys ``cls``
    does not know (a newer peer's wire body) instead of reporting them; ``names`` gives each
    field's key (the camelCase :func:`~longtail_api.fields.json_name` unless told)."""
    parser = _Parser(unknown, names)
    result = parser.parse_dataclass(cls, data, path)
    return (None if result is _NO_VALUE else result), parser.errors
