"""``longtail simulate RLJOB.yaml``: baseline vs Longtail for one RL step, as a table.

Called by the CLI (``cli/longtail_cli/main.py`` forwards its arguments here). Reads the job,
a profile (``--profile FILE`` from ``longtail profile``, or ``--roofline MODEL``: the
first-principles H100-class profile, labelled a projection), response lengths (``--lengths
lognormal:median=...``), runs :func:`longtail_workers.sim.step.compare` and prints the step,
rollout, tail, trainer, idle and harvested GPU-seconds side by side with the projected speedup,
followed by the profile's notes and what was adapted from the job.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from longtail_api.manifest import ManifestError, validate_file
from longtail_api.profile import EngineProfile, ProfileError
from longtail_workers.sim.job import parse_lengths, shape_from_job
from longtail_workers.sim.roofline import QWEN2_SHAPES, roofline_profile
from longtail_workers.sim.step import StepResult, compare

ROWS: tuple[tuple[str, str], ...] = (
    ("step_s", "step (s)"),
    ("rollout_s", "rollout (s)"),
    ("tail_s", "tail: first worker done -> last (s)"),
    ("trainer_s", "trainer (s)"),
    ("weight_sync_s", "weight sync (s)"),
    ("idle_gpu_s", "idle rollout GPU-seconds"),
    ("harvested_gpu_s", "harvested GPU-seconds (drafter training)"),
)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="longtail simulate", description=__doc__.split("\n")[0])
    ap.add_argument("job", help="RLJob YAML file")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--profile", help="engine profile JSON written by `longtail profile`")
    src.add_argument(
        "--roofline",
        choices=sorted(QWEN2_SHAPES),
        help="use the first-principles H100-class profile of this model shape",
    )
    ap.add_argument(
        "--lengths",
        default="lognormal:median=2000,p99_ratio=10,cap_fraction=0.02",
        help="response lengths: lognormal:median=M,p99_ratio=R,cap_fraction=F[,seed=S]",
    )
    ap.add_argument(
        "--accepted-length",
        type=float,
        default=3.0,
        help="mean accepted length per SD step (accepted drafts + 1)",
    )
    ap.add_argument("--max-running", type=int, default=256, help="running batch per worker")
    ap.add_argument("--prompt-tokens", type=int, default=256, help="prompt length, tokens")
    ap.add_argument("--weight-sync-s", type=float, default=0.0, help="weight sync seconds")
    return ap


def format_table(base: StepResult, longtail: StepResult) -> str:
    """The side-by-side table (one line per figure, then the projected speedup)."""
    width = max(len(label) for _, label in ROWS)
    lines = [f"{'':{width}}  {'baseline':>12}  {'longtail':>12}"]
    for attr, label in ROWS:
        b, lt = getattr(base, attr), getattr(longtail, attr)
        lines.append(f"{label:{width}}  {b:12.1f}  {lt:12.1f}")
    lines.append(
        f"{'projected speedup':{width}}  step {base.step_s / longtail.step_s:.2f}x, "
        f"rollout {base.rollout_s / longtail.rollout_s:.2f}x"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        results = validate_file(args.job)
        spec = results[0].spec
        if spec is None or not results[0].ok:
            errors = "; ".join(str(e) for e in results[0].errors)
            raise ValueError(f"{args.job}: not a valid RLJob ({errors}); run `longtail validate`")
        profile = (
            EngineProfile.read(args.profile) if args.profile else roofline_profile(args.roofline)
        )
        shape, notes = shape_from_job(
            spec,
            max_running=args.max_running,
            prompt_tokens=args.prompt_tokens,
            accepted_length=args.accepted_length,
            weight_sync_s=args.weight_sync_s,
        )
        lengths = parse_lengths(
            args.lengths, shape.prompts, shape.group, spec.algorithm.max_new_tokens
        )
        base, longtail = compare(shape, lengths, profile)
    except (ManifestError, ProfileError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    label = "ROOFLINE PROJECTION" if profile.source == "roofline" else "measured profile"
    print(f"profile: {label} ({profile.device}, engine {profile.engine})")
    print(format_table(base, longtail))
    for note in [*profile.notes, *notes]:
        print(f"note: {note}")
    return 0
