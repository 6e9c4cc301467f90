"""The GPU suite's RL-step stage: one job with and without Longtail, and the simulator's
prediction of both runs on a profile taken in the same call (issue #35).

Called by ``bench/gpu/run.sh --suite rl`` (stage ``rl-step``) on a lent GPU, and by its
``--dry-run-cpu`` and ``tests/unit/bench/test_rl_step_gpu.py`` on CPU with ``builtin:tiny``.

    rl_step_gpu.py --out DIR [--job FILE] [--steps N] [--eval-size K]
                   [--profile-deadline S] [--profile-args "..."] [--build-only]
                   [--extra-arms history,engine-set] [--no-profile]

``--build-only`` stops after step 1: the suite's first call (``run.sh --suite rl-build``) builds
into ``$LONGTAIL_CACHE_DIR`` inside the working tree, which the warm device machine keeps for the
second call (``--suite rl``), whose build step then only finds the cached builds.

1. **Build.** The job's ``builtin:`` policy and drafter are built here first (``longtail run``
   would do it too, but inside the run's time), timed; their build records are copied to
   ``DIR/build-*.json``.
2. **The arms.** ``bench/rl_step.py``'s comparison: the job as written (adaptive SD + the idle
   workers harvested for drafter training) and ``--no-speculative --no-harvest``, same seeds,
   back to back, each run's every step printed (step, rollout, tail, update and sync seconds,
   SD share, accepted length, idle and harvested GPU-seconds, reward, eval). The job is
   adjusted for a session of minutes: ``totalSteps`` N, a greedy eval of K prompts at step 0
   (the two arms' outputs must be identical: lossless SD) and at step N. ``DIR/rl_step.json``,
   and each run's step rows in ``DIR/runs/<arm>/metrics.jsonl`` (replay them later with
   ``longtail simulate --lengths run:DIR/runs/<arm>``).
   ``--extra-arms``: more arms after those two, each compared with the baseline run
   (``history``: the history drafter alone; ``engine-set``: the engine's default strategy
   set), in ``DIR/rl_step-extra.json``, rewritten as each arm ends.
3. **The profile** (``--no-profile``: none, nor step 4), of the job's own model on this
   machine, through ``bench/gpu/profile_gpu.py`` (per batch size, within
   ``--profile-deadline``) on the GPU, or ``longtail profile`` on CPU;
   GRPO update timed on the Longtail run's median step. ``DIR/profile.json``.
4. **The prediction**: every step of both runs replayed on that profile (``bench/
   sim_validate.py``'s comparison: each step's own lengths, the job's weight sync, the
   measured overheads), predicted vs measured per arm. ``DIR/sim_vs_measured.json``.

Everything is written as it completes, so a stage cut short by the suite's budget keeps what
it finished. Exit 0 when every part ran (the figures are judged by a person, not here).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from longtail_api.manifest import validate_file
from longtail_api.profile import EngineProfile
from longtail_api.steprow import METRICS_FILE

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from rl_step import (  # noqa: E402  (the benchmarks' one runner)
    compare_arms,
    compare_eval,
    figures,
    run_job,
    run_scratch,
    step_lines,
    step_records,
)
from sim_validate import compare_arm, table  # noqa: E402  (the one prediction-vs-run check)

DEFAULT_JOB = ROOT / "examples" / "06-small-arith-gpu.yaml"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for every result file")
    ap.add_argument("--job", type=Path, default=DEFAULT_JOB)
    ap.add_argument("--steps", type=int, default=3, help="RL steps per arm (totalSteps)")
    ap.add_argument("--eval-size", type=int, default=8, help="greedy eval prompts (0: no eval)")
    ap.add_argument("--profile-deadline", type=float, default=90.0, help="seconds for the curves")
    ap.add_argument(
        "--profile-args",
        default="--device cuda --dtype bfloat16 --batches 1,2,4,8,16,32 --contexts 512,2048 "
        "--depths 3,6 --repeats 2 --warmup 1",
        help="`longtail profile` options besides --model, --train-batch and --out",
    )
    ap.add_argument("--build-only", action="store_true", help="build the job's models and stop")
    ap.add_argument(
        "--extra-arms",
        default="",
        help=f"comma-separated arms run after the two ({', '.join(EXTRA_ARMS)}), each compared "
        "with the baseline and written as it ends",
    )
    ap.add_argument("--no-profile", action="store_true", help="skip the profile and prediction")
    return ap


EXTRA_ARMS = {
    "history": "history drafter alone (strategies history 4/8, no drafter, no harvest)",
    "engine-set": "the engine's default strategy set (the job's strategies removed)",
}


def extra_arm_job(job: Path, arm: str, dest: Path) -> Path:
    """``job`` changed into the extra ``arm``'s job (see :data:`EXTRA_ARMS`), written to
    ``dest``."""
    doc = yaml.safe_load(job.read_text())
    spec = doc["spec"]
    if arm == "history":
        spec["speculative"]["strategies"] = [
            {"draftDepth": 4, "drafter": "history"}, {"draftDepth": 8, "drafter": "history"}
        ]  # fmt: skip
        spec["drafterTraining"] = {"enabled": False}
        spec["harvest"] = {"enabled": False}
    elif arm == "engine-set":
        spec["speculative"].pop("strategies", None)
    else:
        raise SystemExit(f"--extra-arms: unknown arm {arm!r} (use {', '.join(EXTRA_ARMS)})")
    dest.write_text(yaml.safe_dump(doc))
    return dest


def run_extra_arms(args: argparse.Namespace, job: Path, tmp: Path) -> None:
    """Each of ``--extra-arms`` after the two, compared with the baseline run just before
    (figures, step and rollout ratios, the step-0 greedy eval); ``DIR/rl_step-extra.json``
    rewritten after every arm."""
    base = json.loads((args.out / "rl_step.json").read_text())["baseline"]
    record: dict[str, Any] = {"baseline": base, "arms": {}}
    for arm in [a for a in args.extra_arms.split(",") if a]:
        arm_job = extra_arm_job(job, arm, tmp / f"job-{arm}.yaml")
        t0 = time.perf_counter()
        run = run_job(arm_job, tmp / arm, baseline=False)
        print(f"\n{arm}: {EXTRA_ARMS[arm]}, per step (seconds)")
        print("\n".join(step_lines(run["rows"])))
        f = figures(run)
        record["arms"][arm] = {
            "what": EXTRA_ARMS[arm],
            "seconds": time.perf_counter() - t0,
            "figures": f,
            "step_time_ratio": base["mean_step_s"] / f["mean_step_s"],
            "step_time_ratio_from_2": base["mean_step_s_from_2"] / f["mean_step_s_from_2"],
            "rollout_time_ratio": base["mean_rollout_s"] / f["mean_rollout_s"],
            "rollout_time_ratio_from_2": base["mean_rollout_s_from_2"] / f["mean_rollout_s_from_2"],
            "eval_step0_vs_baseline": compare_eval(tmp / arm, tmp / "baseline"),
            "per_step": step_records(run["rows"]),
        }
        (args.out / "rl_step-extra.json").write_text(json.dumps(record, indent=2) + "\n")
        keep = args.out / "runs" / arm
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp / arm / METRICS_FILE, keep / METRICS_FILE)
        print(json.dumps({k: v for k, v in record["arms"][arm].items() if k != "per_step"}))


def session_job(job: Path, steps: int, eval_size: int, dest: Path) -> Path:
    """``job`` with ``steps`` RL steps and a greedy eval of ``eval_size`` prompts at step 0 and
    at the last step (no sampled eval), written to ``dest``."""
    doc = yaml.safe_load(job.read_text())
    algo = doc["spec"]["algorithm"]
    algo["totalSteps"] = steps
    algo["evalEverySteps"] = steps if eval_size else 0
    algo["evalSamples"] = 0
    doc["spec"]["dataset"]["evalSize"] = eval_size
    dest.write_text(yaml.safe_dump(doc))
    return dest


def build(job: Path, out: Path) -> dict[str, float]:
    """Build the job's built-in policy and drafter (each timed); copy their build records."""
    from longtail_workers.local.run import prepare_builtins
    from longtail_workers.models.loading import resolve_model_path
    from longtail_workers.warmstart.builtin import builtin_drafter_dir

    spec = validate_file(job)[0].spec
    assert spec is not None
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    prepare_builtins(spec)
    seconds["build_s"] = time.perf_counter() - t0
    if spec.model.path.startswith("builtin:"):
        record = resolve_model_path(spec.model.path) / "longtail_build.json"
        shutil.copy(record, out / "build-policy.json")
    drafter = spec.drafter_training.initial_drafter
    if drafter and drafter.startswith("builtin:"):
        record = builtin_drafter_dir(drafter, spec.drafter_training.layout) / "longtail_build.json"
        shutil.copy(record, out / "build-drafter.json")
    return seconds


