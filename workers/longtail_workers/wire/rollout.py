"""JSON form of the rollout worker's ``POST /v1/generate``: the trainer <-> rollout contract.

The step driver (``trainer/dispatch.py``) sends one :class:`GenerateCall` per worker shard;
the rollout service (``rollout/service.py``) answers with a :class:`GenerateReply`. Both sides
use these functions, so a field is spelled once. Keys are camelCase like the other worker
APIs. A call names the policy version the answers must come from: the worker loads exactly
that version before it generates (never a mix of versions within one call).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from longtail_workers.engine.interface import (
    GenerationRequest,
    GenerationResult,
    InvalidRequestError,
)

GENERATE_PATH = "/v1/generate"
WIRE_FIELDS = {
    "prompt_token_ids": "promptTokenIds",
    "max_new_tokens": "maxNewTokens",
    "temperature": "temperature",
    "top_p": "topP",
}
""":class:`GenerationRequest` field -> its key in a generate call."""


class WireError(ValueError):
    """A generate call or reply does not have the expected shape (message names the field)."""


def _get(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise WireError(f"{where}.{key}: is required")
    value = obj[key]
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise WireError(f"{where}.{key}: must be {kind}, got {type(value).__name__}")
    return value


def request_to_dict(r: GenerationRequest) -> dict[str, Any]:
    return {
        "id": r.request_id,
        "promptTokenIds": [int(t) for t in r.prompt_token_ids],
        "maxNewTokens": r.max_new_tokens,
        "temperature": r.temperature,
        "topP": r.top_p,
        "seed": r.seed,
        "stopTokenIds": [int(t) for t in r.stop_token_ids],
    }


def _token_ids(value: object, where: str) -> list[int]:
    if not isinstance(value, list):
        raise WireError(f"{where}: must be a list of token ids, got {type(value).__name__}")
    for i, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int):
            raise WireError(f"{where}[{i}]: must be an integer token id, got {t!r}")
    return list(value)


def request_from_dict(d: Mapping[str, Any], where: str) -> GenerationRequest:
    seed = d.get("seed")
    if seed is not None and not isinstance(seed, int):
        raise WireError(f"{where}.seed: must be an integer or null")
    prompt = _get(d, "promptTokenIds", list, where)
    top_p = d.get("topP", 1.0)
    if isinstance(top_p, bool) or not isinstance(top_p, int | float):
        raise WireError(f"{where}.topP: must be a number, got {type(top_p).__name__}")
    return GenerationRequest(
        prompt_token_ids=_token_ids(prompt, f"{where}.promptTokenIds"),
        max_new_tokens=int(_get(d, "maxNewTokens", int, where)),
        temperature=float(_get(d, "temperature", (int, float), where)),
        top_p=float(top_p),
        seed=seed,
        stop_token_ids=_token_ids(d.get("stopTokenIds", []), f"{where}.stopTokenIds"),
        request_id=None if d.get("id") is None else str(d["id"]),
    )


def check_call(call: GenerateCall, vocab_size: int, max_positions: int | None) -> None:
    """Refuse a call with a request this model cannot run (``GenerationRequest.validate``).

    The rollout service answers 400 with the :class:`WireError`, which names the request and
    the field as the call spells it (``body.requests[3].maxNewTokens: ...``); NaN and
    infinities are refused. The trainer then fails the job with that message
    (``trainer/dispatch.py``) instead of re-dispatching to another worker.
    """
    for i, request in enumerate(call.requests):
        try:
            request.validate(vocab_size, max_positions)
        except InvalidRequestError as exc:
            name = WIRE_FIELDS.get(exc.field, exc.field)
            raise WireError(f"body.requests[{i}].{name}: {exc}") from exc


@dataclass(frozen=True)
class GenerateCall:
    """Body of ``POST /v1/generate``."""

    step: int
    policy_version: int
    requests: Sequence[GenerationRequest]

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "policyVersion": self.policy_version,
            "requests": [request_to_dict(r) for r in self.requests],
        }

    @classmethod
    def from_dict(cls, d: object) -> GenerateCall:
        if not isinstance(d, Mapping):
            raise WireError("body: must be a JSON object {step, policyVersion, requests}")
        raw = _get(d, "requests", list, "body")
        if not raw:
            raise WireError("body.requests: must hold at least one request")
        reqs = [request_from_dict(r, f"body.requests[{i}]") for i, r in enumerate(raw)]
        return cls(
            int(_get(d, "step", int, "body")), int(_get(d, "policyVersion", int, "body")), reqs
        )


@dataclass(frozen=True)
class Sample:
    """One answer as the trainer sees it (a :class:`GenerationResult` without hidden states)."""

    request_id: str | None
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str
    spec_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    @classmethod
    def of(cls, r: GenerationResult) -> Sample:
        return cls(
            r.request_id,
            list(r.prompt_token_ids),
            list(r.output_token_ids),
            [float(x) for x in r.output_logprobs],
            r.finish_reason,
            r.spec_steps,
            r.drafted_tokens,
            r.accepted_tokens,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "promptTokenIds": self.prompt_token_ids,
            "outputTokenIds": self.output_token_ids,
            "outputLogprobs": self.output_logprobs,
            "finishReason": self.finish_reason,
            "specSteps": self.spec_steps,
            "draftedTokens": self.drafted_tokens,
            "acceptedTokens": self.accepted_tokens,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> Sample:
        out = [int(t) for t in _get(d, "outputTokenIds", list, where)]
        logprobs = [float(x) for x in _get(d, "outputLogprobs", list, where)]
        if len(out) != len(logprobs):
            raise WireError(f"{where}: {len(out)} output tokens but {len(logprobs)} log-probs")
        return cls(
            None if d.get("id") is None else str(d["id"]),
            [int(t) for t in _get(d, "promptTokenIds", list, where)],
            out,
            logprobs,
            str(d.get("finishReason", "stop")),
            int(d.get("specSteps", 0)),
            int(d.get("draftedTokens", 0)),
            int(d.get("acceptedTokens", 0)),
        )


@dataclass(frozen=True)
class GenerateReply:
    """Body of a 200 answer: samples in request order plus the engine's figures for the call."""

    worker: str
    policy_version: int
    drafter_version: int
    samples: list[Sample]
    engine: dict[str, float] = field(default_factory=dict)
    """``seconds``, ``decodeSteps``, ``sdSteps``, ``tokens``, ``sdTokens``,
    ``meanAcceptedLength`` (0 when SD never ran) of this call, and ``policyLoadSeconds``: the
    rollout pause the call spent obtaining and loading the policy version it names (0 when
    the worker held it; the trainer books it, ``trainer/syncbook.py``)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "policyVersion": self.policy_version,
            "drafterVersion": self.drafter_version,
            "samples": [s.to_dict() for s in self.samples],
            "engine": self.engine,
        }

    @classmethod
    def from_dict(cls, d: object) -> GenerateReply:
        if not isinstance(d, Mapping):
            raise WireError("reply: must be a JSON object")
        raw = _get(d, "samples", list, "reply")
        engine = d.get("engine") or {}
        if not isinstance(engine, Mapping):
            raise WireError("reply.engine: must be a JSON object")
        return cls(
            str(_get(d, "worker", str, "reply")),
            int(_get(d, "policyVersion", int, "reply")),
            int(_get(d, "drafterVersion", int, "reply")),
            [Sample.from_dict(s, f"reply.samples[{i}]") for i, s in enumerate(raw)],
            {str(k): float(v) for k, v in engine.items()},
        )
