"""Benchmark: how a drafter's acceptance holds up over a real GRPO run, per drafter (issue #49).

Run: ``.venv/bin/python bench/staleness.py [JOB] [--steps 20] [--arms ...] [--rounds 1]``
(JOB defaults to example 01). One sitting, one machine, the same seeds in every arm; the arms
run one after another and, with ``--rounds 2``, again in reverse order (so a machine that
drifts during the sitting does not favour the arms that ran first):

* ``frozen``: the job's fitted ``initialDrafter``, never retrained (drafter training and
  harvest off), learned strategies;
* ``online``: the job's drafter trained online in harvested time, as in the job (learned
  strategies);
* ``history``: history strategies only (no drafter forward), no drafter training;
* ``hybrid``: hybrid strategies (history where its match is long enough, the online drafter
  otherwise), drafter trained online;
* ``baseline``: ``--no-speculative --no-harvest``.

Every arm evaluates greedily at step 0 (identical text in every arm: same weights, lossless SD)
and at the last step. Prints a table and writes ``bench/results/staleness.json`` (accepted
length, SD token share, rollout and step seconds per step per arm; per draft source where the
step rows carry it) and a plot of accepted length per step (``--plot``, default
``bench/results/staleness.png``). It asserts nothing: the figures are read by people.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from longtail_api.manifest import validate_manifest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rl_step import compare_eval, mean, run_job, run_scratch  # the benchmarks' one runner

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("frozen", "online", "history", "hybrid", "baseline")


def strategies(doc: dict[str, Any], drafter: str) -> list[dict[str, Any]]:
    """The job's strategies (their depths) with every one drafting from ``drafter``; history
    strategies get one deeper depth as well (a lookup costs nothing per extra token)."""
    found = doc["spec"]["speculative"].get("strategies")
    if found is None:  # the engine's set (defaulting.py): the depths of its learned strategies
        result = validate_manifest(doc)
        if result.spec is None:
            raise SystemExit(f"the job is invalid: {'; '.join(map(str, result.errors))}")
        resolved = result.spec.speculative.strategies
        depths = sorted({st.draft_depth for st in resolved if st.drafter == "learned"})
    else:
        depths = sorted({int(s.get("draftDepth", 4)) for s in found})
    if drafter == "history":
        depths = sorted({*depths, 2 * depths[-1]})
    return [{"draftDepth": d, "drafter": drafter} for d in depths]


def arm_job(base: dict[str, Any], arm: str, steps: int) -> dict[str, Any]:
    """The job of one arm (see the module text): ``base`` with ``steps`` steps, a greedy eval
    at the start and end only, no checkpoints within the run."""
    doc = copy.deepcopy(base)
    spec = doc["spec"]
    spec["algorithm"].update(totalSteps=steps, evalEverySteps=steps, evalSamples=0)
    spec.setdefault("checkpoint", {})["everySteps"] = max(steps, 1) * 10
    speculative, training = spec["speculative"], spec.setdefault("drafterTraining", {})
    harvest = spec.setdefault("harvest", {})
    if arm == "frozen":
        speculative["strategies"] = strategies(doc, "learned")
        training["enabled"], harvest["enabled"] = False, False
    elif arm == "online":
        speculative["strategies"] = strategies(doc, "learned")
    elif arm == "history":
        speculative["strategies"] = strategies(doc, "history")
        training["enabled"], harvest["enabled"] = False, False
    elif arm == "hybrid":
        speculative["strategies"] = strategies(doc, "hybrid")
    elif arm != "baseline":
        raise SystemExit(f"unknown arm {arm!r}; use some of {', '.join(ARMS)}")
    return doc


def per_step(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "step": r.step,
            "accepted_length": r.mean_accepted_length,
            "sd_fraction": r.sd_fraction,
            "rollout_s": r.rollout_s,
            "step_s": r.step_s,
            "drafter_version": r.drafter_version,
            "reward": r.reward_mean,
            "by_source": {
                k: v
                for k, v in vars(r).items()
                if k.endswith("_by_source") and v  # the per-draft-source figures, where present
            },
        }
        for r in run["rows"]
    ]


def summarise(runs: dict[str, list[dict[str, Any]]], steps: int) -> dict[str, Any]:
    """Per arm over its rounds: mean step and rollout seconds (steps 2+), accepted length over
    the first and last quarter of the run (steps that speculated), start and end greedy eval."""
    out: dict[str, Any] = {}
    quarter = max(1, steps // 4)
    for arm, rounds in runs.items():
        rows = [s for r in rounds for s in r["per_step"]]
        later = [s for s in rows if s["step"] >= 2] or rows
        # steps that speculated at all (a step whose tail never reached the threshold has none)
        spec = [s for s in rows if s["accepted_length"]]
        first = [s["accepted_length"] for s in spec if s["step"] <= quarter]
        last = [s["accepted_length"] for s in spec if s["step"] > steps - quarter]
        out[arm] = {
            "mean_step_s_from_2": mean([s["step_s"] for s in later]),
            "mean_rollout_s_from_2": mean([s["rollout_s"] for s in later]),
            "accepted_length_first_quarter": mean(first),
            "accepted_length_last_quarter": mean(last),
            "start_eval": [r["start_eval"] for r in rounds],
            "final_eval": [r["final_eval"] for r in rounds],
        }
    if "baseline" in out:
        base = out["baseline"]
        for figures in out.values():
            figures["step_speedup_vs_baseline"] = (
                base["mean_step_s_from_2"] / figures["mean_step_s_from_2"]
            )
            figures["rollout_speedup_vs_baseline"] = (
                base["mean_rollout_s_from_2"] / figures["mean_rollout_s_from_2"]
            )
    return out


def plot(runs: dict[str, list[dict[str, Any]]], dest: Path) -> None:
    """Accepted length per step, one line per arm and round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, rounds in runs.items():
        if arm == "baseline":
            continue
        for i, r in enumerate(rounds):
            spec = [s for s in r["per_step"] if s["accepted_length"]]  # steps that speculated
            xs, ys = [s["step"] for s in spec], [s["accepted_length"] for s in spec]
            ax.plot(xs, ys, marker="o", ms=3, label=arm if i == 0 else None)
    ax.set_xlabel("RL step (a new policy version each step)")
    ax.set_ylabel("accepted length (tokens per verify)")
    ax.set_title("Drafter staleness over a GRPO run")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(dest, dpi=110)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("job", nargs="?", default=str(ROOT / "examples" / "01-tiny-arith.yaml"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated, in run order")
    ap.add_argument("--rounds", type=int, default=1, help="2: again in reverse order")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "staleness.json")
    ap.add_argument("--plot", type=Path, default=None, help="PNG (default: next to --out)")
    args = ap.parse_args(argv)
    base = yaml.safe_load(Path(args.job).read_text())
    arms = [a for a in args.arms.split(",") if a]
    for arm in arms:
        arm_job(base, arm, args.steps)  # an unknown arm fails before anything runs
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    identical: dict[str, list[dict[str, int]]] = {a: [] for a in arms}
    with run_scratch("longtail-staleness-", keep=False) as tmp:
        for rnd in range(args.rounds):
            order = arms if rnd % 2 == 0 else arms[::-1]
            for arm in order:
                job = tmp / f"{arm}-{rnd}.yaml"
                job.write_text(yaml.safe_dump(arm_job(base, arm, args.steps)))
                run = run_job(job, tmp / f"{arm}-{rnd}", baseline=arm == "baseline")
                runs[arm].append({
                    "round": rnd,
                    "per_step": per_step(run),
                    "start_eval": run["summary"]["start_eval_accuracy"],
                    "final_eval": run["summary"]["final_eval_accuracy"],
                    "wall_s": run["wall_s"],
                })  # fmt: skip
                lengths = [s["accepted_length"] or 0.0 for s in runs[arm][-1]["per_step"]]
                print(f"{arm} (round {rnd + 1}): accepted length per step " + " ".join(
                    f"{x:.2f}" for x in lengths))  # fmt: skip
            first = tmp / f"{arms[0]}-{rnd}"
            for arm in arms[1:]:  # lossless: every arm's step-0 greedy text is the first arm's
                identical[arm].append(compare_eval(first, tmp / f"{arm}-{rnd}"))
    result = {
        "job": args.job,
        "steps": args.steps,
        "arms": arms,
        "summary": summarise(runs, args.steps),
        "eval_step0_vs_first_arm": identical,
        "runs": runs,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(runs, args.plot or args.out.with_suffix(".png"))
    print(json.dumps({k: result[k] for k in ("summary", "eval_step0_vs_first_arm")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
