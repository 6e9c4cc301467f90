"""``longtail run FILE``: the whole RLJob on this machine, as processes on loopback ports.

Called by the CLI (``longtail run``, ``longtail run --resume RUN_DIR``). Steps: validate the
user's file (a refused job leaves no run directory; exit 2, one error naming the file); create
the run directory (``job.yaml``, ``run.json`` with the switches, ``logs/``,
``drafters/``, checkpoints, ``metrics.jsonl``); build ``builtin:`` models once up front; start
the verifier, the trainer (``trainer.replicas`` processes: one rank each, gloo, with the
rendezvous environment a trainer pod gets; rank 0 logs to ``logs/trainer.log``, rank N to
``logs/trainer-N.log``) and ``rollout.replicas`` rollout workers (``longtail worker ...``,
one torch thread each; the trainer keeps ``drafters/`` and the workers exchange drafters with
it over its HTTP port, as pods do on a cluster) and ``spec.drafter.replicas`` dedicated drafter
workers (``longtail worker drafter``, ``logs/drafter-N.log``; given the trainer's URL up front,
they poll it until it serves, as a drafter pod does, and pull policy versions from its HTTP
weight server); policy versions travel by ``--weight-sync`` (``auto``, the default: the job's
``spec.weightSync`` resolved; ``http``; ``broadcast``: the trainer gets a free
``--weight-sync-port`` and the rollout workers its ``--weight-sync-addr``); run the harvest
coordinator and the progress display until the trainer exits (restarting a lost rollout or
drafter worker up to ``spec.backoffLimit`` times; past that the run shrinks, and below
``spec.rollout.minReplicas`` for longer than ``belowMinGraceSeconds`` it checkpoints and stops:
``local/restarts.py``); stop every child; write the report. Ctrl-C (SIGINT), SIGTERM or
SIGHUP (the terminal closed; left ignored under ``nohup``): the trainer is asked to stop,
checkpoints the last completed step and exits, then the workers are stopped; the run can be
continued with ``--resume``. If the parent is killed outright, each child stops by itself
(``parentwatch.py``). Exit codes: 0 complete, 1 failed, 75 stopped with too few rollout workers
(checkpointed; resumable), 130 stopped; ``summary.json`` has the ``outcome`` and, unless
complete, the ``reason`` (a failed trainer's own error line, e.g. a checkpoint that did not fit
on the disk; the rollout workers left and ``minReplicas``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from longtail_api.context import spec_context_error
from longtail_api.drafterstatus import describe_refusals
from longtail_api.policies import DrafterLayout
from longtail_api.protocol import ProtocolError
from longtail_api.rendezvous import TrainerRendezvous
from longtail_api.spec import RLJobSpec
from longtail_api.tracking import TRACKING_BACKENDS
from longtail_api.wirecodec import from_wire
from longtail_api.workerapi import TrainerStatus
from longtail_workers.auth import export_run_token
from longtail_workers.httpclient import http_json
from longtail_workers.jobspec import JobSpecError, load_job_spec
from longtail_workers.local.coordinator import Coordinator
from longtail_workers.local.launcher import Child, ChildFailed, free_port, stop_all
from longtail_workers.local.progress import Progress
from longtail_workers.local.report import write_report
from longtail_workers.local.restarts import Restarts
from longtail_workers.local.tracking_end import log_report, tracking_switch
from longtail_workers.models.cache import BuildWaitStopped
from longtail_workers.models.recipe import BUILD_INFO_FILE, RECIPES, policy_dir
from longtail_workers.warmstart.recipe import BUILD_INFO_FILE as DRAFTER_BUILD_INFO
from longtail_workers.warmstart.recipe import builtin_drafter_dir, is_builtin
from longtail_workers.weights.plan import sync_plan

STOPPED = 130
BELOW_MIN = 75
"""Exit code of a run stopped (checkpointed) below ``spec.rollout.minReplicas`` rollout workers:
EX_TEMPFAIL, a run to resume once the workers can run."""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="longtail run", description=__doc__.split("\n")[0])
    ap.add_argument("file", nargs="?", help="RLJob YAML (omit with --resume)")
    ap.add_argument("--output", "-o", default=None, help="run directory (default runs/NAME-TIME)")
    ap.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue this run")
    ap.add_argument("--no-speculative", action="store_true", help="plain decoding (baseline)")
    ap.add_argument("--no-harvest", action="store_true", help="never harvest idle workers")
    ap.add_argument(
        "--weight-sync",
        choices=("auto", "http", "broadcast"),
        default="auto",
        help="how policy versions reach the rollout workers (auto: the job's spec.weightSync)",
    )
    ap.add_argument(
        "--tracking",
        action="append",
        choices=TRACKING_BACKENDS,
        default=[],
        help="also log to this experiment tracker (spec.tracking; repeatable)",
    )
    ap.add_argument("--startup-timeout", type=float, default=600.0)
    return ap


def prepare_run_dir(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """The run directory and its options (from ``run.json`` when resuming)."""
    if args.resume:
        run_dir = Path(args.resume)
        info_path = run_dir / "run.json"
        if not info_path.is_file():
            raise JobSpecError(f"--resume {run_dir}: no run.json there; is it a longtail run dir?")
        opts = json.loads(info_path.read_text())
        return run_dir, opts
    if not args.file:
        raise JobSpecError("give the RLJob file: longtail run FILE (or --resume RUN_DIR)")
    name = Path(args.file).stem
    run_dir = Path(args.output or f"runs/{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if (run_dir / "run.json").exists():
        raise JobSpecError(f"{run_dir} already holds a run; use --resume {run_dir} or another -o")
    run_dir.mkdir(parents=True, exist_ok=True)
    opts = {
        "job": name,
        "source": str(args.file),
        "no_speculative": args.no_speculative,
        "no_harvest": args.no_harvest,
        "weight_sync": args.weight_sync,
        "tracking": args.tracking,
    }
    (run_dir / "job.yaml").write_text(switched_job(Path(args.file).read_text(), opts))
    (run_dir / "run.json").write_text(json.dumps(opts, indent=2) + "\n")
    return run_dir, opts


def switched_job(text: str, opts: dict[str, Any]) -> str:
    """The job file's text with ``--no-speculative`` and ``--no-harvest`` written into its spec
    (``enabled: false``): every process of the run (this one, the trainer, the workers) reads
    the run's ``job.yaml``, so each switch is a spec field there. Unchanged without switches."""
    switched = [field for field in ("speculative", "harvest") if opts.get(f"no_{field}")]
    if not switched and not opts.get("tracking"):
        return text  # the user's file as written, comments included
    job = yaml.safe_load(text)
    for field in switched:
        job["spec"].setdefault(field, {})["enabled"] = False
    tracking_switch(job, opts.get("tracking") or [])
    return str(yaml.safe_dump(job, sort_keys=False))


