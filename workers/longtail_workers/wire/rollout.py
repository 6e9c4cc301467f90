"""JSON form of the rollout worker's ``POST /v1/generate``: the trainer <-> rollout contract.

The step driver (``trainer/dispatch.py``) sends one :class:`GenerateCall` per worker shard;
the rollout service (``rollout/service.py``) answers with a :class:`GenerateReply`. Both sides
use these functions, so a field is spelled once. Keys are camelCase like the other worker
APIs. A call names the policy version the answers must come from: the worker loads exactly
that version before it generates (never a mix of versions within one call).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from longtail_api.fields import WIRE_NAME
from longtail_api.protocol import ProtocolError
from longtail_api.reader import Reader
from longtail_api.wirecodec import Count, NonNegative
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


def request_from_dict(d: object, where: str) -> GenerationRequest:
    r = Reader(d, where)
    return GenerationRequest(
        prompt_token_ids=r.ints("promptTokenIds"),
        max_new_tokens=r.int_("maxNewTokens", minimum=None),
        temperature=r.num("temperature"),
        top_p=r.num("topP") if "topP" in r.obj else 1.0,
        seed=r.opt_int("seed", minimum=None),
        stop_token_ids=r.ints("stopTokenIds", required=False),
        request_id=None if r.obj.get("id") is None else str(r.obj["id"]),
    )


def check_call(call: GenerateCall, vocab_size: int, max_positions: int | None) -> None:
    """Refuse a call with a request this model cannot run (``GenerationRequest.validate``).

    The rollout service answers 400 with the :class:`ProtocolError`, which names the request and
    the field as the call spells it (``body.requests[3].maxNewTokens: ...``); NaN and
    infinities are refused. The trainer then fails the job with that message
    (``trainer/dispatch.py``) instead of re-dispatching to another worker.
    """
    for i, request in enumerate(call.requests):
        try:
            request.validate(vocab_size, max_positions)
        except InvalidRequestError as exc:
            name = WIRE_FIELDS.get(exc.field, exc.field)
            raise ProtocolError(f"body.requests[{i}].{name}", str(exc)) from exc


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
        r = Reader(d, "body")
        raw = r.list_("requests")
        if not raw:
            raise ProtocolError("body.requests", "must hold at least one request")
        reqs = [request_from_dict(q, f"body.requests[{i}]") for i, q in enumerate(raw)]
        return cls(r.int_("step", minimum=None), r.int_("policyVersion", minimum=None), reqs)


@dataclass(frozen=True)
class Sample:
    """One answer as the trainer sees it (a :class:`GenerationResult` without hidden states)."""

    request_id: str | None = field(metadata={WIRE_NAME: "id"})
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_logprobs: list[float]
    """One per output token."""
    finish_reason: str = "stop"
    spec_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    def __post_init__(self) -> None:
        out, logprobs = len(self.output_token_ids), len(self.output_logprobs)
        if out != logprobs:
            raise ProtocolError(
                f"sample {self.request_id}", f"{out} output tokens but {logprobs} log-probs"
            )

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


@dataclass(frozen=True)
class EngineDelta:
    """The engine's figures for one generate call (``GenerateReply.engine``): the step driver
    sums them into the step's row (``trainer/driver.py``) and the sync book
    (``trainer/syncbook.py``) books :attr:`policy_load_seconds`."""

    seconds: NonNegative = 0.0
    """Wall time the call spent generating."""
    decode_steps: Count = 0
    """Engine steps of the call."""
    sd_steps: Count = 0
    """Of those, steps that ran speculative decoding."""
    tokens: Count = 0
    """Tokens generated."""
    sd_tokens: Count = 0
    """Of those, tokens generated by speculative steps."""
    mean_accepted_length: NonNegative = 0.0
    """Mean accepted length over :attr:`accepted_rows` (0 when SD never ran)."""
    accepted_rows: Count = 0
    """Speculative rows whose accepted length was counted."""
    policy_load_seconds: NonNegative = 0.0
    """The rollout pause the call spent obtaining and loading the policy version it names (0
    when the worker held it)."""


@dataclass(frozen=True)
class GenerateReply:
    """Body of a 200 answer: samples in request order plus the engine's figures for the call;
    JSON by ``longtail_api.wirecodec`` (``from_wire(GenerateReply, body, "reply")``)."""

    worker: str
    policy_version: int
    drafter_version: int
    samples: list[Sample]
    engine: EngineDelta = field(default_factory=EngineDelta)
