"""Process plumbing shared by the rollout and trainer services (pods and ``longtail run`` alike).

``rollout/service.py``, ``trainer/service.py`` and ``drafter_worker/service.py`` call
:func:`policy_and_drafter` (policy, initial drafter, drafter registry: a shared directory or
the trainer's HTTP exchange), :func:`torch_threads` (torch's CPU threads from the role's
``resources.cpu``), :func:`make_weight_source` (HTTP pull, or broadcast receive with HTTP
catch-up, by the job's plan, ``weights.plan.sync_plan``; flags from
:func:`add_weight_sync_args`) and :class:`ServiceRuntime` (bind, print the ``listening on URL``
line a parent process reads, run until SIGTERM/SIGINT, stop cleanly); the rollout and drafter
workers' ``main`` opens with :func:`start_service` (arguments from :func:`worker_parser`,
logging, job token, job spec).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from longtail_api.spec import ResourcesSpec, RLJobSpec
from longtail_workers.signals import install_stop_signals
from longtail_workers.weights.plan import TRANSPORTS
from longtail_workers.weights.sync import WeightSource

if TYPE_CHECKING:  # the drafter modules load lazily, when a worker builds its models
    from longtail_workers.drafter.model import EagleDrafter
    from longtail_workers.drafter.registry import DrafterStore

log = logging.getLogger(__name__)


def torch_threads(requested: int | None, resources: ResourcesSpec) -> int:
    """Set and return torch's CPU threads: ``--threads`` when given, else the role's CPUs.

    The role's ``resources.cpu`` (whole CPUs, at least one) is capped at the CPUs this process
    may run on, so a pod without a CPU limit on a large node does not oversubscribe it.
    """
    if requested is not None and requested < 1:
        raise ValueError(f"--threads {requested}: must be >= 1")
    available = len(os.sched_getaffinity(0))
    threads = requested if requested is not None else min(resources.cpu_threads(), available)
    torch.set_num_threads(threads)
    return threads


def role_device(resources: ResourcesSpec) -> str:
    """Where a role's torch model lives: ``cuda`` when the role asks for GPUs, else ``cpu``.

    A pod given GPUs whose process sees none fails when the model loads (``resolve_device``
    names the fix) instead of running on the CPU unnoticed.
    """
    return "cuda" if resources.gpus >= 1 else "cpu"


@dataclass(frozen=True)
class PolicyAndDrafter:
    """What :func:`policy_and_drafter` loads for a rollout or drafter worker."""

    model: torch.nn.Module
    """The policy, in eval mode on the role's device."""
    drafter: EagleDrafter
    """The job's initial drafter on :attr:`model` (:func:`initial_drafter`)."""
    registry: DrafterStore | None
    """The shared directory's registry, the trainer's drafter exchange, or None (neither)."""
    target_id: str
    """The policy's id that drafters are checked against (``spec.model.path``)."""


def policy_and_drafter(
    spec: RLJobSpec,
    registry_dir: str | None,
    registry_url: str | None = None,
    device: str = "cpu",
) -> PolicyAndDrafter:
    """The policy on ``device``, its initial drafter and the drafter registry.

    The registry is the shared directory ``registry_dir`` or the trainer's drafter exchange at
    ``registry_url`` (``drafter/exchange.py``); give at most one.
    """
    if registry_dir and registry_url:
        raise ValueError(
            f"drafter registry: both a directory ({registry_dir}) and a URL ({registry_url}) "
            "given; use --drafters DIR for a shared directory or --drafters-url URL for the "
            "trainer's HTTP exchange, not both"
        )
    from longtail_workers.drafter.exchange import RemoteDrafterRegistry
    from longtail_workers.drafter.registry import DrafterRegistry
    from longtail_workers.models.loading import load_policy

    model, _ = load_policy(spec.model.path, dtype=spec.model.dtype, device=device)
    target_id = spec.model.path
    drafter = initial_drafter(spec, model, target_id)
    registry: DrafterStore | None = None
    if registry_dir:
        registry = DrafterRegistry(registry_dir)
    elif registry_url:
        registry = RemoteDrafterRegistry(registry_url)
    return PolicyAndDrafter(model, drafter, registry, target_id)


def initial_drafter(spec: RLJobSpec, model: Any, target_id: str) -> Any:
    """The job's starting drafter on ``model`` (eval mode): ``drafterTraining.initialDrafter``
    when set (a directory, or ``builtin:tiny``), else a fresh one in ``drafterTraining.layout``.
    Rollout workers and the trainer's own harvest (``trainer/drafter_window.py``) start from the
    same one."""
    from longtail_workers.drafter.checkpoint import load_drafter
    from longtail_workers.drafter.model import EagleDrafter, layout_options
    from longtail_workers.warmstart.builtin import ensure_builtin_drafter, is_builtin

    initial = spec.drafter_training.initial_drafter
    if initial and is_builtin(initial):  # fitted on first use, cached (warmstart/builtin.py)
        path = ensure_builtin_drafter(initial, spec.drafter_training.layout)
        drafter = load_drafter(path, model, target_id=target_id)
    elif initial:
        drafter = load_drafter(initial, model, target_id=target_id)
    else:
        layout = layout_options(spec.drafter_training.layout)
        drafter = EagleDrafter(model, target_id=target_id, **layout)
    return drafter.eval()


