"""Wire types of the workers' HTTP APIs, starting with the verifier's ``POST /v1/verify``.

Both sides import these: the verifier service parses requests with ``from_dict`` and answers
with ``to_dict``; trainers and local mode build requests with ``to_dict`` and read answers with
``from_dict``. JSON keys are camelCase (``formatWeight``, ``rewardMean``), like the RLJob API.

``from_dict`` trusts nothing: it checks every field's type and range, rejects unknown keys
(suggesting the nearest known one, so ``format_weight`` is caught instead of ignored) and
raises :class:`ProtocolError` naming the field path, the bad value and the fix, e.g.
``items[3].gold: must be a string, got 5 (send the gold answer as text, e.g. "5")``. Server
limits (batch size, answer length) raise :class:`ProtocolLimitError`, which the verifier maps
to HTTP 413 while other protocol errors map to 400.

Pure module: standard library and ``longtail_api`` only.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longtail_api.validation import _NO_VALUE, show_value

VERIFY_PATH = "/v1/verify"
"""Verifier endpoint: POST a :class:`VerifyRequest`, get a :class:`VerifyResponse`."""
HEALTHZ_PATH = "/healthz"
"""Liveness: 200 ``ok`` while the process serves HTTP."""
READYZ_PATH = "/readyz"
"""Readiness: 200 ``ready`` when the worker accepts work, 503 while starting or stopping."""
METRICS_PATH = "/metrics"
"""Prometheus text exposition of the worker's metrics."""


class ProtocolError(ValueError):
    """A request or response body does not match the protocol. ``str()`` is the full message."""

    def __init__(
        self, path: str, message: str, value: Any = _NO_VALUE, fix: str | None = None
    ) -> None:
        self.path = path
        self.message = message
        self.value = value
        self.fix = fix
        text = f"{path}: {message}"
        if value is not _NO_VALUE:
            text += f", got {show_value(value)}"
        if fix:
            text += f" ({fix})"
        super().__init__(text)


class ProtocolLimitError(ProtocolError):
    """A well-formed request that is over a server limit (the verifier answers HTTP 413)."""


@dataclass(frozen=True)
class ErrorResponse:
    """Body of every non-2xx JSON answer: ``{"error": "..."}``."""

    error: str

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.error}

    @classmethod
    def from_dict(cls, data: object, path: str = "response") -> ErrorResponse:
        obj = _mapping(data, path)
        _check_keys(obj, path, ("error",))
        return cls(error=_str(obj, "error", path))


@dataclass(frozen=True)
class VerifyItem:
    """One (model answer, gold answer) pair to score."""

    answer: str
    """The model's full output; the reward function extracts the final answer from it."""
    gold: str
    """The reference final answer."""
    reward: str | None = None
    """This item's reward name, over the request's (``dataset.rewardBySource`` routes rows by
    their ``data_source``); ``None`` uses the request's."""

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"answer": self.answer, "gold": self.gold}
        if self.reward is not None:
            body["reward"] = self.reward
        return body

    @classmethod
    def from_dict(
        cls, data: object, path: str = "item", *, max_answer_chars: int | None = None
    ) -> VerifyItem:
        obj = _mapping(data, path)
        _check_keys(obj, path, ("answer", "gold", "reward"))
        answer = _str(obj, "answer", path, fix='send the model output as text, e.g. "42"')
        gold = _str(obj, "gold", path, fix='send the gold answer as text, e.g. "42"')
        reward = _reward_name(obj, _join(path, "reward"))
        if max_answer_chars is not None:
            for name, text in (("answer", answer), ("gold", gold)):
                if len(text) > max_answer_chars:
                    raise ProtocolLimitError(
                        f"{path}.{name}",
                        f"is {len(text)} characters, over the limit of {max_answer_chars}",
                        fix="truncate it, or start the verifier with a larger --max-answer-chars",
                    )
        return cls(answer=answer, gold=gold, reward=reward)


@dataclass(frozen=True)
class VerifyRequest:
    """Body of ``POST /v1/verify``."""

    items: tuple[VerifyItem, ...]
    reward: str | None = None
    """Reward function name; ``None`` means the verifier's default (``--reward``)."""
    format_weight: float = 0.0
    """Weight of the format component in [0, 1]; JSON key ``formatWeight``."""

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "items": [item.to_dict() for item in self.items],
            "formatWeight": self.format_weight,
        }
        if self.reward is not None:
            body["reward"] = self.reward
        return body

    @classmethod
    def from_dict(
        cls,
        data: object,
        *,
        max_items: int | None = None,
        max_answer_chars: int | None = None,
    ) -> VerifyRequest:
        """Parse and validate a request body; limits are the server's (``None``: no limit)."""
        obj = _mapping(data, "request")
        _check_keys(obj, "request", ("items", "reward", "formatWeight"))
        if "items" not in obj:
            raise ProtocolError(
                "items", "is required", fix='send {"items": [{"answer": "...", "gold": "..."}]}'
            )
        raw_items = obj["items"]
        if not isinstance(raw_items, list):
            raise ProtocolError(
                "items", "must be a list of {answer, gold} objects", raw_items, fix="wrap in [...]"
            )
        if max_items is not None and len(raw_items) > max_items:
            raise ProtocolLimitError(
                "items",
                f"has {len(raw_items)} items, over the batch limit of {max_items}",
                fix="split the batch, or start the verifier with a larger --max-batch",
            )
        items = tuple(
            VerifyItem.from_dict(raw, f"items[{i}]", max_answer_chars=max_answer_chars)
            for i, raw in enumerate(raw_items)
        )
        reward = _reward_name(obj, "reward")
        return cls(items=items, reward=reward, format_weight=_format_weight(obj))


