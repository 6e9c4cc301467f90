"""Whole engine steps, timed through the torch engine itself: plain decode and speculative steps.

Called by :mod:`longtail_workers.profile.main` after the bare forwards (``forwards.py``). A
forward is not all a step costs: the engine also samples (temperature, top-p, one seeded stream
per row), checks stops, writes its caches and token stores and, in a speculative step, drafts
``k`` tokens, verifies them and runs the rejection sampler. On a small model those are a large
share of the step (docs/performance.md, "Step simulator: validation"), so the simulator's decode
and speculative-step latencies come from here: for every batch size and context of the grid,
:class:`~longtail_workers.engine.native.torch_engine.TorchEngine` generates ``batch`` answers to
random prompts of ``context`` tokens (no stop token, so every row runs every step), and the
median of the steps after the first quarter is the point (the first speculative step re-prefills
the drafter, and the next few cost less than the steady state until its cache has grown).
Speculative steps are forced on (threshold at the batch, no warm-up, one fixed strategy of depth
``k``). What a step costs depends on how many drafts it accepts (accepted tokens are kept in the
target's cache and fed through the drafter at the next step), so the untrained drafter's guesses
are judged by :func:`forced_acceptance`, which accepts a set number of them: every row then gains
the profile's accepted length per step, as a trained drafter's rows do on average. That rule is
for timing only: it is not lossless, and nothing but the profiler uses it.

With ``history_drafts``, each depth is also timed as a **history-only** step (a ``history``
strategy, no learned drafter: the engine verifies drafts staged from its history index, no
drafter forward), its rows keeping ``history_drafts`` drafts. The host's proposals are part of
the engine's step time; the engine records them (``StepRecord.history_propose_s``) and they are
taken out here, as they depend on what the index holds (random prompts' answers share nothing):
``history_costs.py`` times them on a realistic index instead.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from longtail_api.policies import DrafterKind, SelectorSpec, SpeculativeSpec, StrategySpec
from longtail_api.profile import StepPoint
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
from longtail_workers.engine.rejection import AcceptanceRule, Verdict
from longtail_workers.engine.sampling import sample_from_probs
from longtail_workers.engine.stats import RolloutStats, StepMode, StepRecord
from longtail_workers.profile.forwards import StepGrid


@dataclass
class StepRecorder(RolloutStats):
    """The engine's statistics, keeping every step's record too."""

    records: list[StepRecord] = field(default_factory=list)

    def record(self, step: StepRecord) -> None:
        super().record(step)
        self.records.append(step)


@dataclass(frozen=True)
class EngineCurves:
    """Whole-step latencies measured through the engine."""

    decode: list[StepPoint]
    """Plain decode steps (tokens 1)."""
    speculative: list[StepPoint]
    """Speculative steps of depth k (tokens k+1): k draft steps, the verify, the sampler."""
    history: list[StepPoint] = field(default_factory=list)
    """History-only speculative steps of depth k (tokens k+1): the verify of staged history
    drafts and the sampler, no drafter forward, the host's proposals taken out (empty unless
    asked for)."""


def forced_acceptance(accepted_drafts: int) -> AcceptanceRule:
    """An acceptance rule that keeps the first ``accepted_drafts`` drafts of every row (at most
    k) and samples the next token from the target at that position: timing only, not lossless."""

    def rule(
        p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, u_accept: torch.Tensor,
        u_next: torch.Tensor,
    ) -> Verdict:  # fmt: skip
        b, k = drafts.shape
        accepted = torch.full((b,), min(accepted_drafts, k), dtype=torch.long, device=p.device)
        rows = torch.arange(b, device=p.device)
        dist = p[rows, accepted][:, None, :]  # [B, 1, V]
        next_token = sample_from_probs(dist, u_next[rows, accepted][:, None]).squeeze(1)
        return Verdict(accepted=accepted, next_token=next_token)

    return rule


def speculative_spec(depth: int, batch: int, drafter: DrafterKind = "learned") -> SpeculativeSpec:
    """Speculation forced on up to ``batch`` rows: no warm-up, one fixed strategy of depth
    ``depth`` drafted by ``drafter`` (also ``vllm_steps.py``'s)."""
    return SpeculativeSpec(
        enabled=True,
        batch_threshold=batch,
        warmup_steps=0,
        strategies=[StrategySpec(draft_depth=depth, drafter=drafter)],
        selector=SelectorSpec(type="fixed"),
    )


def step_config(batch: int, context: int) -> EngineConfig:
    """An engine that admits all ``batch`` prompts of ``context`` tokens in one prefill group.

    The engine admits one prefill group per step; with the default budget a large point
    (256 prompts of 2,048 tokens: 32 groups) would finish its first rows before the last were
    admitted and never run a step at the full batch."""
    budget = max(EngineConfig.max_prefill_tokens, batch * context)
    return EngineConfig(max_running=batch, max_prefill_tokens=budget)


def _median_step(
    engine: TorchEngine, mode: StepMode, batch: int, context: int, new_tokens: int, vocab: int,
    gen: torch.Generator,
) -> float:  # fmt: skip
    """Median seconds of the ``mode`` steps of one generate call of ``new_tokens`` tokens per
    row, the first quarter left out, less the host's history proposals (0 but in history and
    hybrid steps)."""
    prompt = torch.randint(0, vocab, (context,), generator=gen).tolist()
    requests = [
        GenerationRequest(prompt, new_tokens, temperature=1.0, seed=i) for i in range(batch)
    ]
    recorder = StepRecorder()
    engine.stats = recorder
    engine.generate(requests)
    times = [
        r.latency_s - r.history_propose_s
        for r in recorder.records
        if r.mode == mode and r.batch_size == batch
    ]
    if len(times) < 4:
        raise RuntimeError(
            f"profiling {mode} steps at batch {batch}, context {context}: the engine ran "
            f"{len(times)} such steps for {new_tokens} new tokens; expected 4 or more"
        )
    return statistics.median(times[max(1, len(times) // 4) :])


def engine_curves(
    model: nn.Module,
    drafter: EagleDrafter,
    grid: StepGrid,
    steps: int,
    gen: torch.Generator,
    say: Callable[[str], None],
    max_positions: int | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    accepted_drafts: int = 0,
    history_drafts: int | None = None,
) -> EngineCurves:
    """Plain and speculative step latencies at every (batch, context[, depth]) of ``grid``;
    ``steps``: engine steps per point; ``accepted_drafts``: drafts every speculative step keeps
    (:func:`forced_acceptance`); ``history_drafts``: time history-only steps too, keeping that
    many drafts (None: not timed). A context too long for ``max_positions`` plus the generated
    tokens is profiled at the longest prompt that fits (and recorded as such).
    ``should_stop`` is asked before every point (a neighbour's way out, ``neighbours.py``)."""
    vocab = int(model.get_output_embeddings().out_features)  # type: ignore[operator]
    room = (steps + 1) * (max(grid.depths) + 1)  # the most a speculative run can generate
    if max_positions is not None and max_positions <= room:
        raise ValueError(
            f"the model has {max_positions} positions; {steps} engine steps of depth up to "
            f"{max(grid.depths)} need more than {room}: use smaller --depths"
        )
    contexts = sorted({min(c, (max_positions or c + room) - room) for c in grid.contexts})
    decode: list[StepPoint] = []
    speculative: list[StepPoint] = []
    history: list[StepPoint] = []
    for context in contexts:
        for batch in grid.batches:
            if should_stop():
                return EngineCurves(decode, speculative, history)
            config = step_config(batch, context)
            plain = TorchEngine(model, config=config)
            s = _median_step(plain, "plain", batch, context, steps + 1, vocab, gen)
            decode.append(StepPoint(batch, context, 1, s))
            line = f"engine batch {batch:4d} context {context:6d}: plain step {s * 1e3:8.3f} ms"
            for depth in grid.depths:
                sd = TorchEngine(model, config=config, speculative=speculative_spec(depth, batch),
                                 drafter=drafter,
                                 acceptance_rule=forced_acceptance(accepted_drafts))  # fmt: skip
                tokens = (steps + 1) * (min(accepted_drafts, depth) + 1)
                s = _median_step(sd, "sd", batch, context, tokens, vocab, gen)
                speculative.append(StepPoint(batch, context, depth + 1, s))
                line += f", SD k={depth} {s * 1e3:8.3f} ms"
                if history_drafts is not None:
                    s = _history_step(model, config, depth, batch, context, steps, history_drafts,
                                      vocab, gen)  # fmt: skip
                    history.append(StepPoint(batch, context, depth + 1, s))
                    line += f" (history {s * 1e3:8.3f} ms)"
            say(line)
    return EngineCurves(decode, speculative, history)


def _history_step(
    model: nn.Module, config: EngineConfig, depth: int, batch: int, context: int, steps: int,
    kept: int, vocab: int, gen: torch.Generator,
) -> float:  # fmt: skip
    """Median seconds of a history-only speculative step of depth ``depth`` whose rows keep
    ``kept`` drafts, less the host's proposals (see the module text)."""
    engine = TorchEngine(model, config=config,
                         speculative=speculative_spec(depth, batch, drafter="history"),
                         acceptance_rule=forced_acceptance(kept))  # fmt: skip
    tokens = (steps + 1) * (min(kept, depth) + 1)
    return _median_step(engine, "sd", batch, context, tokens, vocab, gen)


def catch_up_tokens_per_s(
    model: nn.Module, drafter: EagleDrafter, batch: int, prompt: int, generated: int, depth: int,
    repeats: int, gen: torch.Generator, accepted_drafts: int = 0,
) -> float | None:  # fmt: skip
    """Response tokens per second the drafter reads when speculation switches on, or None when
    too small to see: ``2 x batch`` answers decode plainly until the ``batch`` short ones end
    at ``generated`` tokens; SD (threshold ``batch``) then switches on and its first step
    catches up on ``batch x generated`` response pairs. The first step's excess over the
    median of the next ones, median of ``repeats`` runs, is that catch-up's cost."""
    vocab = int(model.get_output_embeddings().out_features)  # type: ignore[operator]
    excess: list[float] = []
    for _ in range(repeats):
        engine = TorchEngine(model, config=step_config(2 * batch, prompt),
                             speculative=speculative_spec(depth, batch), drafter=drafter,
                             acceptance_rule=forced_acceptance(accepted_drafts))  # fmt: skip
        recorder = StepRecorder()
        engine.stats = recorder
        ids = torch.randint(0, vocab, (prompt,), generator=gen).tolist()
        long = generated + 9 * (min(accepted_drafts, depth) + 1)  # 8 more speculative steps
        engine.generate([
            GenerationRequest(ids, generated if i < batch else long, temperature=1.0, seed=i)
            for i in range(2 * batch)
        ])  # fmt: skip
        sd = [r.latency_s for r in recorder.records if r.mode == "sd"]
        if len(sd) < 4:
            raise RuntimeError(
                f"profiling the drafter's catch-up at batch {batch}: the engine ran {len(sd)} "
                "speculative steps; expected 4 or more"
            )
        excess.append(sd[0] - statistics.median(sd[1:]))
    seconds = statistics.median(excess)
    return batch * generated / seconds if seconds > 0 else None
