"""The target (policy) model as the engine sees it: one slot-cached forward -> (logits, hidden).

Wraps a Hugging Face causal LM (``Qwen2ForCausalLM``, Llama-style models and others whose
``get_decoder()`` returns the base model and whose output head is a plain ``nn.Linear``). The
engine calls the base model and the LM head separately because it needs the last-layer hidden
states anyway (drafter input, drafter training data) and because prefill only needs logits at the
last prompt position, not ``[B, P, V]``. At construction a probe forward checks that
``lm_head(last_hidden_state)`` reproduces the model's own logits, so a model that post-processes
logits (soft-capping, scaling) is refused instead of being sampled from wrongly.

The forward runs the model's own decoder over the engine's static slot cache
(``kvcache/slots.py``): the model's attention implementation is switched to the slot-aware one
(``kvcache/slot_attention.py``), which leaves every other use of the model unchanged.

Who uses it: the native engine's steps (:class:`TargetModel`), and every backend as the torch
copy of the policy (``RolloutEngine.target``: the worker loads weight versions into it and builds
drafters on it). :func:`response_states` recomputes the hidden states of given answers for the
vLLM engine, ``spot/sequences.py`` and ``trainer/candidate_checks.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from longtail_workers.kvcache.masks import check_attention_implementation
from longtail_workers.kvcache.slot_attention import use_slot_attention
from longtail_workers.kvcache.slots import SlotAttention, SlotKVCache


@torch.no_grad()
def response_states(
    model: nn.Module, sequences: Sequence[tuple[Sequence[int], Sequence[int]]]
) -> list[torch.Tensor]:
    """Per ``(prompt, output)`` of a causal LM ``model``: the ``[len(output), H]`` last-layer
    states (post final norm) that produced each output token (``GenerationResult.hidden_states``),
    a copy each. One uncached forward of ``prompt + output[:-1]`` per row, right-padded ``[B, W]``
    without a mask (causal: padding comes after every position read). For the vLLM engine's
    recompute, ``spot/sequences.py`` and ``trainer/candidate_checks.py``."""
    if any(len(p) == 0 for p, _ in sequences):
        raise ValueError("response_states: every sequence needs at least one prompt token")
    if not sequences:
        return []
    rows = [[*p, *o[:-1]] for p, o in sequences]
    device = next(model.parameters()).device
    ids = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long, device=device)
    for i, row in enumerate(rows):  # ids [B, W], right-padded with 0
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    decoder: Any = model.get_decoder()  # type: ignore[operator]
    hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state  # [B, W, H]
    return [
        hidden[i, len(p) - 1 : len(p) - 1 + len(o)].clone()  # [T_out, H]
        for i, (p, o) in enumerate(sequences)
    ]


class TargetModel:
    """Cached forward of the policy with explicit positions and a per-slot validity mask."""

    def __init__(self, model: nn.Module) -> None:
        if model.training:
            raise ValueError(
                "the target model is in training mode (dropout active); call model.eval() "
                "before handing it to the rollout engine"
            )
        self.model = model
        self.config: Any = model.config  # a transformers PretrainedConfig
        check_attention_implementation(self.config)
        self.decoder = model.get_decoder()  # type: ignore[operator]
        head = model.get_output_embeddings()  # type: ignore[operator]
        if not isinstance(head, nn.Linear):
            raise ValueError(
                f"the torch engine needs an nn.Linear output head; {type(model).__name__} has "
                f"{type(head).__name__}"
            )
        self.lm_head: nn.Linear = head
        self.embed_tokens: nn.Module = model.get_input_embeddings()  # type: ignore[operator]
        self.vocab_size = int(head.out_features)
        self.hidden_size = int(head.in_features)
        self.max_positions: int | None = getattr(self.config, "max_position_embeddings", None)
        self._probe()
        use_slot_attention(self.config)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @torch.no_grad()
    def _probe(self) -> None:
        ids = torch.tensor([[0, min(1, self.vocab_size - 1)]], device=self.device)
        ref = self.model(input_ids=ids, use_cache=False).logits
        mine = self.lm_head(self.decoder(input_ids=ids, use_cache=False).last_hidden_state)
        if ref.shape != mine.shape or not torch.allclose(ref, mine, rtol=1e-4, atol=1e-4):
            raise ValueError(
                f"{type(self.model).__name__}: lm_head(last_hidden_state) does not reproduce the "
                "model's logits (the model post-processes logits, e.g. soft-capping); the torch "
                "engine cannot sample from it correctly"
            )

    def new_cache(self, rows: int, length: int) -> SlotKVCache:
        return SlotKVCache(self.config, rows, length, self.device, self.dtype)

    @torch.no_grad()
    def forward(
        self, input_ids: torch.Tensor, kv: SlotKVCache, step: SlotAttention
    ) -> torch.Tensor:
        """Run ``input_ids`` ``[B, Q]`` at the slots ``step.q_pos`` ``[B, Q]`` (= positions).

        Writes the new keys/values into ``kv`` and returns the hidden states ``[B, Q, H]``
        (post-final-norm); the caller applies :meth:`logits` to the positions it needs.
        """
        kv.step = step
        out = self.decoder(
            input_ids=input_ids,
            attention_mask={"full_attention": step},
            position_ids=step.q_pos,
            past_key_values=kv,
            use_cache=True,
        )
        hidden: torch.Tensor = out.last_hidden_state  # [B, Q, H]
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head ``[..., H] -> [..., V]``."""
        out: torch.Tensor = self.lm_head(hidden)
        return out