def check_initial_drafter(spec: RLJobSpec, job_file: str) -> None:
    """Refuse a job whose ``initialDrafter`` is not there before any process starts."""
    path = spec.drafter_training.initial_drafter
    if path and path.startswith("builtin:"):
        return  # a built-in drafter: the spec rules checked the name, prepare() fits it
    if path and not (Path(path) / "config.json").is_file():
        raise JobSpecError(
            f"spec.drafterTraining.initialDrafter: {path!r} is not a drafter directory (no "
            f"config.json under {Path(path).resolve()}); write one with `longtail drafter fit "
            f"{job_file} -o {path}`, or remove the field to start from a fresh drafter"
        )


def start_children(
    spec: RLJobSpec,
    run_dir: Path,
    opts: dict[str, Any],
    resume: bool,
    timeout_s: float,
    started: list[Child],
) -> tuple[Child, dict[str, str]]:
    """Start verifier, rollout workers and trainer; each is appended to ``started`` at once,
    so the caller can stop whatever did start when a later one fails. Only the trainer opens the
    drafter registry directory; the workers use its HTTP exchange (``--drafters-url``)."""
    logs, job = run_dir / "logs", str(run_dir / "job.yaml")
    drafters = str(run_dir / "drafters")
    verifier = Child(
        "verifier", "verifier", ["--port", "0"], logs, "longtail verifier listening on "
    )
    started.append(verifier)
    weights_port, trainer_port = free_port(), free_port()
    n = spec.rollout.replicas
    ports = [free_port() for _ in range(n)]
    workers = {f"rollout-{i}": f"http://127.0.0.1:{p}" for i, p in enumerate(ports)}
    transport = weight_sync_transport(spec, opts["weight_sync"])
    sync = ["--weight-sync", transport]
    trainer_sync, rollout_sync = list(sync), list(sync)
    if transport == "broadcast":
        sync_port = free_port()
        trainer_sync += ["--weight-sync-port", str(sync_port)]
        rollout_sync += ["--weight-sync-addr", f"127.0.0.1:{sync_port}"]
    rollouts = []
    for name, port in zip(workers, ports, strict=True):
        args = ["--job", job, "--name", name, "--port", str(port),
                "--drafters-url", f"http://127.0.0.1:{trainer_port}",
                "--weights-url", f"http://127.0.0.1:{weights_port}", *rollout_sync]  # fmt: skip
        rollouts.append(Child(name, "rollout", args, logs, "longtail rollout listening on "))
        started.append(rollouts[-1])
    trainer_url = f"http://127.0.0.1:{trainer_port}"
    start_drafters(spec, run_dir, trainer_url, f"http://127.0.0.1:{weights_port}", started)
    verifier_url = verifier.wait_ready(timeout_s)
    targs = ["--job", job, "--run-dir", str(run_dir), "--port", str(trainer_port),
             "--weights-port", str(weights_port), "--verifier-url", verifier_url,
             "--drafters", drafters, "--startup-timeout", str(timeout_s),
             *trainer_sync]  # fmt: skip
    targs += [a for name, url in workers.items() for a in ("--rollout", f"{name}={url}")]
    if resume:
        targs.append("--resume")
    ranks = trainer_ranks(spec)
    trainer = Child("trainer", "trainer", targs, logs, "longtail trainer listening on ", ranks[0])
    started.append(trainer)
    for i, env in enumerate(ranks[1:], start=1):  # followers: no URL, they obey rank 0
        started.append(Child(f"trainer-{i}", "trainer", targs, logs, "", env))
    return trainer, workers


