"""Speculative-decoding benchmark of the native torch engine (issue: rollout engine).

Run: ``.venv/bin/python bench/specdec.py`` (CPU, built-in tiny model) or
``python bench/specdec.py --device cuda --model random:qwen2-0.5b --dtype bfloat16`` on a GPU.
It prints tables and writes ``bench/results/specdec.json``; it asserts nothing (speed targets
are read by people, never checked by tests, because the machines are shared and noisy).

What it measures, all in one process and one sitting so ratios are comparable:

1. A drafter fitted offline (``drafter.fit``) on the policy's own sampled rollouts of training
   prompts (the same pairing and loss the online trainer uses).
2. Throughput sweep: for each batch size, tokens/s of plain decoding vs SD forced on with each
   draft depth of ``--depths``, plus the mean accepted length (draft tokens accepted + 1 per
   verify step). The best depth per batch size is what the adaptive policy's bandit converges
   to, so the table reports it.
3. Long-tail batch: a batch of prompts whose lengths follow the task's heavy-tailed distribution,
   generated to completion: no SD, SD always on, and the adaptive policy (SD once the running
   batch is at most the threshold, bandit over draft depths) with the spec's default threshold
   and with the threshold calibrated from the sweep (the largest batch size at which SD was
   still faster). Wall time of the batch.

4. The history drafter on the same long-tail batch (``--no-history`` leaves it out): history
   strategies alone (no drafter forward; the index keeps each prompt's earlier rounds' answers,
   as a rollout worker keeps earlier RL steps'), SD always on and adaptive, and ``hybrid``
   (learned, history and hybrid strategies under one bandit). Every configuration reports its
   accepted length per draft source and the history index's host cost per proposal.
   ``--tail-group G`` asks every prompt G times per round (a GRPO group), so answers in
   progress draft from each other.

``--drafter-window W`` gives every SD engine ``speculative.drafterContextWindow: W``; the long-tail
batch then also runs the adaptive policy with the drafter reading the whole context, so the
effect of the window is visible in the same sitting.

``--save-drafter DIR`` keeps the fitted drafter and ``--drafter DIR`` reuses it (skips fitting).

In the sweep each configuration runs ``--repeats`` times alternating with the others and the best
time counts. The long-tail batch runs ``--tail-rounds`` rounds of different sampling seeds for
every configuration (after one warm-up round) and compares the totals. ``--no-sweep`` runs only
the long-tail part, with the ``--threshold`` given.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from longtail_api.policies import DrafterKind, SelectorSpec, SpeculativeSpec, StrategySpec
from longtail_workers.drafter.checkpoint import load_drafter, save_drafter
from longtail_workers.drafter.model import EagleDrafter, layout_options
from longtail_workers.engine.interface import GenerationRequest, GenerationResult
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
from longtail_workers.engine.stats import RolloutStats
from longtail_workers.models.loading import load_policy
from longtail_workers.tasks import arith
from longtail_workers.warmstart.fit import collect_training_sequences, fit_drafter

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class RunFigures:
    """One timed generation of a batch."""

    seconds: float
    tokens: int
    tokens_per_s: float
    mean_accepted_length: float | None
    sd_steps: int


def load_target(args: argparse.Namespace) -> tuple[torch.nn.Module, object, str]:
    """The target model, its tokenizer and an identifier for the drafter config."""
    if args.model.startswith("random:"):
        from transformers import Qwen2Config, Qwen2ForCausalLM

        # GPU scale check without downloadable weights: Qwen2-0.5B's layer shape, random
        # weights, the built-in byte tokenizer (the drafter is fitted to whatever the model
        # emits). 36 layers instead of 24 keep it >= 0.5B parameters without the 151k vocab.
        _, tok = load_policy("builtin:tiny", dtype="float32", device="cpu")
        cfg = Qwen2Config(
            vocab_size=len(tok),
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=36,
            num_attention_heads=14,
            num_key_value_heads=2,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            attn_implementation="sdpa",
        )
        torch.manual_seed(0)
        dtype = getattr(torch, args.dtype) if args.dtype != "auto" else torch.bfloat16
        model = Qwen2ForCausalLM(cfg).to(device=args.device, dtype=dtype).eval()
        return model, tok, args.model
    model, tok = load_policy(args.model, dtype=args.dtype, device=args.device)
    return model, tok, args.model


def requests_for(
    tok: object, items: list[arith.TaskItem], max_new: int, temperature: float, seed: int
) -> list[GenerationRequest]:
    eos = tok.eos_token_id  # type: ignore[attr-defined]
    return [
        GenerationRequest(
            prompt_token_ids=tok.encode(it.prompt, add_special_tokens=False),  # type: ignore[attr-defined]
            max_new_tokens=max_new,
            temperature=temperature,
            seed=seed + i,
            stop_token_ids=(eos,),
            request_id=str(i),
        )
        for i, it in enumerate(items)
    ]


def sd_spec(
    threshold: int,
    warmup: int,
    depths: list[int],
    bandit: bool,
    drafters: tuple[DrafterKind, ...] = ("learned",),
) -> SpeculativeSpec:
    selector = SelectorSpec(
        type="bandit" if bandit else "fixed",
        epsilon=0.1,
        window=50,
        buckets=[1, 2, 4, 8, 16, 32, 64],
    )
    return SpeculativeSpec(
        enabled=True,
        batch_threshold=threshold,
        warmup_steps=warmup,
        strategies=[StrategySpec(draft_depth=k, drafter=d) for d in drafters for k in depths],
        selector=selector,
    )


def timed(engine: TorchEngine, reqs: list[GenerationRequest], device: str) -> RunFigures:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        results: list[GenerationResult] = engine.generate(reqs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    tokens = sum(len(r.output_token_ids) for r in results)
    steps = sum(r.spec_steps for r in results)
    accepted = sum(r.accepted_tokens for r in results)
    mal = (accepted + steps) / steps if steps else None  # accepted drafts + 1 per verify step
    return RunFigures(dt, tokens, tokens / dt, mal, steps)


def best(runs: list[RunFigures]) -> RunFigures:
    return min(runs, key=lambda r: r.seconds)


def fit(
    model: torch.nn.Module,
    tok: object,
    target_id: str,
    args: argparse.Namespace,
    layout: str = "longtail",
) -> tuple[EagleDrafter, dict]:
    """A drafter in ``layout`` fitted on the policy's own sampled answers to training prompts."""
    plain = TorchEngine(model, config=EngineConfig(max_running=64))
    items = arith.generate(args.fit_prompts, seed=1, split="train")
    t0 = time.perf_counter()
    seqs = collect_training_sequences(
        plain, requests_for(tok, items, args.fit_max_new, args.temperature, seed=10_000)
    )
    t_collect = time.perf_counter() - t0
    drafter = EagleDrafter(model, target_id=target_id, seed=0, **layout_options(layout))
    drafter.to(args.device)
    t0 = time.perf_counter()
    report = fit_drafter(drafter, seqs, steps=args.fit_steps, batch_size=16, seed=0)
    t_fit = time.perf_counter() - t0
    drafter.eval()
    return drafter, {
        "sequences": len(seqs),
        "collect_s": t_collect,
        "fit_s": t_fit,
        "steps": args.fit_steps,
        "loss_first": report.total[0],
        "loss_last": report.total[-1],
    }


