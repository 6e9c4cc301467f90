"""Timed forwards of the torch engine: plain decode, verify of k+1 tokens, one draft step, prefill.

Called by :mod:`longtail_workers.profile.main`. Each point runs the engine's own pieces
(:class:`~longtail_workers.engine.target.TargetModel` over a :class:`~longtail_workers.kvcache.
cache.PaddedKVCache`, the :class:`~longtail_workers.drafter.model.EagleDrafter` over its own
cache, as ``engine/specdec.py`` drafts) at a given batch size and context. The cache is filled
by prefilling one row and repeating it ``batch`` times (``PaddedKVCache.select``): timing does
not depend on the cached values, and a batch-256 prefill of long contexts would cost more than
every timed step together. After each timed forward its new slots are dropped again
(``drop_last``), so every repeat sees the same context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from longtail_api.profile import StepPoint
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.target import TargetModel
from longtail_workers.kvcache.cache import PaddedKVCache
from longtail_workers.profile.timing import Repeats, median_seconds

Progress = Callable[[str], None]


@dataclass(frozen=True)
class StepGrid:
    """Which forwards to time."""

    batches: tuple[int, ...]
    """Running-batch sizes."""
    contexts: tuple[int, ...]
    """Cached tokens per sequence (already capped by the model's positions)."""
    depths: tuple[int, ...]
    """Draft depths k; a verify pass runs k+1 tokens."""


@dataclass
class StepCurves:
    """The three latency curves of a profile."""

    decode: list[StepPoint]
    verify: list[StepPoint]
    draft: list[StepPoint]


def _ones(batch: int, tokens: int, device: torch.device) -> torch.Tensor:
    return torch.ones(batch, tokens, dtype=torch.bool, device=device)  # [B, Q]


def _positions(batch: int, start: int, tokens: int, device: torch.device) -> torch.Tensor:
    return (start + torch.arange(tokens, device=device)).expand(batch, tokens)  # [B, Q]


def _repeat_row(kv: PaddedKVCache, batch: int, device: torch.device) -> PaddedKVCache:
    kv.select(torch.zeros(batch, dtype=torch.long, device=device))
    return kv


def target_cache(
    target: TargetModel, batch: int, context: int, gen: torch.Generator
) -> PaddedKVCache:
    """A target cache of ``batch`` rows holding ``context`` tokens each."""
    dev = target.device
    kv = target.new_cache(1)
    ids = torch.randint(0, target.vocab_size, (1, context), generator=gen).to(dev)  # [1, C]
    target.forward(ids, _positions(1, 0, context, dev), kv, _ones(1, context, dev), logits_last=1)
    return _repeat_row(kv, batch, dev)


def drafter_cache(
    drafter: EagleDrafter, batch: int, context: int, gen: torch.Generator
) -> PaddedKVCache:
    """A drafter cache of ``batch`` rows holding ``context`` pairs each."""
    dev = drafter.fc.weight.device
    kv = PaddedKVCache(drafter.config, 1, dev)
    vocab, hidden = drafter.info.vocab_size, drafter.info.hidden_size
    ids = torch.randint(0, vocab, (1, context), generator=gen).to(dev)  # [1, C]
    states = torch.randn(1, context, hidden, generator=gen).to(dev, drafter.fc.weight.dtype)
    valid = _ones(1, context, dev)
    with torch.no_grad():
        mask = kv.mask_for(valid, drafter.fc.weight.dtype)
        drafter(ids, states, _positions(1, 0, context, dev), attention_mask=mask, cache=kv.cache)
    kv.commit(valid)
    return _repeat_row(kv, batch, dev)


def time_target(
    target: TargetModel, kv: PaddedKVCache, tokens: int, runs: Repeats, gen: torch.Generator
) -> float:
    """Seconds of one target forward of ``tokens`` new positions per row (all logits kept)."""
    dev, b, context = target.device, kv.batch_size, kv.num_slots
    ids = torch.randint(0, target.vocab_size, (b, tokens), generator=gen).to(dev)  # [B, Q]
    pos, valid = _positions(b, context, tokens, dev), _ones(b, tokens, dev)

    def run() -> None:
        target.forward(ids, pos, kv, valid)  # logits [B, Q, V], as decode and verify need
        kv.drop_last(tokens)

    return median_seconds(run, dev, runs)


def time_draft_step(
    drafter: EagleDrafter, kv: PaddedKVCache, runs: Repeats, gen: torch.Generator
) -> float:
    """Seconds of one draft step: LM head on the newest features, pick, one drafter forward."""
    dev, b, context = drafter.fc.weight.device, kv.batch_size, kv.num_slots
    dtype = drafter.fc.weight.dtype
    feats = torch.randn(b, drafter.info.hidden_size, generator=gen).to(dev, dtype)  # [B, H]
    pos, ones = _positions(b, context, 1, dev), _ones(b, 1, dev)

    @torch.no_grad()
    def run() -> None:
        logits = drafter.logits(feats)  # [B, V]
        picked = logits.argmax(dim=-1, keepdim=True)  # [B, 1]
        mask = kv.mask_for(ones, dtype)
        drafter(picked, feats[:, None, :], pos, attention_mask=mask, cache=kv.cache)
        kv.commit(ones)
        kv.drop_last(1)

    return median_seconds(run, dev, runs)


def step_curves(
    target: TargetModel,
    drafter: EagleDrafter,
    grid: StepGrid,
    runs: Repeats,
    gen: torch.Generator,
    progress: Progress,
) -> StepCurves:
    """Decode, verify and draft-step latency at every batch size and context of ``grid``."""
    curves = StepCurves([], [], [])
    for context in grid.contexts:
        for batch in grid.batches:
            kv = target_cache(target, batch, context, gen)
            decode = time_target(target, kv, 1, runs, gen)
            curves.decode.append(StepPoint(batch, context, 1, decode))
            for k in grid.depths:
                s = time_target(target, kv, k + 1, runs, gen)
                curves.verify.append(StepPoint(batch, context, k + 1, s))
            del kv
            dkv = drafter_cache(drafter, batch, context, gen)
            draft = time_draft_step(drafter, dkv, runs, gen)
            curves.draft.append(StepPoint(batch, context, 1, draft))
            del dkv
            progress(
                f"batch {batch:4d} context {context:6d}: decode {decode * 1e3:9.3f} ms, "
                f"draft step {draft * 1e3:9.3f} ms"
            )
    return curves


def prefill_tokens_per_s(
    target: TargetModel, batch: int, prompt: int, runs: Repeats, gen: torch.Generator
) -> float:
    """Prompt tokens per second of a prefill of ``batch`` prompts of ``prompt`` tokens."""
    dev = target.device
    ids = torch.randint(0, target.vocab_size, (batch, prompt), generator=gen).to(dev)  # [B, P]
    pos, valid = _positions(batch, 0, prompt, dev), _ones(batch, prompt, dev)

    def run() -> None:
        target.forward(ids, pos, target.new_cache(batch), valid, logits_last=1)

    return batch * prompt / median_seconds(run, dev, runs)


def capped_contexts(
    contexts: Sequence[int], max_positions: int | None, depths: Sequence[int]
) -> tuple[int, ...]:
    """``contexts`` capped so that a verify pass of the deepest draft still fits the positions."""
    if max_positions is None:
        return tuple(sorted(set(contexts)))
    cap = max_positions - max(depths) - 1
    if cap < 1:
        raise ValueError(
            f"--depths {max(depths)}: a verify pass needs {max(depths) + 1} positions but the "
            f"model has {max_positions}; use smaller depths"
        )
    return tuple(sorted({min(c, cap) for c in contexts}))