def make_weight_source(
    args: argparse.Namespace, spec: RLJobSpec, timeout_s: float = 120.0
) -> WeightSource | None:
    """The rollout worker's weight source (None: no ``--weights-url``, keep the weights it
    loaded), by the job's plan (``weights.plan.sync_plan``: ``--weight-sync``, else the job's
    ``spec.weightSync``): ``http`` pulls each version from the trainer's weight server;
    ``broadcast`` receives it on the trainer's broadcast (``--weight-sync-addr``, else
    ``LONGTAIL_WEIGHT_SYNC_ADDR``) and pulls over HTTP only to catch up, so it needs the
    weights URL too."""
    from longtail_workers.weights.http_sync import HttpWeightClient
    from longtail_workers.weights.plan import sync_plan

    plan = sync_plan(spec, args.weight_sync)
    if not args.weights_url:
        if plan.transport == "broadcast":
            raise ValueError(
                "--weight-sync broadcast needs --weights-url too: a new or restarted worker "
                "catches up over HTTP before it joins the next broadcast"
            )
        return None
    http = HttpWeightClient(args.weights_url, timeout_s=timeout_s, retries=5)
    if plan.transport == "http":
        return http
    from longtail_workers.weights.broadcast_source import BroadcastSource
    from longtail_workers.weights.membership import ADDR_ENV

    addr = args.weight_sync_addr or os.environ.get(ADDR_ENV, "")
    if not addr:
        raise ValueError(
            f"--weight-sync broadcast needs the trainer's rendezvous: --weight-sync-addr "
            f"HOST:PORT (the trainer's --weight-sync-port) or {ADDR_ENV}"
        )
    config = plan.broadcast
    return BroadcastSource(
        addr, args.name, http, device=config.device, timeout_s=config.phase_timeout_s
    )


class _Server(Protocol):
    @property
    def url(self) -> str: ...

    def start(self) -> Any: ...

    def stop(self, grace_s: float = 5.0) -> None: ...


class ServiceRuntime:
    """Start ``server``, print ``prefix + url``, wait for SIGTERM/SIGINT or ``stop``, stop it."""

    def __init__(self, server: _Server, prefix: str, stop: threading.Event | None = None) -> None:
        self.server, self.prefix = server, prefix
        self.stop = stop or threading.Event()

    def serve_forever(self, on_stop: Any = None) -> int:
        restore = install_stop_signals(self.stop)  # before the URL is announced: see signals.py
        try:
            try:
                self.server.start()
            except OSError as exc:
                print(f"error: cannot listen: {exc} (pick another --port, or 0)", file=sys.stderr)
                return 1
            print(f"{self.prefix}{self.server.url}", flush=True)
            try:
                self.stop.wait()
            finally:
                if on_stop is not None:
                    on_stop()
                self.server.stop(grace_s=2.0)
        finally:
            restore()
        return 0


def add_weight_sync_args(ap: argparse.ArgumentParser) -> None:
    """``--weight-sync`` and the broadcast rendezvous flags (trainer and rollout workers)."""
    ap.add_argument(
        "--weight-sync",
        choices=TRANSPORTS,
        default=None,
        help="how policy versions travel (default: the job's spec.weightSync, resolved)",
    )
    ap.add_argument(
        "--weight-sync-port",
        type=int,
        default=None,
        help="trainer: the broadcast rendezvous port (default $LONGTAIL_WEIGHT_SYNC_PORT, else "
        "29600; 0 picks a free one)",
    )
    ap.add_argument(
        "--weight-sync-addr",
        default=None,
        metavar="HOST:PORT",
        help="rollout worker: the trainer's broadcast rendezvous (default "
        "$LONGTAIL_WEIGHT_SYNC_ADDR)",
    )


@dataclass(frozen=True)
class ServiceStart:
    """What a worker process's common prelude (:func:`start_service`) hands its ``main``."""

    args: argparse.Namespace
    """The parsed command line (with ``--job``, ``--name``, ``--log-level`` and the auth flags)."""
    token: str | None
    """The job's token its write endpoints require (None: ``--insecure-no-auth``)."""
    spec: RLJobSpec
    """The job's spec, loaded from ``--job``."""


def worker_parser(prog: str, description: str, name: str) -> argparse.ArgumentParser:
    """The arguments the rollout and drafter workers share: ``--job``, ``--name`` (default
    ``name``), ``--host``, ``--port``, ``--log-level`` and the auth flags (what
    :func:`start_service` reads); the caller adds its own."""
    from longtail_workers.auth import add_auth_args

    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--job", required=True, help="RLJob YAML file (the job's spec)")
    ap.add_argument("--name", default=name, help="worker name (default %(default)s)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8200, help="0 picks a free port")
    ap.add_argument("--log-level", default="INFO")
    add_auth_args(ap)
    return ap


def start_service(ap: argparse.ArgumentParser, argv: list[str], role: str) -> ServiceStart | None:
    """The prelude of ``rollout/service.py`` and ``drafter_worker/service.py``: parse ``argv``,
    log lines prefixed with the worker's ``--name``, the job token ``role`` serves with, the job
    spec. None when there is no token (the error, naming the fix, is printed: exit 2)."""
    from longtail_workers.auth import AuthConfigError, server_token
    from longtail_workers.jobspec import load_job_spec

    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level, format=f"%(asctime)s {args.name} %(message)s")
    try:
        token = server_token(role, args.insecure_no_auth)
    except AuthConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    return ServiceStart(args, token, load_job_spec(args.job))
