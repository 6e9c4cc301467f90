"""From finished rollouts to the tensors of one GRPO update.

The step driver (``trainer/driver.py``) and ``bench/grpo_feasibility.py`` call
:func:`build_grpo_batch` with the rollout results (prompt ids, output ids, the engine's
log-probs of the output tokens, see ``engine/interface.py``) and one advantage per answer.
Rows are right-padded: ``sequence_logprobs`` takes position ids from the attention mask, so the
side of the padding does not change any number. Column ``t`` of ``old_logprobs`` holds the
rollout log-prob of token ``t``, the convention of :mod:`longtail_workers.trainer.grpo`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from longtail_workers.trainer.batch import GrpoBatch


class RolloutSample(Protocol):
    """What a rollout result must carry (``GenerationResult`` or its JSON twin)."""

    @property
    def prompt_token_ids(self) -> Sequence[int]: ...

    @property
    def output_token_ids(self) -> Sequence[int]: ...

    @property
    def output_logprobs(self) -> Sequence[float]: ...


def build_grpo_batch(
    samples: Sequence[RolloutSample], advantages: Sequence[float], pad_id: int
) -> GrpoBatch:
    """One :class:`GrpoBatch` row per sample (prompt + output, right-padded with ``pad_id``)."""
    if len(samples) != len(advantages):
        raise ValueError(
            f"build_grpo_batch: {len(samples)} samples but {len(advantages)} advantages; "
            "pass one advantage per answer"
        )
    if not samples:
        raise ValueError("build_grpo_batch: no samples")
    width = max(len(s.prompt_token_ids) + len(s.output_token_ids) for s in samples)
    n = len(samples)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)  # [B, T]
    attention = torch.zeros((n, width), dtype=torch.long)  # [B, T]
    response = torch.zeros((n, width), dtype=torch.long)  # [B, T]
    old = torch.zeros((n, width), dtype=torch.float32)  # [B, T]
    for row, s in enumerate(samples):
        p, o = len(s.prompt_token_ids), len(s.output_token_ids)
        if p == 0:
            raise ValueError(f"build_grpo_batch: sample {row} has an empty prompt")
        if len(s.output_logprobs) != o:
            raise ValueError(
                f"build_grpo_batch: sample {row} has {o} output tokens but "
                f"{len(s.output_logprobs)} log-probs; the rollout result is inconsistent"
            )
        input_ids[row, : p + o] = torch.tensor([*s.prompt_token_ids, *s.output_token_ids])
        attention[row, : p + o] = 1
        response[row, p : p + o] = 1
        if o:
            old[row, p : p + o] = torch.tensor(list(s.output_logprobs), dtype=torch.float32)
    return GrpoBatch(
        input_ids=input_ids,
        attention_mask=attention,
        response_mask=response,
        old_logprobs=old,
        advantages=torch.tensor(list(advantages), dtype=torch.float32),
    )
