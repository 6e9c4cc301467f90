"""The host-side record of one request while it waits, runs and after it finishes.

Created by :class:`~longtail_workers.engine.native.torch_engine.TorchEngine` for every request,
queued by the scheduler, and placed in a row of the running batch (``rows.py``) while it decodes.
The device holds what steps need (tokens, caches, hidden states, sampling settings); this record
holds what the caller gets back: the output tokens and log-probs the engine copies out after
every step, the finish reason, the SD counters, the hidden states copied out when it retires,
and the answer's handle in the history drafter's index (``history.py``) when the engine has one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from longtail_workers.engine.interface import FinishReason, GenerationRequest, GenerationResult
from longtail_workers.engine.sampling import seed_bits

if TYPE_CHECKING:
    from longtail_workers.engine.native.history import HistoryAnswer


@dataclass
class SequenceState:
    """Host-side record of one request (see the module text)."""

    index: int
    request: GenerationRequest
    seed: int
    """The request's seed (or a random one), any int; its low 64 bits key its random stream."""
    keep_hidden: bool
    """Keep the target hidden states of the generated tokens (drafter or
    ``return_hidden_states``)."""
    prompt: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    hidden: torch.Tensor | None = None
    """``[len(output), H]`` states ``h_{P-1} ..``, copied out when the row retires (when asked)."""
    spec_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    history: HistoryAnswer | None = None
    """This answer in the history drafter's index (engines with history strategies)."""

    @property
    def seed_bits(self) -> int:
        return seed_bits(self.seed)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    def result(self) -> GenerationResult:
        assert self.finish_reason is not None
        return GenerationResult(
            request_id=self.request.request_id,
            prompt_token_ids=list(self.prompt),
            output_token_ids=list(self.output),
            output_logprobs=list(self.logprobs),
            finish_reason=self.finish_reason,
            hidden_states=self.hidden if self.request.return_hidden_states else None,
            spec_steps=self.spec_steps,
            drafted_tokens=self.drafted,
            accepted_tokens=self.accepted,
        )
