"""``longtail`` subcommands: validate, crd, worker, run, drafter, profile, simulate, --version.

Called by the console script declared in pyproject.toml. Each subcommand is a small function
returning an exit code; heavy packages are imported inside the subcommand that needs them.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from longtail_api import __version__
from longtail_api.context import spec_context_error
from longtail_api.manifest import ManifestError, ValidationResult, validate_file
from longtail_api.rules import placement_errors
from longtail_api.scheduling import DefaultGang, effective_gang
from longtail_api.schema import render_crd
from longtail_api.topology import KUEUE_QUEUE_LABEL
from longtail_api.validation import FieldError

WORKER_ROLES: dict[str, str] = {
    "verifier": "longtail_workers.verifier.service:main",
    "rollout": "longtail_workers.rollout.service:main",
    "trainer": "longtail_workers.trainer.service:main",
    "drafter": "longtail_workers.drafter_worker.service:main",
}
"""Worker roles runnable with ``longtail worker ROLE``: role -> ``module:function(argv)``."""


def _placement(res: ValidationResult) -> list[FieldError]:
    """What the job's placer cannot express of its topology, where the file alone decides it:
    the job names its gang or asks for Kueue (its queue label). A job that names neither is
    placed by the install's default gang, which only the operator knows: it checks then."""
    spec = res.spec
    if spec is None or not spec.scheduling.topology:
        return []
    if spec.scheduling.gang is None and KUEUE_QUEUE_LABEL not in res.labels:
        return []
    return placement_errors(spec, res.labels, effective_gang(spec.scheduling.gang, DefaultGang()))


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate RLJob files; print every error, or one summary line per valid job.

    Beyond the spec's own rules, a job whose ``algorithm.maxNewTokens`` cannot fit its model's
    context is refused when the context is known without loading the model
    (``longtail_api.context``), and a topology its gang or Kueue cannot express is refused when
    the file names them (:func:`_placement`)."""
    failed = False
    for path in args.files:
        try:
            results = validate_file(path)
        except ManifestError as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed = True
            continue
        for i, res in enumerate(results):
            where = path if len(results) == 1 else f"{path}[{i}]"
            context = spec_context_error(res.spec) if res.spec and not res.errors else None
            errors = [*res.errors, *([context] if context else [])]
            if not errors:
                errors = _placement(res)
            if errors:
                failed = True
                print(f"{where}: {len(errors)} error(s):", file=sys.stderr)
                for err in errors:
                    print(f"  - {err}", file=sys.stderr)
                continue
            s = res.spec
            assert s is not None
            sd = "on" if s.speculative.enabled else "off"
            hv = s.harvest.source if s.harvest.enabled else "off"
            print(
                f"{where}: ok  rljob/{res.name}  model={s.model.path} dataset={s.dataset.path} "
                f"rollout={s.rollout.replicas}x{s.rollout.resources.gpus}gpu({s.rollout.engine}) "
                f"steps={s.algorithm.total_steps} sd={sd} harvest={hv}"
            )
    return 1 if failed else 0


def cmd_crd(args: argparse.Namespace) -> int:
    """Print the generated RLJob CRD."""
    sys.stdout.write(render_crd())
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    """Run one worker role in this process (what a worker pod's command is)."""
    # Under `longtail run`: stop when the parent dies (before torch is imported; parentwatch.py).
    parentwatch = importlib.import_module("longtail_workers.parentwatch")
    try:
        parentwatch.watch_parent()
    except parentwatch.ParentWatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    target = WORKER_ROLES[args.role]
    module_name, func_name = target.split(":")
    entry: Callable[[list[str]], int] = getattr(importlib.import_module(module_name), func_name)
    # In a pod the operator passes only --host/--port; the rest comes from LONGTAIL_* variables.
    podenv = importlib.import_module("longtail_workers.podenv")
    try:
        argv: list[str] = podenv.pod_args(args.role, list(args.forwarded), os.environ)
    except podenv.PodEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        return entry(argv)
    finally:
        # The process ends next. Its objects go to the permanent generation, which the
        # interpreter's last collection skips: that collection would otherwise walk torch's and
        # transformers' whole object graph, the larger part of a worker's exit time
        # (docs/performance.md, "Test suite time"). The role has closed its files and servers.
        gc.freeze()


def forward_to(target: str, doc: str) -> Callable[[argparse.Namespace], int]:
    """A subcommand that hands its arguments to ``module:function(argv)`` of the workers,
    imported only when the subcommand runs (the CLI itself stays light)."""

    def cmd(args: argparse.Namespace) -> int:
        module_name, func_name = target.split(":")
        entry: Callable[[list[str]], int] = getattr(importlib.import_module(module_name), func_name)
        return entry(list(args.forwarded))

    cmd.__doc__ = doc
    return cmd


cmd_run = forward_to(
    "longtail_workers.local.run:run",
    "Run an RLJob locally (worker processes on loopback); see docs/local-mode.md.",
)
cmd_drafter_export = forward_to(
    "longtail_workers.drafter.export:main",
    "Export a drafter for EAGLE-capable serving engines (see docs/drafter-export.md).",
)
cmd_drafter_fit = forward_to(
    "longtail_workers.warmstart.offline:main",
    "Fit a job's drafter offline, for spec.drafterTraining.initialDrafter (docs/local-mode.md).",
)
cmd_profile = forward_to(
    "longtail_workers.profile.main:main",
    "Measure the engine, drafter and trainer on this machine; write an engine profile file.",
)
cmd_simulate = forward_to(
    "longtail_workers.sim.main:main",
    "Simulate an RLJob's step on an engine profile: baseline vs Longtail (pure Python).",
)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="longtail",
        description="Longtail: RL training with adaptive speculative rollout on idle GPUs.",
    )
    ap.add_argument("--version", action="version", version=f"longtail {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="validate RLJob YAML files (all errors, with field paths)")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("crd", help="print the RLJob CustomResourceDefinition")
    p.set_defaults(func=cmd_crd)

    p = sub.add_parser(
        "worker",
        help="run a worker role (used in worker pods and local mode)",
        add_help=False,  # `longtail worker ROLE --help` shows the role's own options
    )
    p.add_argument("role", choices=sorted(WORKER_ROLES))
    p.set_defaults(func=cmd_worker, forwards=True)

    p = sub.add_parser(
        "run",
        help="run an RLJob on this machine: longtail run FILE [--output RUN_DIR] "
        "[--resume RUN_DIR] [--no-speculative] [--no-harvest]",
        add_help=False,  # the local-mode runner owns its options (and --help)
    )
    p.set_defaults(func=cmd_run, forwards=True)

    p = sub.add_parser("drafter", help="drafter utilities")
    dsub = p.add_subparsers(dest="drafter_command", required=True, metavar="ACTION")
    e = dsub.add_parser(
        "export",
        help="write a drafter as an EAGLE draft model for SGLang or vLLM",
        add_help=False,  # --help goes to the exporter, which owns the options
    )
    e.set_defaults(func=cmd_drafter_export, forwards=True)
    f = dsub.add_parser(
        "fit",
        help="fit a job's drafter offline on its policy's rollouts (for initialDrafter)",
        add_help=False,  # --help goes to the fitter, which owns the options
    )
    f.set_defaults(func=cmd_drafter_fit, forwards=True)

    p = sub.add_parser(
        "profile",
        help="measure the engine on this machine and write a profile: longtail profile "
        "(--model builtin:tiny | --shape qwen2-0.5b) [--device cuda] [--quick] [--out FILE]",
        add_help=False,  # the profiler owns its options (and --help)
    )
    p.set_defaults(func=cmd_profile, forwards=True)

    p = sub.add_parser(
        "simulate",
        help="predict one RL step, baseline vs Longtail: longtail simulate FILE "
        "(--profile P | --roofline MODEL) [--lengths lognormal:median=...]",
        add_help=False,  # the simulator owns its options (and --help)
    )
    p.set_defaults(func=cmd_simulate, forwards=True)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # Subcommands that hand their options to another module's own parser (worker roles, the
    # drafter exporter) receive every argument argparse did not claim, --help included.
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "forwards", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.forwarded = rest
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
