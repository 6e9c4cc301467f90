"""``longtail drafter fit``: warm-start a job's drafter offline on the policy's own rollouts.

A drafter trained from scratch online reaches only a short accepted length in a short run (the
spot trainer gets a few worker-seconds per step). This command does before the run what the spot
trainer does during it, in one go and with large batches: it samples the job's policy on the
job's *training* prompts (the job's temperature, top-p and ``maxNewTokens``), records the target's
hidden states, fits a drafter in the job's ``drafterTraining.layout`` with TLT's loss
(:func:`longtail_workers.warmstart.fit.fit_drafter`), reports its held-out top-1 agreement with the
target and writes it as a drafter directory. Point ``spec.drafterTraining.initialDrafter`` at that
directory; rollout workers then speculate well from the first step, and the online trainer's
quality gate (``spot/trainer.py``) keeps it from being replaced by anything worse.

Called by ``longtail drafter fit`` (``cli/longtail_cli/main.py`` routes to :func:`main`).
Memory: the hidden states of every sampled token are kept (tokens x hidden size x 4 bytes; 512
answers of ~70 tokens of ``builtin:tiny`` are ~40 MB, a 7B model's 3584-wide states ~10x that
per token), so ``--prompts`` bounds it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from longtail_api.policies import DrafterLayout, DrafterTrainingSpec, LossWeightsSpec
from longtail_api.spec import DatasetSpec
from longtail_workers.data import resolve_dataset
from longtail_workers.data.loader import DEFAULT_BUILTIN_TRAIN_SIZE
from longtail_workers.data.prompts import format_example
from longtail_workers.drafter.checkpoint import save_drafter
from longtail_workers.drafter.model import EagleDrafter, layout_options
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
from longtail_workers.jobspec import JobSpecError, load_job_spec
from longtail_workers.models.loading import load_policy
from longtail_workers.spot.windows import Window, top1_over
from longtail_workers.warmstart.fit import (
    TrainingSequence,
    collect_training_sequences,
    fit_drafter,
)
from longtail_workers.warmstart.recipe import OfflineFit, Sampling

HOLDOUT_EVERY = 10  # every 10th sampled answer is held out to measure the fit
_SEED_BASE = 7_000_000  # sampling seeds apart from the RL run's answer seeds


def sampling_requests(
    dataset: DatasetSpec, sampling: Sampling, tokenizer: object, n: int, max_new_tokens: int
) -> list[GenerationRequest]:
    """One request per training prompt of ``dataset`` (the first ``n``), sampled as a job's
    rollout would with ``sampling``."""
    size = max(DEFAULT_BUILTIN_TRAIN_SIZE, n)
    examples = resolve_dataset(dataset, "train", seed=sampling.seed, builtin_train_size=size)
    eos = [int(tokenizer.eos_token_id)]  # type: ignore[attr-defined]
    requests = []
    for i, example in enumerate(examples[:n]):
        text = format_example(tokenizer, example, dataset.apply_chat_template)
        requests.append(
            GenerationRequest(
                list(tokenizer.encode(text, add_special_tokens=False)),  # type: ignore[attr-defined]
                max_new_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                seed=_SEED_BASE + sampling.seed * 100_003 + i,
                stop_token_ids=eos,
            )
        )
    return requests


def heldout_top1(drafter: EagleDrafter, seqs: Sequence[TrainingSequence]) -> float:
    """Share of held-out pairs whose drafted next token is the target's own next token."""
    windows = [Window(s.tokens, s.hidden, s.start_position) for s in seqs]
    row = max(w.num_pairs for w in windows)  # one whole answer per packed row at most
    device = next(drafter.parameters()).device  # packed where the drafter runs (CUDA on a GPU)
    share, _ = top1_over(drafter.eval(), windows, row, device)
    return float("nan") if share is None else share


@dataclass
class FittedDrafter:
    """A fitted drafter and what the fit measured."""

    drafter: EagleDrafter
    top1_before: float  # held-out top-1 agreement of the fresh drafter
    top1_after: float
    held_out: int  # held-out answers
    tokens: int  # sampled answer tokens
    sample_seconds: float
    fit_seconds: float


