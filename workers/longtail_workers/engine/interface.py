"""The rollout-engine contract: what a request asks for and what a result promises.

The rollout worker (and the GRPO step driver behind it) talks to any generation backend only
through :class:`RolloutEngine`: the native ``native/torch_engine.TorchEngine`` and the vLLM
backend ``vllm/vllm_engine.VllmEngine`` implement it. The numbers in a result are defined
here, once, because GRPO's importance ratios and the drafter trainer both depend on them:

* ``output_logprobs[i]`` is ``log_softmax(logits_i / T)[y_i]`` where ``logits_i`` are the target's
  logits that produced token ``y_i`` and ``T`` the request's temperature: the log-probability of
  the sampled token under the policy at temperature ``T``, taken BEFORE top-p truncation (so it is
  the policy's own number, comparable with a trainer-side forward at the same temperature). For a
  greedy request (``temperature == 0``) ``T`` is taken as 1: the raw policy log-probability. The
  speculative path returns the target's numbers too, never the drafter's.
* ``hidden_states[i]`` is the target's last-layer hidden state (after the final norm, i.e. what
  the LM head consumes) that produced ``y_i``: ``logits_i == lm_head(hidden_states[i])``. So
  ``hidden_states[0]`` belongs to the last prompt position.
* The stop token that ended a sequence is part of ``output_token_ids`` (GRPO needs its log-prob).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from longtail_api.fields import WIRE_NAME

if TYPE_CHECKING:
    import torch

    from longtail_workers.drafter.model import EagleDrafter
    from longtail_workers.engine.stats import RolloutMetrics, RolloutStats
    from longtail_workers.engine.target import TargetModel

FinishReason = Literal["stop", "length"]
"""``stop``: the last output token is one of the request's stop tokens; ``length``:
``max_new_tokens`` were generated."""


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to complete."""

    prompt_token_ids: Sequence[int]
    """Prompt tokens; at least one."""
    max_new_tokens: int
    """Most tokens to generate (the stop token counts)."""
    temperature: float = 1.0
    """Sampling temperature; 0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches ``top_p``."""
    seed: int | None = None
    """Seed of this request's random stream; results depend only on it (and the model), not on
    which other requests share the batch. ``None`` draws a fresh seed."""
    stop_token_ids: Sequence[int] = ()
    """Tokens that end the sequence (EOS and friends); the stop token is kept in the output."""
    return_hidden_states: bool = False
    """Also return the target's last-layer hidden states of the generated tokens."""
    request_id: str | None = field(default=None, metadata={WIRE_NAME: "id"})
    """Caller's identifier, echoed in the result."""

    def validate(self, vocab_size: int, max_positions: int | None) -> None:
        """Raise :class:`InvalidRequestError` naming the offending field when it cannot run."""
        rid, n_prompt = self.request_id, len(self.prompt_token_ids)
        if n_prompt == 0:
            raise InvalidRequestError(
                "prompt_token_ids", f"request {rid!r}: prompt_token_ids is empty; pass >= 1"
            )
        bad = [t for t in self.prompt_token_ids if not 0 <= int(t) < vocab_size]
        if bad:
            raise InvalidRequestError(
                "prompt_token_ids",
                f"request {rid!r}: prompt_token_ids {bad[:5]} outside the model's vocabulary "
                f"[0, {vocab_size})",
            )
        if self.max_new_tokens < 1:
            raise InvalidRequestError(
                "max_new_tokens",
                f"request {rid!r}: max_new_tokens={self.max_new_tokens}; must be >= 1",
            )
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise InvalidRequestError(
                "temperature",
                f"request {rid!r}: temperature={self.temperature}; must be a finite number "
                ">= 0 (0 = greedy)",
            )
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise InvalidRequestError(
                "top_p", f"request {rid!r}: top_p={self.top_p}; must be in (0, 1]"
            )
        total = n_prompt + self.max_new_tokens
        if max_positions is not None and total > max_positions:
            raise InvalidRequestError(
                "max_new_tokens",
                f"request {rid!r}: prompt ({n_prompt}) + max_new_tokens ({self.max_new_tokens}) "
                f"= {total} exceeds the model's max_position_embeddings ({max_positions}); "
                "lower max_new_tokens",
            )


class InvalidRequestError(ValueError):
    """A :class:`GenerationRequest` value the model cannot run; ``field`` names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class GenerationResult:
    """The completion of one :class:`GenerationRequest` (see the module text for definitions)."""

    request_id: str | None
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_logprobs: list[float]
    """Target log-probs of the output tokens at the request's temperature, before top-p."""
    finish_reason: FinishReason
    hidden_states: torch.Tensor | None = None
    """``[T_out, H]`` target last-layer states that produced each output token, or ``None``
    when the request did not ask for them. On the model's device, in the model's dtype."""
    spec_steps: int = 0
    """Speculative steps this sequence took part in (0 when SD never ran for it)."""
    drafted_tokens: int = 0
    """Draft tokens proposed for this sequence."""
    accepted_tokens: int = 0
    """Draft tokens the target accepted for this sequence."""


class RolloutEngine(abc.ABC):
    """A batched generation backend. Implementations: TorchEngine (native), VllmEngine.

    Besides the methods, the rollout worker reads these attributes, which every implementation
    sets in its constructor (declared here so the worker is typed against the contract, not one
    backend)."""

    target: TargetModel
    """The torch copy of the policy: the worker loads weight versions into ``target.model``, and
    drafters are built on it (its embedding and LM head)."""
    stats: RolloutStats
    """Counters of every :meth:`generate` so far (a worker's status and metrics)."""
    metrics: RolloutMetrics | None
    """Prometheus instruments the engine updates as it runs; the worker sets them, or ``None``."""
    running: int
    """Sequences being generated right now (a worker's status endpoint)."""

    @property
    @abc.abstractmethod
    def drafter(self) -> EagleDrafter | None:
        """The learned drafter the engine was last given (constructor or :meth:`set_drafter`;
        the torch engine's own copy of it), or ``None`` without one (the torch engine then
        speculates with its ``history`` strategies alone, if any). The rollout worker starts its
        spot trainer from it when it is not handed a drafter itself."""

    @property
    def waiting(self) -> int:
        """Sequences queued behind the running ones; 0 for a backend that queues internally."""
        return 0

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Complete every request; results come back in request order."""

    @abc.abstractmethod
    def set_drafter(self, drafter: EagleDrafter) -> None:
        """Draft with ``drafter`` from the next :meth:`generate` on."""

    def policy_loaded(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """The worker just loaded new weights into the engine's torch policy (``target.model``):
        an engine that holds its own copy (vLLM) takes them now, or raises."""

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release engine resources (GPU memory, worker processes)."""