@dataclass(frozen=True)
class VerifyResult:
    """The score of one item, in request order."""

    reward: float
    correct: bool
    extracted: str | None
    """The final answer found in the model output, ``null`` when there was none."""
    formatted: bool
    """Whether the output contained a well-formed final answer."""
    reason: str | None = None
    """Why the answer was not judged on its maths (no final answer, the check timed out);
    left out of the JSON when ``None``."""

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "reward": self.reward,
            "correct": self.correct,
            "extracted": self.extracted,
            "formatted": self.formatted,
        }
        if self.reason is not None:
            body["reason"] = self.reason
        return body

    @classmethod
    def from_dict(cls, data: object, path: str = "result") -> VerifyResult:
        obj = _mapping(data, path)
        _check_keys(obj, path, ("reward", "correct", "extracted", "formatted", "reason"))
        optional: dict[str, str | None] = {}
        for key in ("extracted", "reason"):
            value = obj.get(key)
            if value is not None and not isinstance(value, str):
                raise ProtocolError(f"{path}.{key}", "must be a string or null", value)
            optional[key] = value
        return cls(
            reward=_number(obj, "reward", path),
            correct=_bool(obj, "correct", path),
            extracted=optional["extracted"],
            formatted=_bool(obj, "formatted", path),
            reason=optional["reason"],
        )


@dataclass(frozen=True)
class VerifyResponse:
    """Body of a 200 answer to ``POST /v1/verify``."""

    results: tuple[VerifyResult, ...]
    reward: str
    """Name of the reward function that scored the batch."""
    reward_mean: float | None
    """Mean of the items' rewards; ``null`` for an empty batch. JSON key ``rewardMean``."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "results": [r.to_dict() for r in self.results],
            "reward": self.reward,
            "rewardMean": self.reward_mean,
        }

    @classmethod
    def from_dict(cls, data: object) -> VerifyResponse:
        obj = _mapping(data, "response")
        _check_keys(obj, "response", ("results", "reward", "rewardMean"))
        raw = obj.get("results")
        if not isinstance(raw, list):
            raise ProtocolError("results", "must be a list", raw)
        mean = obj.get("rewardMean")
        if mean is not None:
            mean = _number(obj, "rewardMean", "response")
        return cls(
            results=tuple(VerifyResult.from_dict(r, f"results[{i}]") for i, r in enumerate(raw)),
            reward=_str(obj, "reward", "response"),
            reward_mean=mean,
        )


def _join(path: str, key: str) -> str:
    # Top-level fields are named bare ("items"), nested ones with their parent ("items[3].gold").
    return key if path in ("request", "response") else f"{path}.{key}"


def _mapping(data: object, path: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ProtocolError(path, "must be a JSON object", data, fix="send {...}")
    return data


def _check_keys(obj: Mapping[str, Any], path: str, allowed: tuple[str, ...]) -> None:
    for key in obj:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
            fix = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(allowed)}"
            raise ProtocolError(_join(path, str(key)), "is not a known field", fix=fix)


def _str(obj: Mapping[str, Any], key: str, path: str, fix: str | None = None) -> str:
    if key not in obj:
        raise ProtocolError(_join(path, key), "is required", fix=fix)
    value = obj[key]
    if not isinstance(value, str):
        raise ProtocolError(_join(path, key), "must be a string", value, fix=fix)
    return value


def _bool(obj: Mapping[str, Any], key: str, path: str) -> bool:
    value = obj.get(key)
    if not isinstance(value, bool):
        raise ProtocolError(_join(path, key), "must be true or false", value)
    return value


def _number(obj: Mapping[str, Any], key: str, path: str) -> float:
    value = obj.get(key)
    # bool is an int subclass; JSON true is never a valid number here.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(_join(path, key), "must be a finite number", value)
    try:
        number = float(value)
    except OverflowError:  # a JSON integer with hundreds of digits
        number = math.inf
    if not math.isfinite(number):
        raise ProtocolError(_join(path, key), "must be a finite number", value)
    return number


def _reward_name(obj: Mapping[str, Any], path: str) -> str | None:
    reward = obj.get("reward")
    if reward is not None and (not isinstance(reward, str) or not reward):
        raise ProtocolError(
            path,
            "must be a non-empty reward name",
            reward,
            fix='e.g. "math", or leave it out for the default',
        )
    return reward


def _format_weight(obj: Mapping[str, Any]) -> float:
    if obj.get("formatWeight") is None:
        return 0.0
    weight = _number(obj, "formatWeight", "request")
    if not 0.0 <= weight <= 1.0:
        raise ProtocolError(
            "formatWeight",
            "must be in [0, 1]",
            obj["formatWeight"],
            fix="0 scores correctness only; e.g. 0.1 adds a small reward for a well-formed answer",
        )
    return weight
