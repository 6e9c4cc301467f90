"""Projection: TLT's reported setting in the step simulator, next to their 1.7-2.1x.

Run: ``.venv/bin/python bench/sim_tlt.py`` (pure Python, a few minutes on 2 cores);
``--profile FILE`` re-projects on a measured engine profile instead of the roofline (the 7B
profile of the GPU suite, ``bench/gpu/run.sh``; then the figures are projections on measured
step times).

Simulates ``bench/jobs/tlt-qwen2.5-7b-64xh100.yaml`` (Qwen2.5-7B on 64 H100s, answers up to 32K
tokens, SD at <= 32 running answers) on the first-principles H100 roofline profile
(``sim/roofline.py``), with the accepted lengths TLT reports for a static drafter (4.59) and for
their adaptive, online-trained one (6.53), over a few response-length medians (the paper gives
the cap and the long tail, not the median). Prints a Markdown table (baseline step, Longtail
step, speedups, rollout share) and writes ``bench/results/sim_tlt.json``. Every figure is a
ROOFLINE PROJECTION, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from longtail_api.manifest import validate_file
from longtail_api.profile import EngineProfile
from longtail_workers.sim.job import LognormalModel, shape_from_job
from longtail_workers.sim.roofline import roofline_profile
from longtail_workers.sim.step import compare

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "bench" / "jobs" / "tlt-qwen2.5-7b-64xh100.yaml"
RESULTS = ROOT / "bench" / "results" / "sim_tlt.json"
ACCEPTED = {"static drafter (TLT: 4.59)": 4.59, "adaptive drafter (TLT: 6.53)": 6.53}
MEDIANS = (2000, 4000, 8000)
P99_RATIO = 8.0  # p99 of a 4K median at the 32K cap
CAP_FRACTION = 0.02
PROMPT_TOKENS = 256


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--medians", default=",".join(str(m) for m in MEDIANS))
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--profile", type=Path, help="measured engine profile (default: roofline)")
    args = ap.parse_args(argv)
    (checked,) = validate_file(JOB)
    if checked.errors or checked.spec is None:
        raise SystemExit(f"{JOB} is not a valid RLJob: " + "; ".join(map(str, checked.errors)))
    spec = checked.spec
    profile = EngineProfile.read(args.profile) if args.profile else roofline_profile("Qwen2-7B")
    rows = []
    for median in (int(m) for m in args.medians.split(",")):
        model = LognormalModel(median, P99_RATIO, spec.algorithm.max_new_tokens, CAP_FRACTION)
        for label, accepted in ACCEPTED.items():
            shape, notes = shape_from_job(spec, max_running=256, prompt_tokens=PROMPT_TOKENS,
                                          accepted_length=accepted)  # fmt: skip
            base, lt = compare(shape, model.lengths(shape.prompts, shape.group), profile)
            rows.append({
                "median": median, "drafter": label, "accepted_length": accepted,
                "baseline_step_s": base.step_s, "longtail_step_s": lt.step_s,
                "step_speedup": base.step_s / lt.step_s,
                "rollout_speedup": base.rollout_s / lt.rollout_s,
                "baseline_rollout_share": base.rollout_s / base.step_s,
                "baseline_tail_share": base.tail_s / base.rollout_s,
                "idle_gpu_s": base.idle_gpu_s, "harvested_gpu_s": lt.harvested_gpu_s,
            })  # fmt: skip
            print(f"median {median}: {label}: step {rows[-1]['step_speedup']:.2f}x", flush=True)
    print(
        "\n| median answer | drafter | baseline step | Longtail step | step speedup | rollout "
        "speedup | baseline rollout share | tail share of rollout | harvested GPU-s |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['median']} | {r['drafter']} | {r['baseline_step_s']:.0f} s | "
              f"{r['longtail_step_s']:.0f} s | {r['step_speedup']:.2f}x | "
              f"{r['rollout_speedup']:.2f}x | {r['baseline_rollout_share']:.0%} | "
              f"{r['baseline_tail_share']:.0%} | {r['harvested_gpu_s']:.0f} |")  # fmt: skip
    for note in [*profile.notes, *notes]:
        print(f"note: {note}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    source = str(args.profile) if args.profile else "roofline Qwen2-7B"
    report = {
        "job": str(JOB.relative_to(ROOT)),
        "profile": source,
        "rows": rows,
        "notes": [*profile.notes, *notes],
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
