"""``longtail profile`` options and run: measure the torch engine and write the profile file.

Called by ``longtail profile`` (``longtail_cli.main``) with the arguments after ``profile``.
Loads or builds the target and its drafter (``profile/models.py``), times the engine's forwards
(``profile/forwards.py``) and the two training steps (``profile/training.py``), and writes an
:class:`~longtail_api.profile.EngineProfile`. ``--quick`` is a small preset for tests and smoke
runs; explicit options override a preset's values.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from longtail_api.profile import EngineProfile
from longtail_workers.engine.target import TargetModel
from longtail_workers.models.loading import resolve_device
from longtail_workers.profile.forwards import (
    StepGrid,
    capped_contexts,
    prefill_tokens_per_s,
    step_curves,
)
from longtail_workers.profile.models import SHAPES, load_target, make_drafter, model_shape
from longtail_workers.profile.timing import Repeats
from longtail_workers.profile.training import (
    TrainShape,
    drafter_train_tokens_per_s,
    trainer_seconds_per_token,
)

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
    ap.add_argument("--engine", choices=ENGINES, default="torch")
    ap.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if present)")
    ap.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bfloat16 on CUDA), ...")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    ap.add_argument("--batches", type=_ints, help="batch sizes, e.g. 1,2,4,...,256")
    ap.add_argument("--contexts", type=_ints, help="cached tokens, e.g. 128,512,2048")
    ap.add_argument("--depths", type=_ints, help="draft depths k (verify runs k+1 tokens)")
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
    return replace(base, grid=grid, runs=runs)


def _device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"


def measure(args: argparse.Namespace, say: Any) -> EngineProfile:
    """Run every measurement of ``args`` and return the profile."""
    preset = _preset(args)
    device = resolve_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads {args.threads}: must be >= 1")
        torch.set_num_threads(args.threads)
    policy, name = load_target(args.model, args.shape, device, args.dtype, args.seed)
    target, drafter = TargetModel(policy), make_drafter(policy, name, args.seed)
    grid = replace(
        preset.grid,
        contexts=capped_contexts(preset.grid.contexts, target.max_positions, preset.grid.depths),
    )
    gen = torch.Generator().manual_seed(args.seed)
    say(f"profiling {name} on {_device_label(device)}: batches {list(grid.batches)}, "
        f"contexts {list(grid.contexts)}, depths {list(grid.depths)}")  # fmt: skip
    curves = step_curves(target, drafter, grid, preset.runs, gen, say)
    prompts, tokens = preset.prefill[0], min(preset.prefill[1], target.max_positions or 1 << 30)
    prefill = prefill_tokens_per_s(target, prompts, tokens, preset.runs, gen)
    say(f"prefill: {prefill:,.0f} tokens/s")
    shape = preset.train
    drafter_rate = drafter_train_tokens_per_s(drafter, shape, preset.runs, gen)
    say(f"drafter training: {drafter_rate:,.0f} tokens/s")
    per_token = trainer_seconds_per_token(policy, shape, preset.runs, gen)
    say(f"GRPO update: {per_token * 1e3:.4f} ms per response token")
    return EngineProfile(
        source="measured",
        device=_device_label(device),
        engine=args.engine,
        model=model_shape(policy),
        decode=curves.decode,
        verify=curves.verify,
        draft=curves.draft,
        prefill_tokens_per_s=prefill,
        drafter_train_tokens_per_s=drafter_rate,
        trainer_seconds_per_token=per_token,
        notes=[
            f"model {name}; torch {torch.__version__}; median of {preset.runs.repeats} runs "
            f"after {preset.runs.warmup} warm-up",
            "KV caches hold one prefilled row repeated per batch row; the draft step attends "
            "over the whole context (no drafter context window)",
            f"prefill: {prompts} prompts of {tokens} tokens; drafter training: "
            f"{shape.drafter_rows} rows of {shape.drafter_pairs} pairs; GRPO update: "
            f"{shape.sequences} rollouts of {shape.prompt_tokens}+{shape.response_tokens} tokens",
        ],
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.engine != "torch":
        print(
            f"longtail profile: --engine {args.engine} is not implemented yet; profile the "
            "torch engine with --engine torch",
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
