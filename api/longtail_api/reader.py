"""Typed field access on one hand-shaped JSON object, with error paths.

For the bodies :mod:`longtail_api.wirecodec` cannot read as one dataclass: a step row
(``steprow.py``: flat snake_case keys, ``train_<name>`` spread out), a drafter candidate's
``candidate.json`` and upload query (``longtail_workers.drafter.candidates``: snake_case keys),
a generate call's requests (``longtail_workers.wire.rollout``: the engine's request type) and
the trainer ranks' ``{"op": ...}`` commands (``longtail_workers.wire.ranks``).
Errors are :class:`~longtail_api.protocol.ProtocolError` naming the path and the value.

Pure module: standard library and ``longtail_api`` only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from longtail_api.protocol import ProtocolError


class Reader:
    """Typed field access on one JSON object, with error paths (see the module text)."""

    def __init__(self, data: object, path: str) -> None:
        if not isinstance(data, Mapping):
            raise ProtocolError(path, "must be a JSON object", data, fix="send {...}")
        self.obj: Mapping[str, Any] = data
        self.path = path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}"

    def raw(self, key: str, *, required: bool = True) -> Any:
        if key not in self.obj and required:
            raise ProtocolError(self.at(key), "is required")
        return self.obj.get(key)

    def str_(self, key: str) -> str:
        value = self.raw(key)
        if not isinstance(value, str):
            raise ProtocolError(self.at(key), "must be a string", value)
        return value

    def int_(self, key: str, *, minimum: int | None = 0, required: bool = True) -> int:
        value = self.raw(key, required=required)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(self.at(key), "must be an integer", value)
        if minimum is not None and value < minimum:
            raise ProtocolError(self.at(key), f"must be >= {minimum}", value)
        return value

    def list_(self, key: str) -> list[Any]:
        value = self.raw(key)
        if not isinstance(value, list):
            raise ProtocolError(self.at(key), "must be a JSON list", value)
        return value

    def ints(self, key: str, *, required: bool = True) -> list[int]:
        """A list of integers (token ids); absent and not ``required``: empty."""
        if not required and key not in self.obj:
            return []
        value = self.list_(key)
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int):
                raise ProtocolError(f"{self.at(key)}[{i}]", "must be an integer", item)
        return list(value)

    def opt_str(self, key: str) -> str | None:
        return None if self.obj.get(key) is None else self.str_(key)

    def opt_int(self, key: str, *, minimum: int | None = 0) -> int | None:
        if self.obj.get(key) is None:
            return None
        return self.int_(key, minimum=minimum)

    def num(self, key: str, *, minimum: float | None = None, finite: bool = True) -> float:
        """A number; ``finite=False`` lets NaN and infinities through (a diverged loss)."""
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(self.at(key), "must be a number", value)
        number = float(value)
        if finite and not math.isfinite(number):
            raise ProtocolError(self.at(key), "must be a finite number", value)
        if minimum is not None and number < minimum:
            raise ProtocolError(self.at(key), f"must be >= {minimum}", value)
        return number

    def opt_num(
        self, key: str, *, minimum: float | None = None, finite: bool = True
    ) -> float | None:
        if self.obj.get(key) is None:
            return None
        return self.num(key, minimum=minimum, finite=finite)

    def choice(self, key: str, options: tuple[str, ...]) -> Any:
        value = self.raw(key)
        if value not in options:
            raise ProtocolError(
                self.at(key), f"must be one of {', '.join(map(repr, options))}", value
            )
        return value
