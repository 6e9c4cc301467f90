"""Benchmark: a static drafter vs the spot-trained (adaptive) drafter under policy drift.

Run: ``.venv/bin/python bench/drafter.py`` (``--quick`` for a smoke run, ``--help`` for knobs).
Writes ``bench/results/drafter.json`` and prints a table.

Setup. The policy is ``builtin:tiny`` (the built-in arithmetic model) when it is built, else a
random tiny Qwen2 (``--model`` picks). Policy drift is simulated by fine-tuning the policy with a
few SFT steps between versions on a shifted task: for ``builtin:tiny``, version ``v`` trains on
``builtin:arith`` items whose operands grow with ``v`` (larger numbers, more digits per line);
for the random model, on samples of a Markov chain over its vocabulary whose transitions
change gradually (8 of 64 per version, see ``successors``). Both
drafters start from the same version-0 drafter, fitted once on version-0 rollouts:

* static:   that drafter, forever;
* adaptive: the real Longtail path. A ``RolloutWorker`` generates version ``v``'s rollout with
  the newest published drafter (capturing tokens + hidden states), is switched to
  ``drafter-train`` (``set_role``), trains until ``--spot-steps`` optimizer steps are done, is
  switched back to ``rollout`` (preempting the trainer), submits its candidate, and the merge
  publishes version d+1, which the worker loads at the start of the next rollout.

Acceptance is measured on the same requests (same seeds, temperature 1) for both drafters at
every version, with the drafter trained on rollouts up to version v-1 (as in RL: this step's
drafter was trained in the previous step's tail). Overheads reported: role-switch (window
start/stop) latency, p50/p95 stop latency over ``--stop-trials`` stop requests, optimizer steps
per second. The target (printed, not asserted) is adaptive >= 1.3x static after 8 versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from longtail_api.policies import DrafterTrainingSpec, SelectorSpec, SpeculativeSpec, StrategySpec
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.registry import DrafterRegistry
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.rollout.control import RolloutWorker
from longtail_workers.tasks.arith import ArithConfig, generate

RESULTS = Path(__file__).resolve().parent / "results" / "drafter.json"
RANDOM_VOCAB = 64


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model",
        default="auto",
        help="builtin:tiny (built on first use), random, or auto: builtin:tiny if already built",
    )
    ap.add_argument("--versions", type=int, default=8, help="policy versions after version 0")
    ap.add_argument("--prompts", type=int, default=24, help="rollout prompts per version")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--draft-depth", type=int, default=4)
    ap.add_argument("--static-steps", type=int, default=300, help="fit of the version-0 drafter")
    ap.add_argument("--spot-steps", type=int, default=60, help="spot steps per version")
    ap.add_argument("--sft-steps", type=int, default=25, help="policy SFT steps per version")
    ap.add_argument("--sft-lr", type=float, default=2e-3)
    ap.add_argument("--stop-trials", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, a smoke run")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.quick:
        args.versions, args.prompts, args.max_new_tokens = 2, 6, 48
        args.static_steps, args.spot_steps, args.sft_steps, args.stop_trials = 20, 10, 3, 10
    return args


def load_model(spec: str) -> tuple[torch.nn.Module, Any, str]:
    """(policy, tokenizer or None, target id)."""
    if spec == "auto":
        from longtail_workers.models.builtin import BUILD_INFO_FILE, tiny_dir

        spec = "builtin:tiny" if (tiny_dir() / BUILD_INFO_FILE).is_file() else "random"
        print(f"--model auto: using {spec}", flush=True)
    if spec == "random":
        # The random tiny Qwen2 is the tests' double (tests/doubles/tiny_targets.py): bench/ and
        # tests/ are both development trees, and no shipped code needs a random model.
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "doubles"))
        from tiny_targets import tiny_qwen2

        model = tiny_qwen2(seed=0, vocab_size=RANDOM_VOCAB, hidden_size=128, sharpness=20.0)
        return model, None, "random"
    from longtail_workers.models.loading import load_policy

    model, tokenizer = load_policy(spec, dtype="float32", device="cpu")
    return model, tokenizer, spec


def task(version: int) -> ArithConfig:
    """Version v's task: operands grow with v (the drift the policy is fine-tuned towards)."""
    return ArithConfig(max_operand=20 + 60 * version, max_operands=16)


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def requests_for(version: int, tokenizer: Any, n: int, args: argparse.Namespace, salt: int = 0):
    if tokenizer is None:  # random model: random prompts
        gen = torch.Generator().manual_seed(1000 * version + salt)
        prompts = [torch.randint(0, RANDOM_VOCAB, (4,), generator=gen).tolist() for _ in range(n)]
        stop: list[int] = []
    else:
        items = generate(n, seed=1000 * version + salt, split="eval", config=task(version))
        prompts = [encode(tokenizer, it.prompt) for it in items]
        stop = [int(tokenizer.eos_token_id)]
    return [
        GenerationRequest(p, args.max_new_tokens, temperature=1.0, seed=i, stop_token_ids=stop)
        for i, p in enumerate(prompts)
    ]


