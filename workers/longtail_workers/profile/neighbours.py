"""Neighbour engines for ``longtail profile --concurrent N``: the same steps, run alongside.

Called by :mod:`longtail_workers.profile.main` around the whole-step measurement
(``engine_steps.py``). Rollout workers that share one machine (several CPU workers on one
socket, as ``longtail run`` starts them) slow each other down through the shared caches and
memory bandwidth, so a step measured alone is faster than the same step in a rollout. With
``--concurrent N`` the profile starts ``N - 1`` neighbour processes that load the same model
with the same threads and run the same engine steps over and over while this process measures;
on a GPU each rollout worker has its own device and the default (1: no neighbours) is right.
The neighbours are load generators only: they are told to stop as soon as the measurement
ends (between two points, so they exit cleanly) and terminated if they do not, and every wait on
them is bounded.
"""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass
from multiprocessing.connection import Connection
from types import TracebackType

import torch

from longtail_workers.models.loading import resolve_device
from longtail_workers.profile.engine_steps import engine_curves
from longtail_workers.profile.forwards import StepGrid
from longtail_workers.profile.models import load_target, make_drafter

READY_TIMEOUT_S = 300.0
"""Longest wait for a neighbour to load its model (a large model on a slow disk)."""
STOP_TIMEOUT_S = 60.0
"""Longest wait for a neighbour to finish its point and exit once told to stop."""


@dataclass(frozen=True)
class NeighbourSpec:
    """What a neighbour loads and runs (picklable: it crosses into a spawned process)."""

    model: str | None
    """``--model`` of the profile."""
    shape: str | None
    """``--shape`` of the profile."""
    device: str
    """Device the measurement runs on."""
    dtype: str
    """``--dtype`` of the profile."""
    seed: int
    """``--seed`` of the profile (a neighbour adds its index)."""
    threads: int | None
    """Torch threads, as the measuring process has them."""
    grid: StepGrid
    """The grid the measuring process steps through."""
    steps: int
    """Engine steps per point."""
    accepted_drafts: int = 0
    """Drafts a timed speculative step keeps (``engine_steps.forced_acceptance``)."""


def _run(spec: NeighbourSpec, index: int, ready: Connection, stop: Connection) -> None:
    """A neighbour's life: load, signal ready, run the grid until told to stop."""
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    device = resolve_device(spec.device)
    policy, name = load_target(spec.model, spec.shape, device, spec.dtype, spec.seed + index)
    drafter = make_drafter(policy, name, spec.seed + index)
    gen = torch.Generator().manual_seed(spec.seed + index)
    ready.send("ready")  # a pipe, not an Event: a terminated child leaks no semaphore
    while not stop.poll():
        engine_curves(policy, drafter, spec.grid, spec.steps, gen, lambda _line: None,
                      should_stop=stop.poll, accepted_drafts=spec.accepted_drafts)  # fmt: skip


class Neighbours:
    """``with Neighbours(spec, count): ...`` runs ``count`` neighbours for the block's length."""

    def __init__(self, spec: NeighbourSpec, count: int) -> None:
        if count < 0:
            raise ValueError(f"--concurrent: {count + 1} engines; must be >= 1")
        self.spec = spec
        self.count = count
        self._procs: list[mp.process.BaseProcess] = []
        self._stops: list[Connection] = []

    def __enter__(self) -> Neighbours:
        ctx = mp.get_context("spawn")  # a fresh interpreter: no forked torch thread pools
        pipes = []
        for i in range(1, self.count + 1):
            receive, send = ctx.Pipe(duplex=False)
            stop_receive, stop_send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_run, args=(self.spec, i, send, stop_receive),
                               daemon=True, name=f"profile-neighbour-{i}")  # fmt: skip
            proc.start()
            self._procs.append(proc)
            self._stops.append(stop_send)
            pipes.append(receive)
        for i, ready in enumerate(pipes, 1):
            if not ready.poll(READY_TIMEOUT_S):
                self.__exit__(None, None, None)
                raise RuntimeError(
                    f"profile neighbour {i} did not load the model within {READY_TIMEOUT_S:.0f} "
                    "s; run with --concurrent 1 or check the model path"
                )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for stop in self._stops:
            stop.send("stop")
        for proc in self._procs:
            proc.join(STOP_TIMEOUT_S)
            if proc.is_alive():  # still loading, or stuck: it holds nothing worth keeping
                proc.kill()
                proc.join(STOP_TIMEOUT_S)
        self._procs.clear()
        self._stops.clear()