def sd_config(max_running: int, args: argparse.Namespace) -> EngineConfig:
    """Engine settings of the SD engines: the drafter's context window from ``--drafter-window``."""
    return EngineConfig(max_running=max_running, drafter_context_window=args.drafter_window or None)


def sweep(
    model: torch.nn.Module, tok: object, drafter: EagleDrafter, args: argparse.Namespace
) -> list[dict]:
    rows = []
    # Several batches' worth of prompts per batch size (admitted as rows finish, so the running
    # batch stays at bs): one batch of one prompt runs for a fraction of a second, too short to
    # time on a shared machine.
    items = arith.generate(max(sweep_prompts(bs) for bs in args.batch_sizes), seed=2, split="eval")
    for bs in args.batch_sizes:
        reqs = requests_for(
            tok, items[: sweep_prompts(bs)], args.max_new_tokens, args.temperature, seed=20_000
        )
        plain = TorchEngine(model, config=EngineConfig(max_running=bs))
        sds = {
            k: TorchEngine(
                model,
                config=sd_config(bs, args),
                drafter=drafter,
                speculative=sd_spec(10**6, 0, [k], bandit=False),
            )
            for k in args.depths
        }
        p_runs: list[RunFigures] = []
        s_runs: dict[int, list[RunFigures]] = {k: [] for k in sds}
        for _ in range(args.repeats):  # alternate, so drift in machine load hits all alike
            p_runs.append(timed(plain, reqs, args.device))
            for k, eng in sds.items():
                s_runs[k].append(timed(eng, reqs, args.device))
        p = best(p_runs)
        by_depth = {k: best(r) for k, r in s_runs.items()}
        k_best = max(by_depth, key=lambda k: by_depth[k].tokens_per_s)
        s = by_depth[k_best]
        rows.append(
            {
                "batch": bs,
                "plain_tok_s": p.tokens_per_s,
                "best_depth": k_best,
                "sd_tok_s": s.tokens_per_s,
                "speedup": s.tokens_per_s / p.tokens_per_s,
                "mean_accepted_length": s.mean_accepted_length,
                "by_depth": {
                    str(k): {**asdict(f), "speedup": f.tokens_per_s / p.tokens_per_s}
                    for k, f in by_depth.items()
                },
                "plain": asdict(p),
            }
        )
        per_k = "  ".join(
            f"k={k}: x{f.tokens_per_s / p.tokens_per_s:4.2f} "
            f"(acc {f.mean_accepted_length or 0:3.1f})"
            for k, f in by_depth.items()
        )
        print(
            f"  bs={bs:>3}  plain {p.tokens_per_s:7.1f} tok/s  best SD(k={k_best}) "
            f"{s.tokens_per_s:7.1f} tok/s  x{s.tokens_per_s / p.tokens_per_s:4.2f}   [{per_k}]",
            flush=True,
        )
    return rows