def successors(version: int) -> torch.Tensor:
    """``[V]`` version v's successor map: the base permutation with 8 more tokens re-mapped
    per version (gradual drift: v and v+1 differ in 8 of 64 transitions, v and 0 in 8v)."""
    gen = torch.Generator().manual_seed(1234)
    base = torch.randperm(RANDOM_VOCAB, generator=gen)
    alt = torch.randperm(RANDOM_VOCAB, generator=gen)
    order = torch.randperm(RANDOM_VOCAB, generator=gen)
    changed = torch.zeros(RANDOM_VOCAB, dtype=torch.bool)
    changed[order[: 8 * version]] = True
    return torch.where(changed, alt, base)


def chain_batch(version: int, step: int, n: int = 16, length: int = 48) -> torch.Tensor:
    """``[n, length]`` samples of version v's Markov chain (the random model's "task"):
    the successor of ``x`` is ``successors(v)[x]`` with probability 0.85, else uniform."""
    gen = torch.Generator().manual_seed(10_000 * version + step)
    succ = successors(version)
    seq = torch.empty(n, length, dtype=torch.long)
    seq[:, 0] = torch.randint(0, RANDOM_VOCAB, (n,), generator=gen)
    for t in range(1, length):
        follow = torch.rand(n, generator=gen) < 0.85
        noise = torch.randint(0, RANDOM_VOCAB, (n,), generator=gen)
        seq[:, t] = torch.where(follow, succ[seq[:, t - 1]], noise)
    return seq


