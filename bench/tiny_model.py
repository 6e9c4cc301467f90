"""Benchmark of ``builtin:tiny``: build time, reload time, eval accuracy, solution-length tail.

Builds ``builtin:tiny`` from scratch into a temporary cache directory (so it really builds, even
when ``~/.cache/longtail`` already holds it), reloads it from that cache through ``load_policy``
(the path every worker uses), re-measures greedy accuracy on the eval split, and reports the
percentiles of ``builtin:arith`` solution lengths in tokens. Prints the figures and writes them
to ``bench/results/tiny_model.json``. It asserts nothing about time: timings on a shared CPU are
noisy, so the load average before and after is recorded next to them.

Run from the repository root: ``.venv/bin/python bench/tiny_model.py``. ``--sft-steps`` and
``--prose-answer-fraction`` build a variant of the recipe instead, and ``--keep DIR`` keeps the
built model there (for ``bench/grpo_feasibility.py --model DIR`` or a job's ``model.path``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from longtail_workers.models.builtin import (
    DEFAULT_RECIPE,
    TinyRecipe,
    ensure_tiny,
    read_build_info,
)
from longtail_workers.models.cache import CACHE_ENV
from longtail_workers.models.evaluation import greedy_accuracy
from longtail_workers.models.loading import load_policy
from longtail_workers.tasks.arith import generate

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "tiny_model.json"


def length_percentiles(n: int, tokenizer: Any) -> dict[str, float]:
    """p50/p90/p99/max of solution lengths (tokens, EOS included) over n train items."""
    items = generate(n, seed=DEFAULT_RECIPE.seed + 1, split="train")
    lengths = np.array([len(tokenizer.encode(it.solution)) + 1 for it in items])
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
    return {
        "items": n,
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(lengths.max()),
        "mean": float(lengths.mean()),
        "p99_over_p50": float(p99 / p50),
    }


def run(
    eval_n: int, length_items: int, recipe: TinyRecipe = DEFAULT_RECIPE, keep: Path | None = None
) -> dict[str, Any]:
    """Build ``recipe`` into a fresh cache, reload, measure; returns the figures."""
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="longtail-bench-") as cache:
        os.environ[CACHE_ENV] = cache
        start = time.perf_counter()
        model_dir = ensure_tiny(recipe, log_every=100)
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        model, tokenizer = load_policy(str(model_dir))  # the HF-directory path of builtin:tiny
        reload_s = time.perf_counter() - start
        info = read_build_info(model_dir)
        if keep is not None:
            shutil.copytree(model_dir, keep)
    items = generate(eval_n, seed=recipe.seed, split="eval")
    start = time.perf_counter()
    result = greedy_accuracy(model, tokenizer, items)
    eval_s = time.perf_counter() - start
    return {
        "recipe_fingerprint": info["fingerprint"],
        "parameters": info["parameters"],
        "build_seconds": build_s,
        "build_seconds_recorded": info["build_seconds"],
        "train_seconds": info["train_seconds"],
        "reload_seconds": reload_s,
        "eval_items": eval_n,
        "eval_accuracy": result.accuracy,
        "eval_accuracy_recorded_at_build": info["eval_accuracy"],
        "eval_seconds": eval_s,
        "eval_by_size": {str(k): list(v) for k, v in result.by_size.items()},
        "final_train_loss": info["final_train_loss"],
        "solution_length_tokens": length_percentiles(length_items, tokenizer),
        "torch_threads_build": info["torch_threads"],
        "cpu_count": os.cpu_count(),
        "loadavg_1m_before": load_before[0],
        "loadavg_1m_after": os.getloadavg()[0],
        "torch_version": torch.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--eval-n", type=int, default=200, help="eval-split items to score")
    parser.add_argument("--length-items", type=int, default=10000, help="items for lengths")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    parser.add_argument("--sft-steps", type=int, help="recipe variant: SFT steps")
    parser.add_argument(
        "--prose-answer-fraction", type=float, help="recipe variant: share of prose endings"
    )
    parser.add_argument("--keep", type=Path, help="copy the built model to this new directory")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    recipe = DEFAULT_RECIPE
    if args.sft_steps is not None:
        sft = dataclasses.replace(recipe.sft, steps=args.sft_steps)
        recipe = dataclasses.replace(recipe, sft=sft)
    if args.prose_answer_fraction is not None:
        recipe = dataclasses.replace(recipe, prose_answer_fraction=args.prose_answer_fraction)
    if args.keep is not None and args.keep.exists():
        parser.error(f"--keep {args.keep}: already exists (pass a new directory)")
    figures = run(args.eval_n, args.length_items, recipe, args.keep)
    lengths = figures["solution_length_tokens"]
    print(f"build (from scratch):  {figures['build_seconds']:.1f} s")
    print(f"reload (from cache):   {figures['reload_seconds']:.2f} s")
    print(
        f"eval accuracy (greedy, N={figures['eval_items']}): {figures['eval_accuracy']:.3f} "
        f"(recorded at build: {figures['eval_accuracy_recorded_at_build']:.3f})"
    )
    print(
        f"solution length (tokens, {lengths['items']} train items): p50 {lengths['p50']:.0f}  "
        f"p90 {lengths['p90']:.0f}  p99 {lengths['p99']:.0f}  max {lengths['max']:.0f}  "
        f"(p99/p50 {lengths['p99_over_p50']:.1f})"
    )
    print(
        f"load average (1 min) before/after: {figures['loadavg_1m_before']:.1f} / "
        f"{figures['loadavg_1m_after']:.1f} on {figures['cpu_count']} CPUs"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
