"""``longtail simulate RLJOB.yaml``: baseline vs Longtail for one RL step, as a table.

Called by the CLI (``cli/longtail_cli/main.py`` forwards its arguments here). Reads the job,
a profile (``--profile FILE`` from ``longtail profile``, or ``--roofline MODEL``: the
first-principles H100-class profile, labelled a projection) and response lengths (``--lengths
lognormal:median=...``, a parametric long tail, or ``--lengths run:DIR``, every step of a
finished run replayed with its own lengths and accepted length), charges the weight sync of
the job's transport phase by phase from the profile (``sim/sync.py``; ``--weight-sync-s``
overrides it with a fixed figure), runs
:func:`longtail_workers.sim.step.compare` and prints the step, rollout, tail, trainer, idle and
harvested GPU-seconds side by side with the projected speedup, followed by the profile's notes
and what was adapted from the job. ``--plot FILE.png`` draws the per-worker timeline of one
step; ``--sensitivity`` adds the table of the inputs that move the projection most.
``--drafter KIND[,KIND...]`` (``learned``, ``history``, ``hybrid`` or ``all``) projects the job
with every strategy drafted by each kind, one column each, next to the one baseline; without
it the job's strategies are simulated as written. The history drafter's accepted lengths come
from ``--history-accepted-length`` / ``--hybrid-history-share``, else the profile, else the
defaults of ``sim/drafters.py`` (with a note); the learned drafter's from ``--accepted-length``,
else the profile's ``accepted_length["learned"]``, else :data:`DEFAULT_ACCEPTED_LENGTH`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from longtail_api.manifest import ManifestError, validate_file
from longtail_api.policies import DrafterKind
from longtail_api.profile import EngineProfile, ProfileError
from longtail_api.spec import RLJobSpec
from longtail_workers.sim.drafters import history_acceptance
from longtail_workers.sim.job import parse_lengths, shape_from_job
from longtail_workers.sim.latency import DEFAULT_PROPOSE_S
from longtail_workers.sim.roofline import QWEN2_SHAPES, roofline_profile
from longtail_workers.sim.runs import mean_results, read_run, replay
from longtail_workers.sim.sensitivity import format_rows, sensitivity
from longtail_workers.sim.step import JobShape, StepResult, compare
from longtail_workers.sim.sync import SyncCharge, job_sync_charge
from longtail_workers.weights.plan import TRANSPORTS

DEFAULT_ACCEPTED_LENGTH = 3.0
"""Accepted length when neither ``--accepted-length``, a run nor the profile gives one."""
DRAFTER_KINDS: tuple[DrafterKind, ...] = ("learned", "history", "hybrid")

ROWS: tuple[tuple[str, str], ...] = (
    ("step_s", "step (s)"),
    ("rollout_s", "rollout (s)"),
    ("tail_s", "tail: first worker done -> last (s)"),
    ("trainer_s", "trainer (s)"),
    ("weight_sync_s", "weight sync (s)"),
    ("merge_s", "drafter merge (s)"),
    ("idle_gpu_s", "idle rollout GPU-seconds"),
    ("harvested_gpu_s", "harvested GPU-seconds (drafter training)"),
    ("preempted", "answers preempted (KV cache full)"),
)


def _kinds(text: str) -> list[DrafterKind]:
    names = list(DRAFTER_KINDS) if text == "all" else [k.strip() for k in text.split(",")]
    kinds = [k for k in DRAFTER_KINDS if k in names]
    if not names or len(kinds) != len(set(names)):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give all or one or more of {', '.join(DRAFTER_KINDS)}, comma-separated"
        )
    return kinds


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
        help="response lengths: lognormal:median=M,p99_ratio=R,cap_fraction=F[,seed=S], or "
        "run:DIR to replay every step of a finished run (its -o directory)",
    )
    ap.add_argument(
        "--accepted-length",
        type=float,
        default=None,
        help="mean accepted length per SD step (accepted drafts + 1); default: each step's own "
        f"with run:DIR, else {DEFAULT_ACCEPTED_LENGTH}",
    )
    ap.add_argument(
        "--drafter",
        type=_kinds,
        default=None,
        help="project the job with every strategy drafted by this kind (learned, history, "
        "hybrid; several comma-separated or all: one column each); default: the job's "
        "strategies as written",
    )
    ap.add_argument(
        "--history-accepted-length",
        type=float,
        default=None,
        help="accepted length of a history step over all its rows (default: the profile's, "
        "else examples/01's measured 1.6)",
    )
    ap.add_argument(
        "--hybrid-history-share",
        type=float,
        default=None,
        help="share of a hybrid step's rows whose match is long enough to draft from history "
        "(default: the profile's, else examples/01's measured 0.28)",
    )
    ap.add_argument("--max-running", type=int, default=256, help="running batch per worker")
    ap.add_argument("--prompt-tokens", type=int, default=256, help="prompt length, tokens")
    ap.add_argument(
        "--weight-sync",
        choices=TRANSPORTS,
        default=None,
        help="the weight-sync transport to charge (default: the job's spec.weightSync, with "
        "auto resolved)",
    )
    ap.add_argument(
        "--link-gbps",
        type=float,
        default=None,
        help="assumed link rate between trainer and rollout workers, Gb/s (25 for 25 GbE, 400 "
        "for 400 Gb/s InfiniBand): caps the broadcast wire, bounds the HTTP pulls sharing the "
        "trainer's link; default: the profile's measured rates alone",
    )
    ap.add_argument(
        "--weight-sync-s",
        type=float,
        default=None,
        help="override: seconds to move a policy version to the workers (default: charged "
        "phase by phase from the profile's measured costs for the job's transport)",
    )
    ap.add_argument(
        "--kv-tokens",
        type=int,
        default=None,
        help="KV-cache capacity per rollout worker, tokens (default: the profile's; the "
        "roofline's follows from the GPU memory; 0: unbounded)",
    )
    ap.add_argument("--plot", metavar="FILE.png", help="write the per-worker timeline of a step")
    ap.add_argument(
        "--sensitivity",
        action="store_true",
        help="also vary accepted length, tail share and SD threshold one at a time (lognormal)",
    )
    return ap


def format_table(base: StepResult, longtail: StepResult, *more: tuple[str, StepResult]) -> str:
    """The side-by-side table (one line per figure, then the projected speedup); ``more``:
    further (label, result) columns, ``longtail`` then being labelled by the first's label."""
    arms = [("longtail", longtail)] if not more else list(more)
    width = max(len(label) for _, label in ROWS)
    lines = [f"{'':{width}}  {'baseline':>12}" + "".join(f"  {n:>12}" for n, _ in arms)]
    for attr, label in ROWS:
        values = [getattr(base, attr), *(getattr(r, attr) for _, r in arms)]
        digits = 2 if max(map(abs, values)) < 100 else 1  # CPU steps take seconds, GPU minutes
        lines.append(f"{label:{width}}" + "".join(f"  {v:12.{digits}f}" for v in values))
    for name, r in arms:
        tag = "projected speedup" if len(arms) == 1 else f"projected speedup, {name}"
        lines.append(
            f"{tag:{width}}  step {base.step_s / r.step_s:.2f}x, "
            f"rollout {base.rollout_s / r.rollout_s:.2f}x"
        )
    return "\n".join(lines)