def take_profile(args: argparse.Namespace, model: str, run_dir: Path, dest: Path) -> None:
    """The job's model profiled on this machine (GPU: ``profile_gpu.py`` within its deadline)."""
    options = shlex.split(args.profile_args)
    tail = ["--model", model, "--train-batch", f"run:{run_dir}", "--out", str(dest)]
    env = dict(os.environ)
    if "cuda" in options:  # the job's own weight sync is measured: seconds for a 0.5B policy
        cmd = [sys.executable, str(ROOT / "bench/gpu/profile_gpu.py"),
               str(args.profile_deadline), *options, *tail]  # fmt: skip
        env["PROFILE_GPU_MEASURE_SYNC"] = "1"
    else:
        cmd = [sys.executable, "-m", "longtail_cli.main", "profile", *options, *tail]
    subprocess.run(cmd, check=True, env=env)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    with run_scratch("longtail-rl-step-gpu-", keep=False) as tmp:
        job = session_job(args.job, args.steps, args.eval_size, tmp / "job.yaml")
        timings |= build(job, args.out)
        print(f"built the job's built-in policy and drafter in {timings['build_s']:.1f} s")
        (args.out / "build-timings.json").write_text(json.dumps(timings) + "\n")
        if args.build_only:
            return 0
        arms = argparse.Namespace(job=str(job), steps=None, out=args.out / "rl_step.json",
                                  keep_runs=True)  # fmt: skip
        t0 = time.perf_counter()
        compare_arms(arms, tmp)
        timings["arms_s"] = time.perf_counter() - t0
        for arm in ("longtail", "baseline"):  # for `longtail simulate --lengths run:DIR` later
            (args.out / "runs" / arm).mkdir(parents=True, exist_ok=True)
            shutil.copy(tmp / arm / METRICS_FILE, args.out / "runs" / arm / METRICS_FILE)
            evals = tmp / arm / "eval"  # the greedy texts the step-0 comparison read
            for path in sorted(evals.glob("step-*.jsonl")) if evals.is_dir() else []:
                shutil.copy(path, args.out / "runs" / arm / f"eval-{path.name}")
        t0 = time.perf_counter()
        run_extra_arms(args, job, tmp)
        timings["extra_arms_s"] = time.perf_counter() - t0
        if args.no_profile:
            print(f"timings: {json.dumps(timings)}")
            return 0
        t0 = time.perf_counter()
        model = yaml.safe_load(job.read_text())["spec"]["model"]["path"]
        take_profile(args, model, tmp / "longtail", args.out / "profile.json")
        timings["profile_s"] = time.perf_counter() - t0
        profile = EngineProfile.read(args.out / "profile.json")
        predicted: dict[str, dict[str, dict[str, Any]]] = {"job": {}}
        for arm in ("longtail", "baseline"):
            predicted["job"][arm] = compare_arm(
                job, tmp / arm, profile, int(arm == "longtail"), profile
            )
        record = {"profile_device": profile.device, "arms": predicted["job"], "timings_s": timings}
        (args.out / "sim_vs_measured.json").write_text(json.dumps(record, indent=2) + "\n")
        print(table(predicted))
        print(f"timings: {json.dumps(timings)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