def drift(model, tokenizer, version: int, optimizer, args: argparse.Namespace) -> float:
    """A few SFT steps towards version ``version``'s task (random model: its Markov chain)."""
    model.train()
    loss = torch.zeros(())
    steps = args.sft_steps * (3 if version == 0 else 1)  # version 0: settle on the task first
    for step in range(steps):
        if tokenizer is None:
            ids = chain_batch(version, step)
            loss = model(input_ids=ids, labels=ids).loss
        else:
            items = generate(16, seed=10_000 * version + step, config=task(version))
            eos = int(tokenizer.eos_token_id)
            texts = [[*encode(tokenizer, it.prompt + it.solution), eos] for it in items]
            width = max(len(t) for t in texts)
            ids = torch.full((len(texts), width), int(tokenizer.pad_token_id))
            labels = torch.full((len(texts), width), -100)
            for r, t in enumerate(texts):
                ids[r, : len(t)] = torch.tensor(t)
                labels[r, : len(t)] = torch.tensor(t)
            loss = model(input_ids=ids, attention_mask=(labels != -100).long(), labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.eval()
    return float(loss.detach())


def mean_accepted(engine: TorchEngine, requests) -> float:
    engine.stats.reset()
    engine.generate(requests)
    return engine.stats.mean_accepted_length


def spot_window(worker: RolloutWorker, registry: DrafterRegistry, steps: int, model, tid: str):
    """drafter-train until ``steps`` steps are done, back to rollout (which submits the
    window's candidate), merge, publish."""
    trainer = worker.trainer
    assert trainer is not None
    start_ack = worker.role.set_role("drafter-train")
    deadline = time.monotonic() + 600
    while trainer.status().window_steps < steps and trainer.state == "training":
        if time.monotonic() > deadline:
            raise TimeoutError("spot window did not reach its steps in 600 s")
        time.sleep(0.002)
    stop_ack = worker.role.set_role("rollout")
    trainer.raise_if_failed()
    window = trainer.last_window
    published = registry.merge_candidates(model, target_id=tid)
    return start_ack, stop_ack, window, published


def stop_latencies(worker: RolloutWorker, trials: int) -> dict[str, float]:
    trainer = worker.trainer
    assert trainer is not None
    rng, lat, step_s = random.Random(0), [], []
    for _ in range(trials):
        trainer.start()
        time.sleep(rng.uniform(0.0, 0.05))
        trainer.request_stop()
        assert trainer.wait_stopped(30.0)
        w = trainer.last_window
        lat.append(w.stop_latency_s)
        if w.steps:
            step_s.append(w.duration_s / w.steps)
    lat.sort()
    return {
        "trials": trials,
        "p50_s": statistics.median(lat),
        "p95_s": lat[max(0, round(0.95 * len(lat)) - 1)],
        "max_s": lat[-1],
        "mean_step_s": statistics.mean(step_s) if step_s else float("nan"),
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t_start = time.perf_counter()
    model, tokenizer, tid = load_model(args.model)
    spec = SpeculativeSpec(
        enabled=True,
        batch_threshold=1024,
        warmup_steps=0,
        strategies=[StrategySpec(draft_depth=args.draft_depth)],
        selector=SelectorSpec(type="fixed"),
    )
    training = DrafterTrainingSpec(
        learning_rate=1e-3, window_tokens=128, max_steps_per_window=max(args.static_steps, 10**4)
    )
    scratch = tempfile.TemporaryDirectory(prefix="longtail-bench-drafter-")  # removed at exit
    registry = DrafterRegistry(scratch.name)
    engine = TorchEngine(model, speculative=spec, drafter=EagleDrafter(model, target_id=tid))
    worker = RolloutWorker(
        engine, target_id=tid, name="bench-0", training=training, registry=registry
    )

    # Version 0: settle the policy on its task, capture rollouts (3x the usual count), fit the
    # drafter once, publish it.
    sft = torch.optim.AdamW(model.parameters(), lr=args.sft_lr)
    v0_sft_loss = drift(model, tokenizer, 0, sft, args)
    for salt in range(3):
        worker.generate(requests_for(0, tokenizer, args.prompts, args, salt=100 + salt), step=0)
    _, _, fit_window, v0 = spot_window(worker, registry, args.static_steps, model, tid)
    static_drafter, _ = registry.load(model, target_id=tid, version=v0.version)
    static = TorchEngine(model, speculative=spec, drafter=static_drafter)

    rows, windows = [], [fit_window]
    for v in range(args.versions + 1):
        sft_loss = drift(model, tokenizer, v, sft, args) if v > 0 else v0_sft_loss
        worker.begin_step(step=v, policy_version=v)
        reqs = requests_for(v, tokenizer, args.prompts, args)
        static_len = mean_accepted(static, reqs)
        worker.engine.stats.reset()
        results = worker.generate(reqs, step=v)
        spot_len = worker.engine.stats.mean_accepted_length
        used = worker.drafter_version
        start_ack, stop_ack, window, pub = spot_window(
            worker, registry, args.spot_steps, model, tid
        )
        windows.append(window)
        rows.append(
            {
                "policy_version": v,
                "sft_loss": sft_loss,
                "drafter_version_used": used,
                "static_accepted_length": static_len,
                "spot_accepted_length": spot_len,
                "ratio": spot_len / static_len if static_len else None,
                "response_tokens": sum(len(r.output_token_ids) for r in results),
                "window_steps": window.steps,
                "window_train_loss": window.mean_loss,
                "published_version": pub.version if pub else None,
                "heldout_top1": pub.meta.heldout_top1 if pub else None,
                "start_switch_s": start_ack.switch_seconds,
                "stop_switch_s": stop_ack.switch_seconds,
            }
        )
        r = rows[-1]
        print(
            f"v{v}: static {static_len:.3f}  spot {spot_len:.3f} (drafter v{used})  "
            f"ratio {r['ratio']:.2f}  top1 {r['heldout_top1']}",
            flush=True,
        )

    stops = stop_latencies(worker, args.stop_trials)
    trained = [w for w in windows[1:] if w.steps]
    steps_per_s = sum(w.steps for w in trained) / sum(w.duration_s for w in trained)
    pairs_per_s = sum(w.pairs for w in trained) / sum(w.duration_s for w in trained)
    summary = summarise(rows, args, stops, steps_per_s, pairs_per_s, time.perf_counter() - t_start)
    print_table(rows, summary)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    config = vars(args) | {"out": str(args.out), "model": tid}
    report = {"config": config, "rows": rows, "summary": summary}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def summarise(rows, args, stops, steps_per_s, pairs_per_s, wall_s) -> dict[str, Any]:
    last = rows[-1]
    later = [r["ratio"] for r in rows[1:] if r["ratio"]]
    switches = sorted(x for r in rows for x in (r["start_switch_s"], r["stop_switch_s"]))
    return {
        "final_ratio": last["ratio"],
        "mean_ratio_after_v0": statistics.mean(later) if later else None,
        "target_ratio": 1.3,
        "target_met": bool(last["ratio"] and last["ratio"] >= 1.3),
        "stop_latency": stops,
        "role_switch_s": {"max": switches[-1], "median": statistics.median(switches)},
        "optimizer_steps_per_s": steps_per_s,
        "training_pairs_per_s": pairs_per_s,
        "wall_s": wall_s,
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_average_1m": os.getloadavg()[0],
            "platform": platform.platform(),
            "torch": torch.__version__,
            "note": "shared CPU (other builds/tests ran concurrently); timings are indicative",
        },
    }


def print_table(rows: list[dict[str, Any]], s: dict[str, Any]) -> None:
    print()
    print(f"{'policy v':>8} {'static':>8} {'spot':>8} {'ratio':>6} {'drafter':>8} {'top1':>6}")
    for r in rows:
        top1 = f"{r['heldout_top1']:.3f}" if r["heldout_top1"] is not None else "-"
        print(
            f"{r['policy_version']:>8} {r['static_accepted_length']:>8.3f} "
            f"{r['spot_accepted_length']:>8.3f} {r['ratio']:>6.2f} "
            f"{r['drafter_version_used']:>8} {top1:>6}"
        )
    met = "MET" if s["target_met"] else "NOT met"
    print(
        f"\nfinal spot/static = {s['final_ratio']:.2f} (target >= 1.3: {met}); "
        f"mean after v0 = {s['mean_ratio_after_v0']:.2f}"
    )
    st = s["stop_latency"]
    print(
        f"stop latency over {st['trials']} requests: p50 {st['p50_s'] * 1e3:.1f} ms, "
        f"p95 {st['p95_s'] * 1e3:.1f} ms, max {st['max_s'] * 1e3:.1f} ms "
        f"(mean optimizer step {st['mean_step_s'] * 1e3:.1f} ms)"
    )
    print(
        f"role switch (window start/stop): median {s['role_switch_s']['median'] * 1e3:.1f} ms,"
        f" max {s['role_switch_s']['max'] * 1e3:.1f} ms; "
        f"{s['optimizer_steps_per_s']:.1f} optimizer steps/s, "
        f"{s['training_pairs_per_s']:.0f} pairs/s on CPU"
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