def _charge(args: argparse.Namespace, spec: RLJobSpec, profile: EngineProfile) -> SyncCharge | None:
    """The job's weight sync charged from the profile's phase costs (None: ``--weight-sync-s``
    given, which is charged as is)."""
    if args.weight_sync_s is not None:
        if args.weight_sync_s < 0:
            raise ValueError(f"--weight-sync-s {args.weight_sync_s}: must be >= 0")
        return None
    link = None if args.link_gbps is None else args.link_gbps * 1e9 / 8
    return job_sync_charge(spec, profile, args.weight_sync, link)


def _job(path: str) -> RLJobSpec:
    results = validate_file(path)
    spec = results[0].spec
    if spec is None or not results[0].ok:
        errors = "; ".join(str(e) for e in results[0].errors)
        raise ValueError(f"{path}: not a valid RLJob ({errors}); run `longtail validate`")
    return spec


def _simulate(
    args: argparse.Namespace, spec: RLJobSpec, shape: JobShape, profile: EngineProfile
) -> tuple[list[tuple[StepResult, StepResult]], str]:
    """(baseline, Longtail) per simulated step and a line saying where the lengths came from."""
    if args.lengths.startswith("run:"):
        run_dir = args.lengths.removeprefix("run:")
        rows = read_run(run_dir)
        steps = replay(shape, rows, profile, args.accepted_length)
        return steps, f"lengths: {len(rows)} steps of run {run_dir} (per-step means below)"
    model = parse_lengths(args.lengths, spec.algorithm.max_new_tokens)
    return [compare(shape, model.lengths(shape.prompts, shape.group), profile)], (
        f"lengths: {args.lengths} (cap {model.cap})"
    )