def fit_offline(
    model: torch.nn.Module,
    target_id: str,
    requests: Sequence[GenerationRequest],
    fit: OfflineFit,
    *,
    layout: DrafterLayout,
    loss_weights: LossWeightsSpec,
    on_step: Callable[[int, float], object] | None = None,
) -> FittedDrafter:
    """Sample ``requests`` on ``model``, fit a fresh drafter in ``layout`` on 9 of every 10
    answers and measure its top-1 agreement on the tenth (before and after)."""
    started = time.perf_counter()
    engine = TorchEngine(model, config=EngineConfig(max_running=fit.max_running))
    seqs = collect_training_sequences(engine, requests)
    held = seqs[HOLDOUT_EVERY - 1 :: HOLDOUT_EVERY] or seqs[-1:]
    train = [s for i, s in enumerate(seqs) if i % HOLDOUT_EVERY != HOLDOUT_EVERY - 1] or seqs
    sampled = time.perf_counter()
    drafter = EagleDrafter(model, target_id=target_id, **layout_options(layout))
    training = DrafterTrainingSpec(
        learning_rate=fit.learning_rate, window_tokens=fit.window_tokens, loss_weights=loss_weights
    )
    before = heldout_top1(drafter, held)
    fit_drafter(
        drafter, train, steps=fit.steps, training=training, batch_size=fit.batch_size,
        seed=fit.seed,
        on_step=None if on_step is None else lambda i, loss: on_step(i, float(loss.total.detach())),
    )  # fmt: skip
    return FittedDrafter(
        drafter=drafter,
        top1_before=before,
        top1_after=heldout_top1(drafter, held),
        held_out=len(held),
        tokens=sum(len(s.tokens) for s in seqs),
        sample_seconds=sampled - started,
        fit_seconds=time.perf_counter() - sampled,
    )


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="longtail drafter fit",
        description="Fit a drafter offline on the job's policy and training prompts; write it "
        "for spec.drafterTraining.initialDrafter.",
    )
    ap.add_argument("job", type=Path, metavar="JOB.yaml", help="the RLJob the drafter is for")
    ap.add_argument("--output", "-o", type=Path, required=True, help="new drafter directory")
    ap.add_argument("--prompts", type=int, default=512, help="training prompts to sample (512)")
    ap.add_argument("--steps", type=int, default=600, help="AdamW steps of the fit (600)")
    ap.add_argument("--batch-size", type=int, default=16, help="windows per step (16)")
    ap.add_argument("--learning-rate", type=float, default=3e-4, help="AdamW rate (3e-4)")
    ap.add_argument("--window-tokens", type=int, default=512, help="pairs per window (512)")
    ap.add_argument(
        "--max-new-tokens", type=int, default=None, help="answer budget (the job's maxNewTokens)"
    )
    ap.add_argument("--max-running", type=int, default=64, help="answers sampled at once (64)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's)")
    ap.add_argument("--force", action="store_true", help="overwrite a non-empty --output")
    return ap.parse_args(list(argv))


def _check_args(args: argparse.Namespace) -> str | None:
    """The first bad option, as an error line naming it; None when all are usable."""
    for name in ("steps", "batch_size", "window_tokens", "max_running"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')}={getattr(args, name)}: must be >= 1"
    if args.prompts < 2:
        return f"--prompts={args.prompts}: need >= 2 (one answer in {HOLDOUT_EVERY} is held out)"
    if args.max_new_tokens is not None and args.max_new_tokens < 2:
        return f"--max-new-tokens={args.max_new_tokens}: must be >= 2 (a pair needs two tokens)"
    if args.output.exists() and any(args.output.iterdir()) and not args.force:
        return f"--output {args.output}: exists and is not empty (choose a new path or --force)"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    problem = _check_args(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        spec = load_job_spec(args.job)
    except JobSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    # On the device, in the job's dtype there (auto: bfloat16 on CUDA): the policy as served.
    model, tokenizer = load_policy(spec.model.path, dtype=spec.model.dtype, device=args.device)
    max_new = args.max_new_tokens or spec.algorithm.max_new_tokens
    sampling = Sampling(spec.algorithm.temperature, spec.algorithm.top_p, spec.algorithm.seed)
    requests = sampling_requests(spec.dataset, sampling, tokenizer, args.prompts, max_new)
    print(f"sampling {len(requests)} answers of {spec.model.path} (up to {max_new} tokens each)")
    every = max(1, args.steps // 10)

    def progress(step: int, loss: float) -> None:
        if (step + 1) % every == 0:
            print(f"  step {step + 1}/{args.steps}  loss {loss:.4f}", flush=True)

    fitted = fit_offline(
        model,
        spec.model.path,
        requests,
        OfflineFit(
            steps=args.steps,
            batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            window_tokens=args.window_tokens,
            max_running=args.max_running,
            seed=spec.algorithm.seed,
        ),
        layout=spec.drafter_training.layout,
        loss_weights=spec.drafter_training.loss_weights,
        on_step=progress,
    )
    save_drafter(fitted.drafter, args.output)
    print(
        f"held-out top-1 agreement with the target: {fitted.top1_before:.3f} -> "
        f"{fitted.top1_after:.3f} ({fitted.held_out} held-out answers); "
        f"{time.perf_counter() - started:.0f} s in all\n"
        f"drafter written to {args.output}\n"
        f"use it: spec.drafterTraining.initialDrafter: {args.output.resolve()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