def start_drafters(
    spec: RLJobSpec, run_dir: Path, trainer_url: str, weights_url: str, started: list[Child]
) -> None:
    """Start ``spec.drafter.replicas`` dedicated drafter workers (none without ``spec.drafter``):
    they poll the trainer's step samples (until it serves) and use its weight server and drafter
    exchange, as a drafter pod does."""
    if spec.drafter is None:
        return
    logs, job = run_dir / "logs", str(run_dir / "job.yaml")
    for i in range(spec.drafter.replicas):
        name = f"drafter-{i}"
        args = ["--job", job, "--name", name, "--port", "0", "--trainer-url", trainer_url,
                "--weights-url", weights_url]  # fmt: skip
        started.append(Child(name, "drafter", args, logs, "longtail drafter listening on "))


def weight_sync_transport(spec: RLJobSpec, weight_sync: str) -> str:
    """``http`` or ``broadcast``: the job's plan (``weights.plan.sync_plan``) for the
    ``--weight-sync`` kept in ``run.json`` (``auto``: the job's ``spec.weightSync``)."""
    try:
        return sync_plan(spec, weight_sync).transport
    except ValueError:
        raise JobSpecError(
            f"run.json: weight_sync {weight_sync!r} is not supported any more (the "
            "torch.distributed transport was replaced by broadcast); write auto, http or "
            "broadcast there and resume again"
        ) from None


def trainer_ranks(spec: RLJobSpec) -> list[dict[str, str]]:
    """The environment of each local trainer process: one rank per ``trainer.replicas`` (CPU,
    gloo), the rendezvous a trainer pod gets from the operator; ``[{}]`` for a lone trainer."""
    n = spec.trainer.replicas
    if n == 1:
        return [{}]
    port = free_port()
    return [TrainerRendezvous("127.0.0.1", port, nnodes=n, node_rank=i).to_env() for i in range(n)]


def read_job(args: argparse.Namespace) -> tuple[RLJobSpec, Path, dict[str, Any]]:
    """The validated spec, the run directory and its options.

    A new run's file is checked before its run directory is made: a missing or unreadable
    file, an invalid job, a missing ``initialDrafter`` or a ``maxNewTokens`` beyond the model's
    context (``longtail_api.context``) leaves nothing behind, and errors name the user's file.
    """
    if args.resume:
        run_dir, opts = prepare_run_dir(args)  # creates nothing
        job = run_dir / "job.yaml"
        job.write_text(switched_job(job.read_text(), opts))  # idempotent (older runs lack them)
        spec = load_job_spec(job)
        check_job(spec, opts.get("source", str(run_dir / "job.yaml")))
        weight_sync_transport(spec, opts["weight_sync"])
        return spec, run_dir, opts
    if not args.file:
        raise JobSpecError("give the RLJob file: longtail run FILE (or --resume RUN_DIR)")
    check_job(load_job_spec(args.file), args.file)
    run_dir, opts = prepare_run_dir(args)
    return load_job_spec(run_dir / "job.yaml"), run_dir, opts


