"""Supervised fine-tuning (teacher forcing) of a causal LM on task items, loss on solutions only.

Used by :mod:`longtail_workers.models.builtin` to warm-start the built-in policies
(``builtin:tiny`` on builtin:arith, ``builtin:small`` on builtin:arith-long).
Each training sequence is ``prompt + solution + EOS`` tokenized exactly as RL rollout sees it
(prompt tokens as they are, no BOS, no chat template), with the loss on the solution and EOS
tokens only: the model learns to continue a prompt, never to produce one.

Batches are packed by a token budget: items are sorted by length and grouped so that each batch
holds at most ``tokens_per_batch`` padded tokens. With a long-tailed length distribution this
wastes little compute on padding, and long items get small batches instead of blowing up the
memory and time of a step. Everything is deterministic given the seed.

The fit runs where the model is. On the CPU in the model's dtype (float32 for the built-in
policies); on CUDA under bf16 autocast (float32 weights and AdamW state stay the master copy,
matmuls run in bf16) and without the padding mask (:func:`_loss`), so that SDPA can take its
causal flash kernel: that is what makes ``builtin:small`` trainable in minutes on one GPU.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from longtail_workers.models.recipe import SftConfig
from longtail_workers.tasks.arith import TaskItem

log = logging.getLogger(__name__)
IGNORE_INDEX = -100  # label of prompt and padding positions: no loss there
Encoded = tuple[list[int], int]  # (prompt + solution + EOS ids, number of prompt tokens)


def encode_items(items: Sequence[TaskItem], tokenizer: PreTrainedTokenizerBase) -> list[Encoded]:
    """Per item: (prompt + solution + EOS ids, number of prompt tokens)."""
    encoded = []
    eos = int(tokenizer.eos_token_id)
    for item in items:
        prompt = tokenizer.encode(item.prompt, add_special_tokens=False)
        solution = tokenizer.encode(item.solution, add_special_tokens=False)
        encoded.append(([*prompt, *solution, eos], len(prompt)))
    return encoded


def token_budget_batches(
    lengths: Sequence[int], tokens_per_batch: int, rng: np.random.Generator
) -> list[list[int]]:
    """Group item indices into batches of similar length, each <= tokens_per_batch padded tokens.

    An item longer than the budget gets a batch of its own. The batch order is shuffled so that
    long and short batches interleave through training.
    """
    jitter = rng.random(len(lengths))  # random tie-breaking: equal lengths mix across epochs
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], jitter[i]))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:  # ascending length: the newest item is the longest of its batch
        if current and (len(current) + 1) * lengths[i] > tokens_per_batch:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    permutation = rng.permutation(len(batches))
    return [batches[j] for j in permutation]


def collate(
    encoded: Sequence[Encoded], idx: Sequence[int], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, attention_mask, labels), each [B, L]; labels mask the prompt."""
    width = max(len(encoded[i][0]) for i in idx)
    input_ids = torch.full((len(idx), width), pad_id, dtype=torch.long)  # [B, L]
    attention_mask = torch.zeros((len(idx), width), dtype=torch.long)  # [B, L]
    labels = torch.full((len(idx), width), IGNORE_INDEX, dtype=torch.long)  # [B, L]
    for row, i in enumerate(idx):
        ids, n_prompt = encoded[i]
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        labels[row, n_prompt : len(ids)] = torch.tensor(ids[n_prompt:])
    return input_ids, attention_mask, labels


def lr_at(step: int, config: SftConfig) -> float:
    """Warm-up, stable, decay: linear warm-up, constant lr, linear decay to lr * min_lr_ratio.

    The constant phase matters: the copy circuits form in the middle of such a short fit, and a
    cosine schedule would already have cut the rate by then.
    """
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    decay_start = int(config.steps * (1.0 - config.decay_fraction))
    if step < decay_start:
        return config.lr
    progress = (step - decay_start) / max(1, config.steps - decay_start)
    return config.lr * (1.0 - (1.0 - config.min_lr_ratio) * progress)


def autocast_for(model: torch.nn.Module) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast when ``model`` is on CUDA (its weights stay as they are), else nothing."""
    device = next(model.parameters()).device
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _loss(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
) -> torch.Tensor:
    """Mean cross-entropy over solution + EOS tokens (HF shifts the labels by one inside).

    On CUDA: bf16 autocast, and no attention mask. Padding is on the right, so in a causal model
    no real token attends to a pad and the mask changes nothing the loss reads; without it SDPA
    runs its causal flash kernel instead of a masked one. On the CPU the mask is kept: the
    builtin:tiny build stays bit-identical to the builds already cached.
    """
    device = next(model.parameters()).device
    loss: torch.Tensor
    if device.type != "cuda":
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        return loss
    with autocast_for(model):
        loss = model(
            input_ids=input_ids.to(device, non_blocking=True),
            labels=labels.to(device, non_blocking=True),
        ).loss
    return loss


def _batch_stream(
    encoded: Sequence[Encoded], tokens_per_batch: int, seed: int
) -> Iterator[list[int]]:
    """Endless deterministic stream of batches, re-bucketed every epoch."""
    rng = np.random.default_rng(seed)
    lengths = [len(ids) for ids, _ in encoded]
    while True:
        yield from token_budget_batches(lengths, tokens_per_batch, rng)


def fit(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    items: Sequence[TaskItem],
    config: SftConfig,
    seed: int = 0,
    log_every: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> float:
    """Fit ``model`` on ``items`` with teacher forcing; returns the final loss (EMA over steps).

    ``on_step(step, loss_ema)`` is called after every optimizer step (progress display).
    """
    if not items:
        raise ValueError("sft.fit: no training items (pass at least one TaskItem)")
    encoded = encode_items(items, tokenizer)
    batches = _batch_stream(encoded, config.tokens_per_batch, seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, betas=(0.9, 0.98), weight_decay=config.weight_decay
    )
    pad_id = int(tokenizer.pad_token_id)
    model.train()
    ema = math.nan
    start = time.perf_counter()
    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        input_ids, attention_mask, labels = collate(encoded, next(batches), pad_id)  # [B, L] x3
        loss = _loss(model, input_ids, attention_mask, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_norm)
        optimizer.step()
        value = loss.item()
        ema = value if math.isnan(ema) else 0.95 * ema + 0.05 * value
        if on_step is not None:
            on_step(step + 1, ema)
        if log_every and (step + 1) % log_every == 0:
            elapsed = time.perf_counter() - start
            log.info("sft step %d/%d loss %.4f (%.0f s)", step + 1, config.steps, ema, elapsed)
    model.eval()
    return ema
