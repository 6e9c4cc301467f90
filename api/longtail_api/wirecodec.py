"""The one JSON codec of the typed bodies that cross processes: dataclass <-> camelCase JSON.

:func:`to_wire` writes a dataclass (the operator's RLJob status, every worker status and
answer in ``workerapi.py``/``drafterstatus.py``, the workers' ``wire/`` bodies) as JSON;
:func:`from_wire` reads it back with the RLJob API's parser (``validation.parse``: the field
types and their :class:`~longtail_api.fields.Constraints` are the checks) and raises
:class:`~longtail_api.protocol.ProtocolError` naming the path and the value
(``status.drafterTraining.buffer.tokens: must be an integer, got 'x'``). Keys a body's class
does not know are ignored on purpose: the operator and the workers are upgraded independently,
and an older reader must keep reading a newer peer's body. A field's JSON name is its camelCase
name unless it declares another (``field(metadata={WIRE_NAME: "id"})``).

Pure module: standard library and ``longtail_api`` only.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, TypeVar

from longtail_api.fields import WIRE_NAME, Constraints, json_name
from longtail_api.protocol import ProtocolError
from longtail_api.validation import parse

T = TypeVar("T")
__all__ = [
    "WIRE_NAME",
    "Count",
    "Finite",
    "Fraction",
    "NonNegative",
    "Version",
    "from_wire",
    "to_wire",
]

Count = Annotated[int, Constraints(minimum=0)]
"""An integer >= 0 (tokens, steps, versions)."""
Finite = Annotated[float, Constraints(finite=True)]
"""A number, not NaN or infinite (a loss that may diverge is a plain ``float``)."""
NonNegative = Annotated[float, Constraints(minimum=0, finite=True)]
"""A finite number >= 0 (durations, Unix times, rates)."""
Fraction = Annotated[float, Constraints(minimum=0, maximum=1, finite=True)]
"""A number in [0, 1]."""
Version = Annotated[int, Constraints(minimum=-1)]
"""A drafter version: -1 for the unpublished initial drafter."""


def to_wire(obj: Any) -> Any:
    """A dataclass (or list/tuple/dict of them) as camelCase JSON, ``None`` kept as null."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {json_name(f): to_wire(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [to_wire(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_wire(v) for k, v in obj.items()}
    return obj


def from_wire(cls: type[T], data: Any, path: str, *, snake_case: bool = False) -> T:
    """``data`` read as ``cls`` (unknown keys ignored); :class:`ProtocolError` (a ValueError)
    names the first bad field, with up to two more after it. ``snake_case``: the keys are the
    fields' Python names (files written with ``dataclasses.asdict``: a step row, a candidate)."""
    names = (lambda f: f.name) if snake_case else json_name
    obj, errors = parse(cls, data, path, unknown="ignore", names=names)
    if errors:
        first = errors[0]
        exc = ProtocolError(first.path, first.message, first.value, first.fix)
        if len(errors) > 1:
            exc.args = ("; ".join([str(exc), *map(str, errors[1:3])]),)
        raise exc
    assert obj is not None
    return obj