def sweep_prompts(batch_size: int) -> int:
    """Prompts timed at one batch size of the sweep."""
    return max(2 * batch_size, 16)


def calibrated_threshold(rows: list[dict], margin: float = 1.0) -> int:
    """Largest batch size of the sweep up to which SD was faster by ``margin`` at every size.

    What an operator would set ``speculative.batchThreshold`` to after running this benchmark
    on their hardware; 1 if SD never paid off.
    """
    threshold = 1
    for row in sorted(rows, key=lambda r: r["batch"]):
        if row["speedup"] < margin:
            break
        threshold = row["batch"]
    return threshold


def long_tail(
    model: torch.nn.Module,
    tok: object,
    drafter: EagleDrafter,
    args: argparse.Namespace,
    calibrated: int,
) -> dict:
    prompts = arith.generate(args.tail_batch, seed=3, split="eval")
    items = [it for it in prompts for _ in range(args.tail_group)]  # a group per prompt
    n = len(items)
    depths = args.depths

    def sd_engine(
        threshold: int,
        warmup: int,
        config: EngineConfig | None = None,
        drafters: tuple[DrafterKind, ...] = ("learned",),
    ) -> TorchEngine:
        spec = sd_spec(threshold, warmup, depths, bandit=True, drafters=drafters)
        config = config or sd_config(n, args)
        learned = drafter if drafters != ("history",) else None  # history alone needs none
        return TorchEngine(model, config=config, drafter=learned, speculative=spec)

    engines = {
        "no_sd": TorchEngine(model, config=EngineConfig(max_running=n)),
        "sd_always": sd_engine(10**6, 0),
        "adaptive": sd_engine(args.threshold, 2),
    }
    if calibrated != args.threshold:
        engines["adaptive_calibrated"] = sd_engine(calibrated, 2)
    if args.drafter_window:
        whole = EngineConfig(max_running=n)
        engines["adaptive_whole_context"] = sd_engine(args.threshold, 2, whole)
    if not args.no_history:
        engines["history_always"] = sd_engine(10**6, 0, drafters=("history",))
        engines["history_adaptive"] = sd_engine(args.threshold, 2, drafters=("history",))
        hybrid: tuple[DrafterKind, ...] = ("learned", "history", "hybrid")
        engines["hybrid_adaptive"] = sd_engine(args.threshold, 2, drafters=hybrid)
    # Sampled answers differ between configurations (SD is lossless in distribution, not per
    # sample), and a batch's wall time hangs on its longest answers. So every configuration
    # runs the same rounds of sampling seeds, in rotated order, and the totals are compared.
    # Round 0 is a warm-up (allocator, bandit arms) and is not counted; the engines persist
    # across rounds as a rollout engine does across RL steps.
    totals: dict[str, list[RunFigures]] = {k: [] for k in engines}
    names = list(engines)
    for r in range(args.tail_rounds + 1):
        reqs = requests_for(tok, items, args.tail_max_new, args.temperature, seed=30_000 + 1000 * r)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if r == 1:
                engines[name].stats.reset()  # per-bucket figures count the counted rounds only
            fig = timed(engines[name], reqs, args.device)
            if r > 0:
                totals[name].append(fig)
    out: dict = {}
    for name, figs in totals.items():
        seconds, tokens = sum(f.seconds for f in figs), sum(f.tokens for f in figs)
        out[name] = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}
        out[name]["rounds"] = [asdict(f) for f in figs]
        out[name].update(draft_sources(engines[name].stats))
    base = out["no_sd"]["seconds"]
    for name, fig in out.items():
        fig["speedup_vs_no_sd"] = base / fig["seconds"]
        by_source = "  ".join(
            f"{src} acc {s['mean_accepted_length']:4.2f} ({100 * s['token_share']:3.0f}%)"
            for src, s in fig["by_source"].items()
        )
        cost = fig["history_us_per_proposal"]
        print(
            f"  {name:<22} {fig['seconds']:7.2f} s  {fig['tokens']:6d} tokens  "
            f"{fig['tokens_per_s']:7.1f} tok/s  x{fig['speedup_vs_no_sd']:4.2f} vs no-SD  "
            f"{by_source}" + (f"  history {cost:.1f} us/row" if cost else ""),
            flush=True,
        )
    for name in [k for k in out if k.startswith("adaptive")]:
        out[f"{name}_vs_sd_always"] = out["sd_always"]["seconds"] / out[name]["seconds"]
    out["by_running_batch"] = by_running_batch({k: e.stats for k, e in engines.items()})
    out["batch"] = {
        "prompts": n,
        "rounds": args.tail_rounds,
        "threshold": args.threshold,
        "calibrated_threshold": calibrated,
        "drafter_window": args.drafter_window or None,
    }
    return out