def check_job(spec: RLJobSpec, job_file: str) -> None:
    """What ``longtail validate`` cannot see in the spec alone, checked before any process."""
    check_initial_drafter(spec, job_file)
    context = spec_context_error(spec) or gpu_error(spec)
    if context is not None:
        raise JobSpecError(f"{job_file}: 1 error(s):\n  - {context}")


def gpu_error(spec: RLJobSpec) -> str | None:
    """A role that asks for GPUs on a machine without one: every role of a local run runs
    here, and would otherwise run (or build ``builtin:small``) on the CPU for hours."""
    roles = [("rollout", spec.rollout), ("verifier", spec.verifier), ("trainer", spec.trainer),
             ("drafter", spec.drafter)]  # fmt: skip
    asking = [(name, role.resources.gpus) for name, role in roles if role and role.resources.gpus]
    if not asking:
        return None
    import torch  # only for a job that asks for GPUs: a CPU job's start stays light

    if torch.cuda.is_available():
        return None
    name, gpus = asking[0]
    return (
        f"spec.{name}.resources.gpus: {gpus}, but this machine has no CUDA GPU (local mode runs "
        "every role here); run the job on a machine with a GPU, or set every role's "
        "resources.gpus to 0 for a CPU run"
    )


def prepare_builtins(spec: RLJobSpec) -> None:
    """Build the job's ``builtin:`` model and drafter once, here, before any process starts
    (each would otherwise wait on the other's lock inside its startup timeout). Whether they
    are built already is asked of the torch-free recipe modules: the builders' imports (torch,
    transformers: seconds) are paid only when something is to be built."""
    model = spec.model.path
    if model.startswith("builtin:"):
        if (built := _built_model(model)) is not None:
            print(f"using {model}, cached in {built}", flush=True)
        else:
            from longtail_workers.models.loading import resolve_model_path

            print(f"preparing {model} (built once, then cached) ...", flush=True)
            resolve_model_path(model)
    drafter = spec.drafter_training.initial_drafter
    layout = spec.drafter_training.layout
    if drafter and is_builtin(drafter):
        if (built := _built_drafter(drafter, layout)) is not None:
            print(f"using the {drafter} drafter, cached in {built}", flush=True)
        else:
            from longtail_workers.warmstart.builtin import ensure_builtin_drafter

            print(f"preparing the {drafter} drafter (fitted once, then cached) ...", flush=True)
            ensure_builtin_drafter(drafter, layout)


def _built_model(path: str) -> Path | None:
    """The directory of ``builtin:<name>`` if it is built and complete, else None (also for an
    unknown name: the build path names the known ones)."""
    recipe = RECIPES.get(path.removeprefix("builtin:"))
    final = policy_dir(recipe) if recipe is not None else None
    return final if final is not None and (final / BUILD_INFO_FILE).is_file() else None


def _built_drafter(name: str, layout: DrafterLayout) -> Path | None:
    """The directory of the built-in drafter ``name`` in ``layout`` if it is fitted and
    complete, else None."""
    try:
        final = builtin_drafter_dir(name, layout)
    except ValueError:  # not a built-in drafter: ensure_builtin_drafter names the known ones
        return None
    return final if (final / DRAFTER_BUILD_INFO).is_file() else None


