"""Timed forwards of the torch engine: plain decode, verify of k+1 tokens, one draft step, prefill.

Called by :mod:`longtail_workers.profile.main`. Each point runs the engine's own pieces
(:class:`~longtail_workers.engine.target.TargetModel` over a :class:`~longtail_workers.kvcache.
slots.SlotKVCache`, the :class:`~longtail_workers.drafter.model.EagleDrafter` over its own
cache, as ``engine/native/specdec.py`` drafts, with the engine's attention backend) at a given batch
size and context. The cache is filled by prefilling one row and copying it to the others
(``SlotKVCache.move_rows``): timing does not depend on the cached values, and a batch-256
prefill of long contexts would cost more than every timed step together. A timed forward writes
its new keys at the slots after the context, so every repeat sees the same context. On CUDA each
point is captured as a CUDA graph and its replay is timed, as the engine's steps are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from longtail_api.profile import StepPoint
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.native.graphs import StepGraphs
from longtail_workers.engine.target import TargetModel
from longtail_workers.kvcache.slot_attention import choose_backend, use_slot_attention
from longtail_workers.kvcache.slots import SlotAttention, SlotKVCache
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


def _positions(batch: int, start: int, tokens: int, device: torch.device) -> torch.Tensor:
    return (start + torch.arange(tokens, device=device)).expand(batch, tokens)  # [B, Q]


def _step(pos: torch.Tensor, backend: str, row0: int = 0) -> SlotAttention:
    span = int(pos.max()) + 1
    return SlotAttention(pos, torch.zeros_like(pos), span, row0=row0, backend=backend)


def _timed(fn: Callable[[], object], device: torch.device, runs: Repeats) -> float:
    """Median seconds of ``fn``; on CUDA of its captured graph's replay, as the engine runs it."""
    if device.type == "cuda":
        graphs = StepGraphs(device, enabled=True, mutable=[])
        return median_seconds(lambda: graphs.run("point", fn), device, runs)
    return median_seconds(fn, device, runs)


def target_cache(
    target: TargetModel, batch: int, context: int, room: int, gen: torch.Generator
) -> SlotKVCache:
    """A target cache of ``batch`` rows holding ``context`` tokens each (``room`` slots more)."""
    dev = target.device
    kv = target.new_cache(batch, context + room)
    ids = torch.randint(0, target.vocab_size, (1, context), generator=gen).to(dev)  # [1, C]
    target.forward(ids, kv, _step(_positions(1, 0, context, dev), "torch"))
    kv.move_rows(
        torch.zeros(batch - 1, dtype=torch.long, device=dev),
        torch.arange(1, batch, device=dev),
        context,
    )
    return kv


def drafter_cache(
    drafter: EagleDrafter, batch: int, context: int, gen: torch.Generator
) -> SlotKVCache:
    """A drafter cache of ``batch`` rows holding ``context`` pairs each (one slot more)."""
    dev, dtype = drafter.fc.weight.device, drafter.fc.weight.dtype
    use_slot_attention(drafter.config)
    kv = SlotKVCache(drafter.config, batch, context + 1, dev, dtype, num_layers=1)
    vocab, hidden = drafter.info.vocab_size, drafter.info.hidden_size
    ids = torch.randint(0, vocab, (1, context), generator=gen).to(dev)  # [1, C]
    states = torch.randn(1, context, hidden, generator=gen).to(dev, dtype)
    pos = _positions(1, 0, context, dev)
    kv.step = _step(pos, "torch")
    with torch.no_grad():
        drafter(ids, states, pos, attention_mask=kv.step, cache=kv)
    kv.move_rows(
        torch.zeros(batch - 1, dtype=torch.long, device=dev),
        torch.arange(1, batch, device=dev),
        context,
    )
    return kv


def time_target(
    target: TargetModel,
    kv: SlotKVCache,
    context: int,
    tokens: int,
    backend: str,
    runs: Repeats,
    gen: torch.Generator,
) -> float:
    """Seconds of one target forward of ``tokens`` new positions per row (all logits kept)."""
    dev, b = target.device, kv.rows
    ids = torch.randint(0, target.vocab_size, (b, tokens), generator=gen).to(dev)  # [B, Q]
    step = _step(_positions(b, context, tokens, dev), backend)

    def run() -> None:
        target.logits(target.forward(ids, kv, step))  # [B, Q, V], as decode and verify need

    return _timed(run, dev, runs)


def time_draft_step(
    drafter: EagleDrafter,
    kv: SlotKVCache,
    context: int,
    backend: str,
    runs: Repeats,
    gen: torch.Generator,
) -> float:
    """Seconds of one draft step: LM head on the newest features, pick, one drafter forward."""
    dev, b = drafter.fc.weight.device, kv.rows
    dtype = drafter.fc.weight.dtype
    feats = torch.randn(b, drafter.info.hidden_size, generator=gen).to(dev, dtype)  # [B, H]
    step = _step(_positions(b, context, 1, dev), backend)

    @torch.no_grad()
    def run() -> None:
        logits = drafter.logits(feats)  # [B, V]
        picked = logits.argmax(dim=-1, keepdim=True)  # [B, 1]
        kv.step = step
        drafter(picked, feats[:, None, :], step.q_pos, attention_mask=step, cache=kv)

    return _timed(run, dev, runs)


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
    backend = choose_backend(None, target.device, target.dtype)
    for context in grid.contexts:
        for batch in grid.batches:
            kv = target_cache(target, batch, context, max(grid.depths) + 1, gen)
            decode = time_target(target, kv, context, 1, backend, runs, gen)
            curves.decode.append(StepPoint(batch, context, 1, decode))
            for k in grid.depths:
                s = time_target(target, kv, context, k + 1, backend, runs, gen)
                curves.verify.append(StepPoint(batch, context, k + 1, s))
            del kv
            dkv = drafter_cache(drafter, batch, context, gen)
            draft = time_draft_step(drafter, dkv, context, backend, runs, gen)
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
    step = _step(_positions(batch, 0, prompt, dev), "torch")
    kv = target.new_cache(batch, prompt)

    def run() -> None:
        target.logits(target.forward(ids, kv, step)[:, -1:])  # only the last position's logits

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
