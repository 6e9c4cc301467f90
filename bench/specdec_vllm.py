"""Torch engine vs vLLM engine, with and without speculative decoding, side by side.

Run: ``.venv/bin/python bench/specdec_vllm.py`` (CPU, built-in tiny model, vLLM's CPU build).
It prints a table and writes ``bench/results/specdec_vllm.json``; it asserts nothing (figures are
read by people: the machines are shared and noisy). A quick look (a few minutes on 2 cores):
``--fit-prompts 64 --fit-max-new 128 --fit-steps 50 --tail-batch 16 --tail-max-new 64
--repeats 1 --tail-rounds 1``.

One process, one sitting, the same requests (prompts and sampling seeds) for every configuration:
torch no-SD, torch SD, vLLM no-SD, vLLM SD. Both SD engines draft with the same EAGLE-1 drafter
(``eagle1`` layout, the one vLLM serves exactly), fitted here as ``bench/specdec.py`` fits its
own, or loaded with ``--drafter DIR``.

* Small batches: ``--sweep-prompts`` requests run in sequence as batches of each
  ``--batch-sizes`` (one ``generate`` per batch), SD forced on at depth ``--depth``; best of
  ``--repeats``, configurations alternating.
* Long-tail batch: ``--tail-batch`` prompts of the built-in arith task at once, up to
  ``--tail-max-new`` tokens; SD as a job sets it (on once at most ``--threshold`` answers still
  run, depth ``--depth``); ``--tail-rounds`` rounds of different seeds, summed.

A vLLM engine is slow to start, so there are two, built once: no-SD, and SD with the
long-tail spec (vLLM's depth is fixed at start; at batch sizes up to ``--threshold`` that spec
speculates on every step, as forced SD does). vLLM ignores the spec's warm-up latch. vLLM's
times include ``VllmEngine``'s torch forward over each answer (the log-probs of the contract).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from longtail_workers.drafter.checkpoint import load_drafter, save_drafter
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
from longtail_workers.engine.vllm.vllm_engine import VllmEngine, VllmEngineConfig
from longtail_workers.models.loading import resolve_model_path
from longtail_workers.tasks import arith

sys.path.insert(0, str(Path(__file__).resolve().parent))
from specdec import (
    RESULTS,
    RunFigures,
    fit,
    load_target,
    requests_for,
    sd_spec,
    timed,
    write_results,
)

Engine = TorchEngine | VllmEngine
CONFIGS = ("torch no-SD", "torch SD", "vLLM no-SD", "vLLM SD")


def in_batches(engine: Engine, reqs: list[GenerationRequest], bs: int, device: str) -> RunFigures:
    """``reqs`` generated ``bs`` at a time, one after the other; the figures summed."""
    return summed([timed(engine, reqs[i : i + bs], device) for i in range(0, len(reqs), bs)])


def summed(figs: list[RunFigures]) -> RunFigures:
    seconds, tokens = sum(f.seconds for f in figs), sum(f.tokens for f in figs)
    steps = sum(f.sd_steps for f in figs)
    gained = sum((f.mean_accepted_length or 0.0) * f.sd_steps for f in figs)  # accepted + steps
    return RunFigures(seconds, tokens, tokens / seconds, gained / steps if steps else None, steps)


def report(workload: str, figs: dict[str, RunFigures]) -> list[dict]:
    """Table lines of one workload (printed) and their JSON rows."""
    base = figs["torch no-SD"].tokens_per_s
    rows = []
    for name, f in figs.items():
        x_torch = f.tokens_per_s / base
        x_own = f.tokens_per_s / figs[name.replace(" SD", " no-SD")].tokens_per_s
        rows.append({"workload": workload, "config": name, **asdict(f)})
        rows[-1] |= {"speedup_vs_torch_no_sd": x_torch, "speedup_vs_own_no_sd": x_own}
        acc = f"{f.mean_accepted_length:7.2f}" if f.mean_accepted_length else "      -"
        print(
            f"{workload:<14} {name:<12} {f.tokens_per_s:9.1f} {acc} {f.seconds:8.2f} "
            f"{f.tokens:7d} {x_torch:7.2f} {x_own:7.2f}",
            flush=True,
        )
    return rows


def run(args: argparse.Namespace, engines: dict[str, Engine], tok: object) -> list[dict]:
    print(
        f"\n{'workload':<14} {'config':<12} {'tok/s':>9} {'acc.len':>7} {'wall s':>8} "
        f"{'tokens':>7} {'x torch':>7} {'x no-SD':>7}"
    )
    rows: list[dict] = []
    items = arith.generate(args.sweep_prompts, seed=2, split="eval")
    for bs in args.batch_sizes:
        reqs = requests_for(tok, items, args.max_new_tokens, args.temperature, seed=20_000)
        runs: dict[str, list[RunFigures]] = {name: [] for name in CONFIGS}
        for _ in range(args.repeats):  # alternate, so drift in machine load hits all alike
            for name in CONFIGS:
                runs[name].append(in_batches(engines[name], reqs, bs, args.device))
        best = {name: min(r, key=lambda f: f.seconds) for name, r in runs.items()}
        rows += report(f"batch {bs}", best)
    items = arith.generate(args.tail_batch, seed=3, split="eval")
    tail = {**engines, "torch SD": engines["torch tail-SD"]}  # vLLM SD runs the tail spec
    totals: dict[str, list[RunFigures]] = {name: [] for name in CONFIGS}
    for r in range(args.tail_rounds):  # rotated order, one seed set per round
        reqs = requests_for(tok, items, args.tail_max_new, args.temperature, 30_000 + 1000 * r)
        for name in CONFIGS[r % 4 :] + CONFIGS[: r % 4]:
            totals[name].append(timed(tail[name], reqs, args.device))
    rows += report(f"tail {args.tail_batch}", {name: summed(f) for name, f in totals.items()})
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="builtin:tiny", help="builtin: name or local HF directory")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2, help="torch threads and vLLM's worker's")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--depth", type=int, default=4, help="draft depth of every SD engine")
    ap.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    ap.add_argument("--sweep-prompts", type=int, default=8, help="requests per batch size")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="small batches")
    ap.add_argument("--repeats", type=int, default=3, help="small batches: best of this many")
    ap.add_argument("--tail-batch", type=int, default=64)
    ap.add_argument("--tail-max-new", type=int, default=512)
    ap.add_argument("--tail-rounds", type=int, default=2, help="seed rounds, summed")
    ap.add_argument("--threshold", type=int, default=32, help="tail: SD when running <= this")
    ap.add_argument("--fit-prompts", type=int, default=2048)
    ap.add_argument("--fit-max-new", type=int, default=512)
    ap.add_argument("--fit-steps", type=int, default=1000)
    ap.add_argument("--drafter", type=Path, help="load this eagle1 drafter instead of fitting")
    ap.add_argument("--save-drafter", type=Path, help="save the fitted drafter here")
    ap.add_argument("--out", type=Path, default=RESULTS / "specdec_vllm.json")
    args = ap.parse_args(argv)
    if args.threshold < max(args.batch_sizes):
        ap.error("--threshold must be >= the largest --batch-sizes (vLLM's SD engine serves both)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok, _ = load_target(args)
    print(f"target {args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params")
    if args.drafter is not None:
        drafter = load_drafter(args.drafter, model, target_id=args.model).eval()
        fit_info: dict = {"loaded_from": str(args.drafter)}
    else:
        print("fitting eagle1 drafter ...", flush=True)
        drafter, fit_info = fit(model, tok, args.model, args, layout="eagle1")
        if args.save_drafter is not None:
            save_drafter(drafter, args.save_drafter)
    print(f"  {fit_info}", flush=True)
    n = max(args.tail_batch, *args.batch_sizes)
    forced = sd_spec(10**6, 0, [args.depth], bandit=False)
    tail_spec = sd_spec(args.threshold, 2, [args.depth], bandit=False)
    cfg = EngineConfig(max_running=n)
    vcfg = VllmEngineConfig(max_running=n, threads=args.threads)
    model_dir = resolve_model_path(args.model)
    engines: dict[str, Engine] = {
        "torch no-SD": TorchEngine(model, config=cfg),
        "torch SD": TorchEngine(model, config=cfg, drafter=drafter, speculative=forced),
        "torch tail-SD": TorchEngine(model, config=cfg, drafter=drafter, speculative=tail_spec),
    }
    print("starting vLLM engines ...", flush=True)
    t0 = time.perf_counter()
    vllm: list[VllmEngine] = []
    try:
        vllm.append(VllmEngine(model, model_dir, config=vcfg))
        vllm.append(
            VllmEngine(model, model_dir, speculative=tail_spec, drafter=drafter, config=vcfg)
        )
        engines |= {"vLLM no-SD": vllm[0], "vLLM SD": vllm[1]}
        print(f"  {time.perf_counter() - t0:.1f} s; warming up", flush=True)
        warm = requests_for(tok, arith.generate(2, seed=4, split="eval"), 16, args.temperature, 9)
        for eng in engines.values():
            timed(eng, warm, args.device)
        rows = run(args, engines, tok)
    finally:
        for eng in vllm:
            eng.close()
    write_results(args, fit=fit_info, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