def run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        spec, run_dir, opts = read_job(args)
    except JobSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        prepare_builtins(spec)
    except BuildWaitStopped as exc:  # Ctrl-C while another process builds the model
        print(f"stopped: {exc}; no process was started", file=sys.stderr)
        return STOPPED
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in stop_signals()}
    progress = Progress()
    progress.message(f"run directory: {run_dir}")
    children: list[Child] = []
    coordinator: Coordinator | None = None
    code, started, reason = 1, time.monotonic(), None
    restarts = Restarts.of(spec, run_dir=str(run_dir))
    try:
        token = export_run_token()  # the run's job token: children inherit it, not via argv
        trainer, workers = start_children(
            spec, run_dir, opts, bool(args.resume), args.startup_timeout, children
        )
        trainer_url = trainer.wait_ready(args.startup_timeout)
        write_processes(run_dir, children, workers, trainer_url)
        coordinator = Coordinator(spec.harvest, trainer_url, workers, token=token).start()

        def restarted() -> None:  # the harvest loop starts the new process over in its role
            write_processes(run_dir, children, workers, trainer_url)
            assert coordinator is not None
            coordinator.restarted(restarts.restarted[-1])

        restarts.on_restart = restarted
        code, reason = supervise(trainer, children, coordinator, progress, stop, restarts)
    except ChildFailed as exc:
        progress.message(f"error: {exc}")
        reason = str(exc).splitlines()[0]
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if coordinator is not None:
            coordinator.stop()
        stop_all(children)
    info = {
        **opts,
        "outcome": {0: "complete", STOPPED: "stopped", BELOW_MIN: "stopped"}.get(code, "failed"),
        "reason": reason,
        "wall_s": time.monotonic() - started,
        **start_eval(run_dir),
        **restarts.summary(),
    }
    summary = write_report(run_dir, coordinator.books if coordinator else None, info)
    if not log_report(spec, run_dir, coordinator.books if coordinator else None, info["outcome"]):
        progress.message("tracking: some records were not sent (see the warnings above)")
    print_summary(progress, summary, run_dir, code)
    return code