def draft_sources(st: RolloutStats) -> dict:
    """Accepted length and share of SD tokens per draft source, and the history index's host
    cost per proposal (microseconds; 0 without history proposals)."""
    total = sum(st.source_sd_tokens.values()) or 1
    return {
        "by_source": {
            src: {
                "mean_accepted_length": st.source_mean_accepted_length(src),
                "token_share": st.source_sd_tokens[src] / total,
            }
            for src in sorted(st.source_sd_tokens)
        },
        "history_us_per_proposal": (
            1e6 * st.history_propose_s / st.history_proposals if st.history_proposals else 0.0
        ),
    }


def by_running_batch(stats: dict[str, RolloutStats]) -> list[dict]:
    """Where each configuration's time went, by running-batch bucket (prefill apart).

    Per bucket: seconds and tokens/s of every configuration, the share of the no-SD time, and
    each configuration's tokens/s over no-SD's there (answers differ, so rates, not seconds).
    """

    def sums(st: RolloutStats) -> dict[int, tuple[float, int]]:
        acc: dict[int, tuple[float, int]] = {}
        for key, sec in st.bucket_seconds.items():  # plain and SD steps of a bucket together
            s0, t0 = acc.get(key[1], (0.0, 0))
            acc[key[1]] = (s0 + sec, t0 + int(st.bucket_tokens[key]))
        return acc

    per = {name: sums(st) for name, st in stats.items()}
    base = per["no_sd"]
    total = sum(sec for sec, _ in base.values()) or 1.0
    rows = []
    print("  by running sequences (bucket: no-SD share of time; tokens/s vs no-SD per config):")
    for bucket in sorted({b for p in per.values() for b in p}):
        row: dict = {"bucket": "prefill" if bucket == 0 else f"<={bucket}"}
        b_sec, b_tok = base.get(bucket, (0.0, 0))
        row["no_sd_share"] = b_sec / total
        line = f"    {row['bucket']:>8}  {100 * row['no_sd_share']:5.1f}%"
        for name, p in per.items():
            sec, tok = p.get(bucket, (0.0, 0))
            row[name] = {"seconds": sec, "tokens": tok}
            if name != "no_sd" and sec > 0 and b_sec > 0 and b_tok > 0:
                row[name]["speedup"] = (tok / sec) / (b_tok / b_sec)
                line += f"  {name} x{row[name]['speedup']:4.2f}"
        rows.append(row)
        print(line, flush=True)
    return rows


