"""Trainer ranks in one pod (or process): start them, and the follower ranks' main.

``trainer/service.py`` (``longtail worker trainer``) reads the
:class:`~longtail_api.rendezvous.TrainerRendezvous` from the environment. When a pod holds
several ranks (``LOCAL_WORLD_SIZE`` > 1: one per GPU), :func:`launch_local_ranks` turns the
entrypoint into a small supervisor, as torchrun does: it starts the same command once per local
rank with ``LOCAL_RANK`` and ``RANK`` set, forwards SIGTERM/SIGINT to them, and exits with the
first failure (stopping the rest after a grace period). Each rank process then runs either rank
0's service (the RL loop, HTTP) or :func:`run_follower`: join the group, load and shard the
policy, and follow rank 0's commands (``trainer/group.py``) until it says stop.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

from longtail_api.rendezvous import LOCAL_RANK, RANK, TrainerRendezvous
from longtail_workers.jobspec import load_job_spec
from longtail_workers.parentwatch import ENV as PARENT_PID_ENV
from longtail_workers.runtime import role_device, torch_threads
from longtail_workers.signals import install_stop_signals
from longtail_workers.trainer.group import CommandChannel, follow
from longtail_workers.trainer.policy import build_policy
from longtail_workers.trainer.world import TrainerRankError, join_world

log = logging.getLogger(__name__)

FAILURE_GRACE_S = 60.0
"""After one local rank failed, how long the others get to notice and exit by themselves
(a failed collective, or rank 0's store gone) before they are killed."""


def local_rank_of(environ: Mapping[str, str]) -> int | None:
    """``LOCAL_RANK`` when this process is one of the pod's ranks, else None (the entrypoint)."""
    raw = environ.get(LOCAL_RANK, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(
            f"{LOCAL_RANK}={raw!r}: must be an integer (set by the entrypoint)"
        ) from None


def launch_local_ranks(rendezvous: TrainerRendezvous, argv: list[str]) -> int:
    """Run ``longtail worker trainer ARGV`` once per local rank; returns the pod's exit code."""
    procs = []
    for local in range(rendezvous.local_world_size):
        env = dict(os.environ, **rendezvous.to_env())
        env.update({LOCAL_RANK: str(local), RANK: str(rendezvous.rank(local))})
        env[PARENT_PID_ENV] = str(os.getpid())  # each rank stops if this supervisor dies
        cmd = [sys.executable, "-m", "longtail_cli.main", "worker", "trainer", *argv]
        procs.append(subprocess.Popen(cmd, env=env))  # output inherited: rank 0 prints the URL
    stop = threading.Event()
    restore = install_stop_signals(stop)
    forwarded, failed_at, code = False, None, 0
    try:
        while any(p.poll() is None for p in procs):
            if stop.is_set() and not forwarded:
                for p in procs:  # rank 0 checkpoints, then tells the followers to stop
                    p.send_signal(signal.SIGTERM)
                forwarded = True
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed and failed_at is None:
                code, failed_at = failed[0], time.monotonic()
                log.error("a trainer rank exited with %d; waiting for the others", code)
            if failed_at is not None and time.monotonic() - failed_at > FAILURE_GRACE_S:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.2)
    finally:
        restore()
    codes = [p.wait() for p in procs]
    return code or next((c for c in codes if c != 0), 0)


def run_follower(args: argparse.Namespace, rendezvous: TrainerRendezvous, local_rank: int) -> int:
    """A follower rank (global rank > 0): exit 0 when rank 0 says stop, else 1."""
    spec = load_job_spec(args.job)
    torch_threads(args.threads, spec.trainer.resources)
    stop = threading.Event()  # SIGTERM: rank 0 decides when to stop (it needs us to checkpoint)
    restore = install_stop_signals(stop)
    world = None
    try:
        device = role_device(spec.trainer.resources)
        world = join_world(rendezvous, local_rank, device, timeout_s=args.collective_timeout)
        policy, _ = build_policy(spec, world)
        log.info("rank %d of %d ready; following rank 0", world.rank, world.size)
        return follow(policy, CommandChannel(world))
    except (TrainerRankError, RuntimeError, OSError, ValueError) as exc:
        rank = rendezvous.rank(local_rank)
        print(
            f"error: trainer rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True
        )
        return 1
    finally:
        restore()
        if world is not None:
            world.close()