def stop_signals() -> list[signal.Signals]:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal), unless SIGHUP is ignored (``nohup``)."""
    sigs = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        sigs.append(signal.SIGHUP)
    return sigs


def supervise(trainer: Child, children: list[Child], coordinator: Coordinator,
              progress: Progress, stop: threading.Event,
              restarts: Restarts) -> tuple[int, str | None]:  # fmt: skip
    """Poll and display until the trainer exits; forward a stop request to it; restart lost
    rollout workers (``restarts``), replacing them in ``children``, and stop below
    ``minReplicas`` (:meth:`Restarts.below_min`). Returns the exit code and, unless complete,
    why the run ended."""
    asked_stop, below_min, reason = False, False, None
    while trainer.alive:
        if stop.is_set() and not asked_stop:
            progress.message("stopping: the trainer checkpoints the last completed step ...")
            trainer.signal(signal.SIGTERM)
            asked_stop = True
        status = coordinator.trainer
        if status is None:
            status = _poll_trainer(coordinator.trainer_url)
        if status is not None:
            progress.update(status, coordinator.books)
        if not asked_stop and not stop.is_set():
            for line in restarts.check(children, trainer):
                progress.message(line)
            coordinator.present([c.name for c in children if c.role == "rollout" and c.alive])
            why = restarts.below_min(children)
            if why is not None:
                progress.message(f"stopping: {why}")
                trainer.signal(signal.SIGTERM)  # it checkpoints the last completed step
                asked_stop = below_min = True
                reason = why
        with contextlib.suppress(subprocess.TimeoutExpired):
            trainer.proc.wait(0.5)  # the next poll, or at once when the trainer exits
    rc = trainer.proc.wait()
    if rc != 0:
        progress.message(f"trainer failed (exit {rc}):\n{trainer.tail()}")
        return 1, f"the trainer failed (exit {rc}): {trainer.error_line() or 'no output'}"
    if below_min:
        return BELOW_MIN, reason
    return (STOPPED, "stop requested (Ctrl-C, SIGTERM or SIGHUP)") if asked_stop else (0, None)


def write_processes(
    run_dir: Path, children: list[Child], workers: dict[str, str], trainer_url: str
) -> None:
    """``processes.json``: name, pid and URL of every child (for operators and tests); replaced
    whole (a restart rewrites it while others may read it)."""
    urls = {**workers, "trainer": trainer_url}
    procs = [{"name": c.name, "pid": c.proc.pid, "url": urls.get(c.name, c.url)} for c in children]
    tmp = run_dir / "processes.json.tmp"
    tmp.write_text(json.dumps(procs, indent=2) + "\n")
    tmp.replace(run_dir / "processes.json")


def _poll_trainer(url: str) -> TrainerStatus | None:
    try:
        return from_wire(TrainerStatus, http_json(url + "/v1/status", None, 5.0, "GET"), "status")
    except (OSError, ValueError, ProtocolError):
        return None


def start_eval(run_dir: Path) -> dict[str, float | None]:
    """Greedy and sampled accuracy of the step-0 evaluation (``eval/step-000000.jsonl``)."""
    path = run_dir / "eval" / "step-000000.jsonl"
    text = path.read_text() if path.is_file() else ""
    rows = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
    greedy = [r["correct"] for r in rows if "sample" not in r]
    sampled = [r["correct"] for r in rows if "sample" in r]
    return {
        "start_eval_accuracy": sum(greedy) / len(greedy) if greedy else None,
        "start_eval_sampled_accuracy": sum(sampled) / len(sampled) if sampled else None,
    }


def print_summary(progress: Progress, s: dict[str, Any], run_dir: Path, code: int) -> None:
    def f(v: Any, fmt: str = ".3f") -> str:
        return "-" if v is None else format(v, fmt)

    progress.message(
        f"\n{s['outcome']}: {s['steps_completed']} steps in {s['wall_s']:.0f}s; "
        f"eval accuracy {f(s['start_eval_accuracy'])} -> {f(s['final_eval_accuracy'])} "
        f"({f(s['eval_gain_points'], '+.1f')} points)"
        + (
            f", sampled {f(s['start_eval_sampled_accuracy'])} -> "
            f"{f(s['final_eval_sampled_accuracy'])} ({f(s['eval_sampled_gain_points'], '+.1f')})"
            if s.get("start_eval_sampled_accuracy") is not None
            else ""
        )
        + f"; mean step {f(s['mean_step_s'], '.1f')}s (rollout {f(s['rollout_share'], '.0%')}); "
        f"SD tokens {f(s['sd_fraction_mean'])}; "
        f"accepted length {f(s['accepted_length_mean'], '.2f')} "
        f"(last 5 steps {f(s['accepted_length_last5'], '.2f')}); "
        f"idle {s['idle_s_total']:.1f}s, harvested {s['harvested_s_total']:.1f}s worker-seconds"
        + (
            f", trainer harvested {s['trainer_harvested_s_total']:.1f}s"
            if "trainer_harvested_s_total" in s
            else ""
        )
    )
    # The report's per-draft-source means (summary keys sd_fraction_mean_<source>, ...).
    sources = [k.removeprefix("sd_fraction_mean_") for k in s if k.startswith("sd_fraction_mean_")]
    if sources:
        parts = [
            f"{src} {f(s[f'sd_fraction_mean_{src}'])} of the tokens, accepted length "
            f"{f(s.get(f'accepted_length_mean_{src}'), '.2f')}"
            for src in sources
        ]
        progress.message(f"speculation by drafter: {'; '.join(parts)}")
    if s.get("reason"):
        progress.message(f"{s['outcome']}: {s['reason']}")
    if s.get("acceptance_collapsed_steps"):
        steps = s["acceptance_collapsed_steps"]
        progress.message(
            f"warning: speculative decoding accepted almost nothing at step(s) "
            f"{', '.join(map(str, steps[:10]))}{' ...' if len(steps) > 10 else ''} after it had "
            "worked: the drafter stopped matching the policy (see the trainer log)"
        )
    log = run_dir / "logs" / "trainer.log"
    if s.get("drafter_candidates_rejected"):
        refused = s.get("drafter_candidates_refused") or {}  # by reason; absent in old rows
        words = describe_refusals(refused) if refused else "see the trainer's log for why"
        progress.message(
            f"warning: {s['drafter_candidates_rejected']} drafter candidate(s) were refused: "
            f"{words}; see {log}"
        )
    if s.get("drafter_unpublished"):
        progress.message(
            f"warning: no online drafter version was published: {s['drafter_unpublished']}; "
            f"see {log}"
        )
    if s.get("lost_workers"):
        progress.message(
            f"warning: lost worker(s): {', '.join(s['lost_workers'])}; restarted: "
            f"{', '.join(s['restarted_workers']) or 'none'}; see {run_dir / 'logs'}"
        )
    if s.get("rollout_resizes"):
        steps = ", ".join(f"step {r['step']}: {r['was']} -> {r['rollout_workers']}"
                          for r in s["rollout_resizes"])  # fmt: skip
        progress.message(f"rollout workers per step changed: {steps}")
    progress.message(f"report: {run_dir / 'report' / 'summary.md'}")
    if code in (STOPPED, BELOW_MIN) or (code != 0 and s["steps_completed"]):
        progress.message(f"resume with: longtail run --resume {run_dir}")
