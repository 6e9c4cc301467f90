"""Greedy accuracy of a causal LM on task items, with batched ``model.generate``.

A deliberately plain helper: the built-in policies' build uses it to measure the accuracy it
records in ``longtail_build.json``, and ``bench/tiny_model.py`` reports it. The rollout engine
(a separate module) is the fast path for RL; this one only needs to be correct and simple. It
runs where the model is (on CUDA under bf16 autocast).

Batching: items are sorted by gold solution length so that each batch generates roughly as many
tokens as its longest member needs, prompts are left-padded, and generation stops at EOS or at
the longest gold solution of the batch plus a margin (a longer answer could only be wrong or
padded with extra lines, and unbounded greedy loops on 2 CPU cores are what we avoid).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from longtail_workers.models.sft import autocast_for
from longtail_workers.rewards import get_reward
from longtail_workers.tasks.arith import TaskItem

AnswerCheck = Callable[[str, str], bool]  # (completion, gold answer) -> correct


def math_correct(completion: str, gold: str) -> bool:
    """The verifier's own check: the ``math`` reward's exact final-answer match."""
    return get_reward("math")(completion, gold).correct


@dataclass
class EvalResult:
    """Outcome of a greedy evaluation."""

    accuracy: float
    n: int
    correct: int
    by_size: dict[int, tuple[int, int]] = field(default_factory=dict)  # size -> (correct, n)
    completions: list[str] = field(default_factory=list)  # in the order of the input items


def _solution_lengths(items: Sequence[TaskItem], tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Tokens in each gold solution, EOS included."""
    return [len(tokenizer.encode(it.solution, add_special_tokens=False)) + 1 for it in items]


@torch.no_grad()
def generate_greedy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    max_new_tokens: int,
) -> list[str]:
    """Greedy completions of ``prompts`` (one left-padded batch), special tokens stripped."""
    device = next(model.parameters()).device
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
    input_ids = enc["input_ids"].to(device)  # [B, P]
    attention_mask = enc["attention_mask"].to(device)  # [B, P]
    with autocast_for(model):  # on CUDA: bf16, as the job's rollout will run it
        # PreTrainedModel does not declare generate(): the *ForCausalLM classes mix it in.
        out = model.generate(  # type: ignore[operator]
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )  # [B, P + T]
    new_tokens = out[:, input_ids.shape[1] :]  # [B, T]
    return list(tokenizer.batch_decode(new_tokens, skip_special_tokens=True))


def greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    items: Sequence[TaskItem],
    batch_size: int = 64,
    margin_tokens: int = 16,
    check: AnswerCheck = math_correct,
) -> EvalResult:
    """Exact-final-answer accuracy of greedy completions of ``items``' prompts.

    ``check`` defaults to the ``math`` reward the verifier applies, so the accuracy recorded for
    builtin:tiny is the reward RL starts from.
    """
    if not items:
        raise ValueError("greedy_accuracy: no items to evaluate (pass at least one TaskItem)")
    was_training = model.training
    model.eval()
    lengths = _solution_lengths(items, tokenizer)
    order = sorted(range(len(items)), key=lambda i: lengths[i])
    completions: list[str] = [""] * len(items)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        budget = max(lengths[i] for i in idx) + margin_tokens
        texts = generate_greedy(model, tokenizer, [items[i].prompt for i in idx], budget)
        for i, text in zip(idx, texts, strict=True):
            completions[i] = text
    model.train(was_training)
    by_size: dict[int, tuple[int, int]] = {}
    correct = 0
    for item, text in zip(items, completions, strict=True):
        ok = check(text, item.answer)
        correct += ok
        hit, n = by_size.get(item.size, (0, 0))
        by_size[item.size] = (hit + ok, n + 1)
    return EvalResult(
        accuracy=correct / len(items),
        n=len(items),
        correct=correct,
        by_size=dict(sorted(by_size.items())),
        completions=completions,
    )
