"""Benchmark: the ``math`` reward's verdicts and throughput, to compare two versions of it.

Run it once per version, then compare (the figures in docs/tasks-and-rewards.md come from this)::

    git worktree add /tmp/old-rew <commit before math-verify>
    PYTHONPATH=/tmp/old-rew/api:/tmp/old-rew/workers \\
        .venv/bin/python bench/rewards_agreement.py run --label old --out /tmp/old.json
    .venv/bin/python bench/rewards_agreement.py run --label new --out /tmp/new.json
    .venv/bin/python bench/rewards_agreement.py compare /tmp/old.json /tmp/new.json

``run`` scores, with whatever ``longtail_workers.rewards`` is importable:

* the hard cases of ``tests/unit/workers/reward_hard_cases.py`` (verdicts written by hand);
* answers to the built-in tasks (``builtin:arith`` and ``builtin:arith-long`` training items):
  per item the worked solution and variants a policy writes, right and wrong (a box, a padded
  or decimal total, a trailing period or words, an off-by-one or negated total, a cut-off
  solution with no final answer);

and times the reward function on the built-in answers (one thread calling it answer after
answer, and the verifier's path: ``score_request`` on batches of 128, with the threads the
verifier gives it) and on the hard cases (one thread; mostly LaTeX, so slower to parse).
``compare`` prints the agreement tables, every case where the two versions disagree, and the
throughput of both.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HARD_CASES = REPO / "tests" / "unit" / "workers" / "reward_hard_cases.py"
BATCH = 128
"""Items per verify request in the verifier-path timing (16 prompts x 8 answers)."""


def load_hard_cases() -> Any:
    spec = importlib.util.spec_from_file_location("reward_hard_cases", HARD_CASES)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["reward_hard_cases"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def builtin_answers(n_arith: int, n_long: int) -> list[dict[str, Any]]:
    """(task, kind, output, gold, expected) rows: worked solutions and variants of them."""
    from longtail_workers.tasks import arith, arith_long

    rows: list[dict[str, Any]] = []
    for task, items in (
        ("builtin:arith", arith.generate(n_arith, seed=0)),
        ("builtin:arith-long", arith_long.generate(n_long, seed=0)),
    ):
        for item in items:
            total = int(item.answer)
            work = item.solution.rsplit("\n", 1)[0]  # the step lines, without "Answer: N"
            variants = {
                "worked solution": (item.solution, True),
                "boxed": (f"{work}\nso the sum is \\boxed{{{total}}}", True),
                "zero-padded": (f"{work}\nAnswer: {total:04d}", True),
                "decimal": (f"Answer: {total}.0", True),
                "period": (f"Answer: {total}.", True),
                "trailing words": (f"Answer: {total} in total", True),
                "off by one": (f"{work}\nAnswer: {total + 1}", False),
                "off by ten": (f"Answer: {total - 10}", False),
                "negated": (f"Answer: -{total}", False),
                "cut off": (item.solution[: len(item.solution) // 2], False),
            }
            for kind, (output, expected) in variants.items():
                rows.append(
                    {"task": task, "kind": kind, "output": output, "gold": item.answer,
                     "expected": expected}
                )  # fmt: skip
    return rows


def score(rows: list[dict[str, Any]], reward: Any) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        result = reward(row["output"], row["gold"])
        out.append({**row, "correct": result.correct, "reason": getattr(result, "reason", None)})
    return out


def time_sequential(rows: list[dict[str, Any]], reward: Any) -> float:
    started = time.perf_counter()
    for row in rows:
        reward(row["output"], row["gold"])
    return len(rows) / (time.perf_counter() - started)


def time_verifier(rows: list[dict[str, Any]]) -> tuple[float, int]:
    from longtail_api.protocol import VerifyItem, VerifyRequest
    from longtail_workers.verifier.scoring import score_request

    threads = 1
    kwargs: dict[str, Any] = {}
    if "threads" in inspect.signature(score_request).parameters:
        from longtail_workers.rewards import math_checker

        threads = math_checker().processes
        kwargs["threads"] = threads
    requests = [
        VerifyRequest(items=tuple(VerifyItem(r["output"], r["gold"]) for r in rows[i : i + BATCH]))
        for i in range(0, len(rows), BATCH)
    ]
    started = time.perf_counter()
    for request in requests:
        score_request(request, **kwargs)
    return len(rows) / (time.perf_counter() - started), threads


def run(args: argparse.Namespace) -> None:
    from longtail_workers.rewards import get_reward

    reward = get_reward("math")
    hard = load_hard_cases()
    started = time.perf_counter()
    reward("Answer: 1", "1")  # the new reward starts its first checker process here
    cold_s = time.perf_counter() - started
    rows = builtin_answers(args.arith, args.arith_long)
    hard_rows = [
        {"id": c.id, "category": c.category, "output": c.output, "gold": c.gold,
         "expected": c.expected}
        for c in hard.CASES
    ]  # fmt: skip
    result = {
        "label": args.label,
        "rewards_module": sys.modules[reward.__module__].__file__,
        "cpus": len(os.sched_getaffinity(0)),
        "first_call_s": round(cold_s, 3),
        "hard": score(hard_rows, reward),
        "builtin": score(rows, reward),
    }
    sequential = [time_sequential(rows, reward) for _ in range(args.repeats)]
    hard_rate = [time_sequential(hard_rows, reward) for _ in range(args.repeats)]
    verifier = [time_verifier(rows) for _ in range(args.repeats)]
    result["throughput"] = {
        "answers": len(rows),
        "sequential_per_s": max(sequential),
        "hard_per_s": max(hard_rate),
        "verifier_per_s": max(v for v, _ in verifier),
        "verifier_threads": verifier[0][1],
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{args.label}: wrote {args.out}; throughput {result['throughput']}")


def _agreement(rows: list[dict[str, Any]]) -> tuple[int, int]:
    return sum(r["correct"] == r["expected"] for r in rows), len(rows)


def compare(args: argparse.Namespace) -> None:
    old, new = (json.loads(Path(p).read_text()) for p in (args.old, args.new))
    print("## Hard cases: agreement with the hand verdicts\n")
    print("| category | cases | old agrees | new agrees |\n|---|---|---|---|")
    categories = list(dict.fromkeys(r["category"] for r in new["hard"]))
    for cat in [*categories, "all"]:
        pick = [i for i, r in enumerate(new["hard"]) if cat in ("all", r["category"])]
        a_old = sum(old["hard"][i]["correct"] == old["hard"][i]["expected"] for i in pick)
        a_new = sum(new["hard"][i]["correct"] == new["hard"][i]["expected"] for i in pick)
        print(f"| {cat} | {len(pick)} | {a_old} | {a_new} |")
    print("\n### Hard cases where old or new differs from the hand verdict\n")
    print("| id | output | gold | hand | old | new |\n|---|---|---|---|---|---|")
    for o, n in zip(old["hard"], new["hard"], strict=True):
        if o["correct"] != o["expected"] or n["correct"] != n["expected"]:
            print(
                f"| {n['id']} | `{n['output']}` | `{n['gold']}` | {_yn(n['expected'])} "
                f"| {_yn(o['correct'])} | {_yn(n['correct'])} |"
            )
    print("\n## Built-in tasks: old vs new\n")
    print("| task | answer kind | answers | right by construction | old agrees | new agrees "
          "| old = new |\n|---|---|---|---|---|---|---|")  # fmt: skip
    groups: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(new["builtin"]):
        groups.setdefault((r["task"], r["kind"]), []).append(i)
    for (task, kind), idx in groups.items():
        same = sum(old["builtin"][i]["correct"] == new["builtin"][i]["correct"] for i in idx)
        a_old = sum(old["builtin"][i]["correct"] == old["builtin"][i]["expected"] for i in idx)
        a_new = sum(new["builtin"][i]["correct"] == new["builtin"][i]["expected"] for i in idx)
        right = _yn(new["builtin"][idx[0]]["expected"])
        print(f"| {task} | {kind} | {len(idx)} | {right} | {a_old} | {a_new} | {same} |")
    total_same = sum(
        o["correct"] == n["correct"] for o, n in zip(old["builtin"], new["builtin"], strict=True)
    )
    print(f"\nold = new on {total_same} of {len(new['builtin'])} built-in answers.")
    reasons = Counter(r["reason"] for r in new["builtin"] + new["hard"] if r["reason"])
    if reasons:
        print("\nNew reward's reasons: " + "; ".join(f"{k}: {v}" for k, v in reasons.items()))
    print("\n## Throughput\n")
    print(
        "| version | one thread, answers/s | verifier path, answers/s (threads) "
        "| hard cases, one thread, answers/s | first call, s |"
    )
    print("|---|---|---|---|---|")
    for d in (old, new):
        t = d["throughput"]
        print(
            f"| {d['label']} | {t['sequential_per_s']:,.0f} | {t['verifier_per_s']:,.0f} "
            f"({t['verifier_threads']}) | {t['hard_per_s']:,.0f} | {d['first_call_s']} |"
        )
    print(f"\n{new['cpus']} CPUs; {new['throughput']['answers']} answers per timing.")


def _yn(value: bool) -> str:
    return "yes" if value else "no"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="score and time the importable reward")
    r.add_argument("--label", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--arith", type=int, default=300, help="builtin:arith items (default 300)")
    r.add_argument("--arith-long", type=int, default=60, help="builtin:arith-long items")
    r.add_argument("--repeats", type=int, default=3, help="timings; the best is kept")
    c = sub.add_parser("compare", help="tables from two run outputs")
    c.add_argument("old")
    c.add_argument("new")
    args = ap.parse_args()
    run(args) if args.command == "run" else compare(args)


if __name__ == "__main__":
    main()
