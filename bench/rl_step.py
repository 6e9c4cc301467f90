"""Benchmark: the same RLJob with and without speculative decoding + harvesting, same sitting.

Run: ``.venv/bin/python bench/rl_step.py [JOB] [--steps N]`` (JOB defaults to example 01).
Runs ``longtail run`` twice on one machine, back to back: once as the job says (adaptive SD in
the tail, idle workers harvested for drafter training) and once with ``--no-speculative
--no-harvest`` (the baseline). Prints and writes ``bench/results/rl_step.json``:

* per step and arm (a table): step, rollout, tail, update and sync seconds, SD token share,
  accepted length, idle and harvested worker-seconds, reward, eval accuracy where it ran;
* mean step time of each run and their ratio (baseline / Longtail), also over steps >= 2 (the
  first step pays the warm-ups), and the rollout-time ratio;
* rollout, tail, train and sync seconds per step, SD token share, mean accepted length, mean
  reward;
* idle and harvested worker-seconds (GPU-seconds on a GPU: one GPU a rollout worker);
* the share of step time spent in rollout;
* each step's answer lengths (p50, p99, max tokens) and its tail share (tail seconds over rollout
  seconds), so the reader sees whether the job has a long tail at all;
* eval accuracy at start and end of each run, and how many step-0 eval outputs of the two runs
  are identical, greedy and sampled rows apart (same weights and seeds; lossless SD means same
  text, up to float32 near-ties from batch composition, which are counted and reported).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from longtail_api.steprow import METRICS_FILE, StepRow

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "rl_step.json"


def run_job(job: Path, out: Path, baseline: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "longtail_cli.main", "run", str(job), "-o", str(out)]
    if baseline:
        cmd += ["--no-speculative", "--no-harvest"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    print(proc.stdout[-3000:], flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = (out / METRICS_FILE).read_text().splitlines()
    rows = [StepRow.from_dict(json.loads(ln)) for ln in lines if ln]
    with open(out / "metrics.csv", newline="") as f:  # the rows with `longtail run`'s harvest
        books = {int(r["step"]): r for r in csv.DictReader(f)}  # books merged: idle, harvested
    for row in rows:
        booked = books.get(row.step, {})
        row.idle_s = float(booked["idle_s"]) if booked.get("idle_s") else None
        row.harvested_s = float(booked["harvested_s"]) if booked.get("harvested_s") else None
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_s": wall, "rows": rows, "summary": summary, "dir": str(out)}


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def figures(run: dict[str, Any]) -> dict[str, float]:
    rows: list[StepRow] = run["rows"]
    later = [r for r in rows if r.step >= 2] or rows
    return {
        "mean_step_s": mean([r.step_s for r in rows]),
        "mean_step_s_from_2": mean([r.step_s for r in later]),
        "mean_rollout_s": mean([r.rollout_s for r in rows]),
        "mean_rollout_s_from_2": mean([r.rollout_s for r in later]),
        "mean_tail_s": mean([r.tail_s for r in rows]),
        "mean_train_s": mean([r.train_s for r in rows]),
        "mean_sync_s": mean([r.sync_s for r in rows]),
        "mean_reward": mean([r.reward_mean for r in rows]),
        "rollout_share": sum(r.rollout_s for r in rows) / sum(r.step_s for r in rows),
        "sd_fraction": mean([r.sd_fraction or 0.0 for r in rows]),
        "accepted_length": mean([r.mean_accepted_length or 0.0 for r in later]),
        "idle_s": run["summary"]["idle_s_total"],
        "harvested_s": run["summary"]["harvested_s_total"],
        "start_eval": run["summary"]["start_eval_accuracy"],
        "final_eval": run["summary"]["final_eval_accuracy"],
        "wall_s": run["wall_s"],
    }


STEP_COLUMNS = (
    "step", "step_s", "rollout_s", "tail_s", "update_s", "sync_s", "sd_share", "acc_len",
    "idle_s", "harvested_s", "reward", "eval", "len_p50", "len_p99", "len_max",
)  # fmt: skip


def step_lines(rows: list[StepRow]) -> list[str]:
    """One line per step of a run (:data:`STEP_COLUMNS`), then a line of totals and means."""

    def num(x: float | None, digits: int = 2) -> str:
        return "-" if x is None else f"{x:.{digits}f}"

    lines = [" ".join(f"{c:>11}" for c in STEP_COLUMNS)]
    for r in rows:
        cells = [str(r.step), num(r.step_s), num(r.rollout_s), num(r.tail_s), num(r.train_s),
                 num(r.sync_s), num(r.sd_fraction or 0.0), num(r.mean_accepted_length),
                 num(r.idle_s, 1), num(r.harvested_s, 1), num(r.reward_mean, 3),
                 num(r.eval_accuracy, 3), num(percentile(list(r.response_lengths), 50), 0),
                 num(percentile(list(r.response_lengths), 99), 0),
                 num(max(r.response_lengths, default=None), 0)]  # fmt: skip
        lines.append(" ".join(f"{c:>11}" for c in cells))
    total = [sum(getattr(r, f) for r in rows) for f in ("step_s", "rollout_s", "tail_s",
                                                        "train_s", "sync_s")]  # fmt: skip
    idle = sum(r.idle_s or 0.0 for r in rows)
    harvested = sum(r.harvested_s or 0.0 for r in rows)
    cells = ["total", *(num(t) for t in total), num(mean([r.sd_fraction or 0.0 for r in rows])),
             "", num(idle, 1), num(harvested, 1),
             num(mean([r.reward_mean for r in rows]), 3), "", "", "", ""]  # fmt: skip
    lines.append(" ".join(f"{c:>11}" for c in cells))
    return lines


def percentile(values: list[int], q: float) -> int | None:
    """The nearest-rank ``q`` percentile (0 < q <= 100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least the first
    return ordered[int(rank) - 1]


def step_records(rows: list[StepRow]) -> list[dict[str, Any]]:
    """The per-step figures of :data:`STEP_COLUMNS`, as JSON objects, with each step's answer
    lengths (p50, p99, max tokens) and tail share (tail seconds over rollout seconds)."""
    return [
        {
            "step": r.step,
            "step_s": r.step_s,
            "rollout_s": r.rollout_s,
            "tail_s": r.tail_s,
            "update_s": r.train_s,
            "sync_s": r.sync_s,
            "sd_share": r.sd_fraction,
            "acc_len": r.mean_accepted_length,
            "idle_s": r.idle_s,
            "harvested_s": r.harvested_s,
            "reward": r.reward_mean,
            "eval": r.eval_accuracy,
            "len_p50": percentile(list(r.response_lengths), 50),
            "len_p99": percentile(list(r.response_lengths), 99),
            "len_max": max(r.response_lengths, default=None),
            "tail_share": r.tail_s / r.rollout_s if r.rollout_s > 0 else None,
        }
        for r in rows
    ]


def compare_eval(a: Path, b: Path) -> dict[str, int]:
    """Identical step-0 eval outputs of two runs: greedy rows and sampled rows (``sample``)."""

    def outputs(d: Path) -> list[dict[str, Any]]:
        path = d / "eval" / "step-000000.jsonl"
        return [json.loads(ln) for ln in path.read_text().splitlines() if ln]

    pairs = list(zip(outputs(a), outputs(b), strict=True))
    greedy = [(p, q) for p, q in pairs if "sample" not in p]
    sampled = [(p, q) for p, q in pairs if "sample" in p]
    return {
        "greedy_items": len(greedy),
        "greedy_identical": sum(p["output"] == q["output"] for p, q in greedy),
        "sampled_items": len(sampled),
        "sampled_identical": sum(p["output"] == q["output"] for p, q in sampled),
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("job", nargs="?", default=str(ROOT / "examples" / "01-tiny-arith.yaml"))
    ap.add_argument("--steps", type=int, default=None, help="override algorithm.totalSteps")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument(
        "--keep-runs", action="store_true", help="keep both runs' directories (checkpoints, ...)"
    )
    args = ap.parse_args(argv)
    with run_scratch("longtail-rl-step-", keep=args.keep_runs) as tmp:
        return compare_arms(args, tmp)


@contextmanager
def run_scratch(prefix: str, keep: bool) -> Iterator[Path]:
    """A fresh directory for a benchmark's runs, removed afterwards unless ``keep``: each run
    leaves checkpoints (~150 MB for builtin:tiny) that would otherwise pile up in /tmp."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield tmp
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def compare_arms(args: argparse.Namespace, tmp: Path) -> int:
    """Runs the job with and without Longtail, writes and prints the comparison."""
    doc = yaml.safe_load(Path(args.job).read_text())
    if args.steps:
        doc["spec"]["algorithm"]["totalSteps"] = args.steps
    job = tmp / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    load_before = os.getloadavg()[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs = {}
    for arm, name in (("longtail", "Longtail (adaptive SD + harvest)"),
                      ("baseline", "baseline (--no-speculative --no-harvest)")):  # fmt: skip
        runs[arm] = run = run_job(job, tmp / arm, baseline=arm == "baseline")
        print(f"\n{name}, per step (seconds; idle/harvested: worker-seconds)")
        print("\n".join(step_lines(run["rows"])))
        # Each arm's figures as soon as it ends: a run cut short (a GPU session's time limit)
        # still reports the arm it finished.
        part = {"job": args.job, "arm": arm, "figures": figures(run),
                "per_step": step_records(run["rows"])}  # fmt: skip
        args.out.with_name(f"{args.out.stem}-{arm}.json").write_text(json.dumps(part, indent=2))
    longtail, baseline = runs["longtail"], runs["baseline"]
    fl, fb = figures(longtail), figures(baseline)
    result = {
        "job": args.job,
        "steps": doc["spec"]["algorithm"]["totalSteps"],
        "longtail": fl,
        "baseline": fb,
        "step_time_ratio": fb["mean_step_s"] / fl["mean_step_s"],
        "step_time_ratio_from_2": fb["mean_step_s_from_2"] / fl["mean_step_s_from_2"],
        "rollout_time_ratio": fb["mean_rollout_s"] / fl["mean_rollout_s"],
        "rollout_time_ratio_from_2": fb["mean_rollout_s_from_2"] / fl["mean_rollout_s_from_2"],
        "per_step": {
            "longtail": step_records(longtail["rows"]),
            "baseline": step_records(baseline["rows"]),
        },
        "eval_step0": compare_eval(tmp / "longtail", tmp / "baseline"),
        "machine": {
            "cpu_count": os.cpu_count(),
            "load_average_1m_before": load_before,
            "load_average_1m_after": os.getloadavg()[0],
            "platform": platform.platform(),
        },
        "run_dirs": [longtail["dir"], baseline["dir"]] if args.keep_runs else None,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "run_dirs"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