def _learned_length(args: argparse.Namespace, profile: EngineProfile) -> float:
    """``--accepted-length``, else the profile's learned figure, else the default."""
    if args.accepted_length is not None:
        return float(args.accepted_length)
    return profile.accepted_length.get("learned", DEFAULT_ACCEPTED_LENGTH)


def _uses_history(shape: JobShape) -> bool:
    return any(s.drafter != "learned" for s in shape.speculative.strategies)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        spec = _job(args.job)
        profile = (
            EngineProfile.read(args.profile) if args.profile else roofline_profile(args.roofline)
        )
        if args.kv_tokens is not None:
            if args.kv_tokens < 0:
                raise ValueError(f"--kv-tokens {args.kv_tokens}: must be >= 0 (0: unbounded)")
            profile = dataclasses.replace(profile, kv_cache_tokens=args.kv_tokens or None)
        charge = _charge(args, spec, profile)
        acceptance, drafter_notes = history_acceptance(
            profile, args.history_accepted_length, args.hybrid_history_share
        )
        arms: list[tuple[str, JobShape, list[tuple[StepResult, StepResult]]]] = []
        notes: list[str] = []
        for kind in args.drafter or [None]:
            shape, shape_notes = shape_from_job(
                spec,
                max_running=args.max_running,
                prompt_tokens=args.prompt_tokens,
                accepted_length=_learned_length(args, profile),
                weight_sync_s=args.weight_sync_s if charge is None else charge.pause_s,
                drafter=kind,
                history=acceptance,
            )
            steps, source = _simulate(args, spec, shape, profile)
            arms.append((kind or "longtail", shape, steps))
            notes += [n for n in shape_notes if n not in notes]
        shape, steps = arms[0][1], arms[0][2]
        if args.sensitivity and args.lengths.startswith("run:"):
            raise ValueError("--sensitivity varies the lognormal length model; drop run:DIR")
        table = (
            format_rows(sensitivity(shape, parse_lengths(args.lengths,
                                                         spec.algorithm.max_new_tokens), profile))
            if args.sensitivity else None
        )  # fmt: skip
    except (ManifestError, ProfileError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    label = "ROOFLINE PROJECTION" if profile.source == "roofline" else "measured profile"
    print(f"profile: {label} ({profile.device}, engine {profile.engine})")
    print(source)
    base = mean_results([b for b, _ in steps])
    results = [(name, mean_results([lt for _, lt in s])) for name, _, s in arms]
    print(format_table(base, results[0][1], *(results if args.drafter else [])))
    if charge is not None:
        print(charge.line())
    else:
        print(f"weight sync: {args.weight_sync_s:g} s a version (given: --weight-sync-s)")
    if table is not None:
        print(f"\nsensitivity (one input varied at a time; * = base case, {label}; drafter "
              f"{arms[0][0]}):")  # fmt: skip
        print(table)
    if args.plot:
        plotted = max(range(len(steps)), key=lambda i: steps[i][0].tail_s)
        from longtail_workers.sim.plot import timeline_png

        caption = (f"{label}: {profile.device}, engine {profile.engine}; {source}; step "
                   f"{plotted + 1} of {len(steps)} (longest baseline tail)")  # fmt: skip
        if args.drafter:
            caption += f"; drafter {arms[0][0]}"
        timeline_png(*steps[plotted], args.plot, caption)
        print(f"timeline: {args.plot}")
    sync_notes = [] if charge is None else [f"weight sync: {n}" for n in charge.notes]
    if profile.overheads is None:
        sync_notes.append(
            "the profile has no overheads (per-call transport and capture, the engine's work "
            "between steps, warm-ups, the drafter merge): left out; a profile taken with this "
            "version's `longtail profile` measures them"
        )
    if any(_uses_history(s) for _, s, _ in arms):
        notes += drafter_notes + _history_cost_notes(profile)
    for note in [*profile.notes, *notes, *sync_notes]:
        print(f"note: {note}")
    return 0


def _history_cost_notes(profile: EngineProfile) -> list[str]:
    """What the history steps' costs were taken from, where the profile did not measure them."""
    notes = []
    if not profile.history_speculative:
        notes.append(
            "history step: the profile has no measured history-only step (written before the "
            "history drafter, vLLM or the roofline): charged as the speculative step less its "
            "draft steps, at least a plain step"
        )
    if not profile.history_propose:
        notes.append(
            f"history proposals: {DEFAULT_PROPOSE_S * 1e6:.0f} us a row a step (default, "
            "sim/latency.py; the profile did not time them)"
        )
    return notes