def write_results(args: argparse.Namespace, **sections: object) -> None:
    """Write the machine, the arguments and ``sections`` to ``args.out`` as JSON."""
    result = {
        "machine": {
            "device": args.device,
            "threads": args.threads,
            "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        },
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        **sections,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument(
        "--depths",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[2, 4, 6, 8],
        help="draft depths k: each is timed in the sweep; the adaptive bandit picks among them",
    )
    ap.add_argument(
        "--batch-sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 2, 4, 8, 16, 32, 64],
    )
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--fit-prompts", type=int, default=2048)
    ap.add_argument("--fit-max-new", type=int, default=512)
    ap.add_argument("--fit-steps", type=int, default=1000)
    ap.add_argument("--tail-batch", type=int, default=64)
    ap.add_argument("--tail-max-new", type=int, default=512)
    ap.add_argument("--tail-rounds", type=int, default=16, help="seed rounds, summed")
    ap.add_argument(
        "--tail-group", type=int, default=1, help="long tail: answers per prompt in a round"
    )
    ap.add_argument(
        "--no-history", action="store_true", help="long tail: leave out the history drafter"
    )
    ap.add_argument("--no-sweep", action="store_true", help="only the long-tail batch")
    ap.add_argument("--threshold", type=int, default=32, help="adaptive: SD when running <= this")
    ap.add_argument(
        "--drafter-window",
        type=int,
        default=0,
        help="speculative.drafterContextWindow of every SD engine (0: the whole context); when "
        "set, the long-tail batch also runs adaptive with the whole context for comparison",
    )
    ap.add_argument("--repeats", type=int, default=3, help="sweep: best of this many runs")
    ap.add_argument("--out", type=Path, default=RESULTS / "specdec.json")
    ap.add_argument("--drafter", type=Path, help="load this fitted drafter instead of fitting")
    ap.add_argument("--save-drafter", type=Path, help="save the fitted drafter here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok, target_id = load_target(args)
    print(
        f"target {target_id} on {args.device}: "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params",
        flush=True,
    )
    if args.drafter is not None:
        drafter = load_drafter(args.drafter, model, target_id=target_id).to(args.device).eval()
        fit_info: dict = {"loaded_from": str(args.drafter)}
    else:
        print("fitting drafter ...", flush=True)
        drafter, fit_info = fit(model, tok, target_id, args)
        if args.save_drafter is not None:
            save_drafter(drafter, args.save_drafter)
    print(f"  {fit_info}", flush=True)
    print(f"throughput sweep (T={args.temperature}, {args.max_new_tokens} new tokens max):")
    rows = [] if args.no_sweep else sweep(model, tok, drafter, args)
    calibrated = args.threshold if args.no_sweep else calibrated_threshold(rows)
    print(
        f"long-tail batch ({args.tail_batch} prompts; adaptive threshold {args.threshold}, "
        f"calibrated from the sweep {calibrated}):"
    )
    tail = long_tail(model, tok, drafter, args, calibrated)
    write_results(args, fit=fit_info, sweep=rows, long_tail=tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
