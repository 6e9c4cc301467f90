"""Feasibility of the acceptance target: can GRPO lift ``builtin:tiny`` by >= 15 points quickly?

Run: ``.venv/bin/python bench/grpo_feasibility.py [--steps N --lr X ...]``. In-process, no
services: the real rollout engine (:class:`TorchEngine`) samples ``group`` answers for each of
``prompts`` training prompts, the ``math`` reward scores them, and the real trainer pieces
(:func:`group_advantages`, :class:`GrpoBatch`, :func:`train_step`) update the policy. Greedy
eval accuracy (engine, temperature 0) on the job's eval split is measured before, every
``--eval-every`` steps and after; with ``--sampled-eval N`` also the mean reward of N answers per
eval prompt sampled at the rollout temperature (what GRPO maximises, on held-out prompts).
``--model`` points it at another policy directory, ``--overlong-filter`` drops the loss of
answers cut at ``--max-new-tokens``, ``--seq-mean`` weighs answers instead of tokens. Prints
one line per step and a JSON summary to
``bench/results/grpo_feasibility.json``; this is how the settings in
``examples/01-tiny-arith.yaml`` were chosen (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import torch

from longtail_api.spec import AlgorithmSpec, DatasetSpec
from longtail_workers.data import iterate_batches, resolve_dataset
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
from longtail_workers.models.loading import load_policy
from longtail_workers.rewards import get_reward
from longtail_workers.rewards.extract import extract_final_answer
from longtail_workers.tasks.arith import parse_operands
from longtail_workers.trainer.grpo import group_advantages
from longtail_workers.trainer.optim import TrainConfig, build_optimizer, train_step
from longtail_workers.trainer.rollout_batch import build_grpo_batch

RESULTS = Path(__file__).resolve().parent / "results" / "grpo_feasibility.json"


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--eval-size", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--micro-batch-tokens", type=int, default=8192)
    ap.add_argument("--max-operands", type=int, default=0, help="train only on items this small")
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--adam-eps", type=float, default=1e-8)
    ap.add_argument(
        "--sampled-eval",
        type=int,
        default=0,
        help="also measure sampled eval accuracy: this many answers per eval prompt at the "
        "rollout temperature (the quantity GRPO maximises, on held-out prompts)",
    )
    ap.add_argument(
        "--overlong-filter",
        action="store_true",
        help="answers cut at max-new-tokens carry no loss (DAPO's overlong filtering)",
    )
    ap.add_argument(
        "--seq-mean",
        action="store_true",
        help="weigh every answer equally (GRPO's per-sequence mean) instead of every token: "
        "advantages are rescaled by tokens / (answers x answer length)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    return ap.parse_args(argv)


def eval_answers(
    engine: TorchEngine, tokenizer, examples, max_new_tokens: int, temperature: float, n: int
) -> dict[str, float]:
    """``n`` answers per eval prompt at ``temperature`` (0: greedy), scored three ways.

    ``accuracy``: mean ``math`` reward. ``answer_line``: share of answers with a final answer the
    reward can read. ``any_format``: share whose last number is the gold sum, in whatever words
    (separates learning the answer format from learning the sums). Sampling seeds are fixed, so
    two evaluations of the same weights give the same figures.
    """
    reward = get_reward("math")
    eos = int(tokenizer.eos_token_id)
    reqs = [
        GenerationRequest(
            tokenizer.encode(ex.prompt, add_special_tokens=False),
            max_new_tokens,
            temperature=temperature,
            seed=900_000 + 1000 * i + g,
            stop_token_ids=[eos],
        )
        for i, ex in enumerate(examples)
        for g in range(n)
    ]
    results = engine.generate(reqs)
    texts = tokenizer.batch_decode([r.output_token_ids for r in results], skip_special_tokens=True)
    golds = [ex.answer for ex in examples for _ in range(n)]
    scored = [reward(t, a) for t, a in zip(texts, golds, strict=True)]
    last_numbers = [re.findall(r"\d+", t)[-1:] for t in texts]
    return {
        "accuracy": sum(r.correct for r in scored) / len(golds),
        "answer_line": sum(extract_final_answer(t) is not None for t in texts) / len(golds),
        "any_format": sum(nums == [a] for nums, a in zip(last_numbers, golds, strict=True))
        / len(golds),
    }


def evaluate(engine, tokenizer, examples, args: argparse.Namespace) -> dict[str, float]:
    out = eval_answers(engine, tokenizer, examples, args.max_new_tokens, 0.0, 1)
    if args.sampled_eval:
        sampled = eval_answers(
            engine, tokenizer, examples, args.max_new_tokens, args.temperature, args.sampled_eval
        )
        out.update({f"sampled_{k}": v for k, v in sampled.items()})
    return out


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, tokenizer = load_policy(args.model, dtype="float32")
    dataset = DatasetSpec(path="builtin:arith", eval_size=args.eval_size)
    train = resolve_dataset(dataset, "train", seed=args.seed)
    evals = resolve_dataset(dataset, "eval", seed=args.seed)
    if args.max_operands:
        train = [ex for ex in train if len(parse_operands(ex.prompt)) <= args.max_operands]
    engine = TorchEngine(model, config=EngineConfig(max_running=256))
    algo = AlgorithmSpec(learning_rate=args.lr, temperature=args.temperature)
    cfg = TrainConfig.from_algorithm(
        algo,
        micro_batch_tokens=args.micro_batch_tokens,
        weight_decay=args.weight_decay,
        betas=(0.9, args.beta2),
        adam_eps=args.adam_eps,
    )
    optimizer = build_optimizer(model, cfg)
    reward = get_reward("math")
    eos = int(tokenizer.eos_token_id)
    t0 = time.perf_counter()
    first = evaluate(engine, tokenizer, evals, args)
    acc0 = first["accuracy"]
    eval_s = time.perf_counter() - t0
    print(f"start eval {first} ({eval_s:.1f} s)", flush=True)
    curve = [{"step": 0, **first}]
    rows = []
    batches = iterate_batches(train, args.prompts, args.seed)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        prompts = next(batches)
        ts = time.perf_counter()
        reqs = [
            GenerationRequest(
                tokenizer.encode(ex.prompt, add_special_tokens=False),
                args.max_new_tokens,
                temperature=args.temperature,
                seed=hash((args.seed, step, i, g)) % 2**63,
                stop_token_ids=[eos],
            )
            for i, ex in enumerate(prompts)
            for g in range(args.group)
        ]
        model.eval()
        results = engine.generate(reqs)
        t_roll = time.perf_counter() - ts
        texts = tokenizer.batch_decode(
            [r.output_token_ids for r in results], skip_special_tokens=True
        )
        golds = [ex.answer for ex in prompts for _ in range(args.group)]
        rewards = torch.tensor([reward(t, a).reward for t, a in zip(texts, golds, strict=True)])
        adv = group_advantages(rewards, args.group)
        if args.overlong_filter:
            cut = torch.tensor([r.finish_reason == "length" for r in results])
            adv = torch.where(cut, torch.zeros_like(adv), adv)
        if args.seq_mean:  # token-mean of A_i * N / (B * len_i) == mean over answers of A_i
            lengths_t = torch.tensor([max(1, len(r.output_token_ids)) for r in results])
            adv = adv * lengths_t.sum() / (len(results) * lengths_t)
        batch = build_grpo_batch(results, adv.tolist(), pad_id=int(tokenizer.pad_token_id))
        tt = time.perf_counter()
        model.train()
        stats = train_step(model, optimizer, batch, cfg)
        model.eval()
        t_train = time.perf_counter() - tt
        lengths = [len(r.output_token_ids) for r in results]
        row = {
            "step": step,
            "reward": float(rewards.mean()),
            "rollout_s": t_roll,
            "train_s": t_train,
            "mean_len": sum(lengths) / len(lengths),
            "max_len": max(lengths),
            "grad_norm": stats.grad_norm,
            "clip_fraction": stats.clip_fraction,
        }
        rows.append(row)
        print(
            f"step {step:3d} reward {row['reward']:.3f} roll {t_roll:5.1f}s train "
            f"{t_train:5.1f}s len {row['mean_len']:.0f}/{row['max_len']} gn {stats.grad_norm:.2f}",
            flush=True,
        )
        if args.eval_every and step % args.eval_every == 0 and step != args.steps:
            figures = evaluate(engine, tokenizer, evals, args)
            curve.append({"step": step, **figures})
            print(f"  eval {figures}", flush=True)
    train_s = time.perf_counter() - start
    last = evaluate(engine, tokenizer, evals, args)
    acc = last["accuracy"]
    curve.append({"step": args.steps, **last})
    print(f"final eval {last} (greedy {100 * (acc - acc0):+.1f} points) in {train_s:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "start_accuracy": acc0,
        "final_accuracy": acc,
        "gain_points": 100 * (acc - acc0),
        "train_seconds": train_s,
        "eval_seconds": eval_s,
        "curve": curve,
        "steps": rows,
        "load_average_1m": os.getloadavg()[0],
    }
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
