"""The trainer's process group: which rank this process is, and how a lost rank is named.

``trainer/service.py`` calls :func:`join_world` once per trainer process with the
:class:`~longtail_api.rendezvous.TrainerRendezvous` of its environment (None: a lone trainer,
world 1, no process group at all, exactly as before sharding existed). For a world of ``N > 1``
ranks it opens the rendezvous store (a ``TCPStore`` hosted by rank 0), joins the default
process group on it (gloo on CPU, NCCL on GPU, with a timeout on every collective) and starts a
heartbeat thread. The step code (``trainer/policy.py``, ``trainer/group.py``) wraps each
collective phase in :meth:`TrainerWorld.collective`: when a collective fails (gloo notices a
dead peer's closed connection at once; a hung peer runs into the timeout), the heartbeats tell
which rank stopped, and :class:`TrainerRankError` names it instead of a bare transport error.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from longtail_api.rendezvous import TrainerRendezvous

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.5
"""How often every rank bumps its heartbeat counter in the store."""
DIAGNOSE_S = 3.0
"""How long a failed collective watches the heartbeats before naming the stopped ranks: several
beats, so a rank that is only slow is not named."""
BEAT_JOIN_S = 10.0
"""How long :meth:`TrainerWorld.close` waits for the heartbeat thread to leave its store call."""
_PREFIX = "longtail/"  # our store keys, apart from the process group's own


class TrainerRankError(RuntimeError):
    """A collective of the trainer group failed; the message names the rank(s) that stopped."""

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks


@dataclass
class TrainerWorld:
    """This process's place in the trainer group (world 1: no group, no store)."""

    rank: int = 0
    """Global rank; rank 0 drives the RL loop, the others follow it."""
    size: int = 1
    """Trainer ranks in the job: ``trainer.replicas`` x ranks per pod."""
    local_rank: int = 0
    """Rank within this pod (the GPU index on GPU)."""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    """Where this rank's shard of the policy lives."""
    store: Any = None
    """The rendezvous ``TCPStore`` (rank 0 hosts it); None at world 1."""
    _beat_stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _beat_thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def sharded(self) -> bool:
        """True when the policy is split over several ranks (FSDP2)."""
        return self.size > 1

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @contextlib.contextmanager
    def collective(self, what: str) -> Iterator[None]:
        """Run a collective phase; a failure becomes a :class:`TrainerRankError` naming the rank
        that stopped (``what`` says which phase, e.g. ``"the GRPO update of step 3"``)."""
        if not self.sharded:
            yield
            return
        try:
            yield
        except TrainerRankError:
            raise
        except (RuntimeError, ConnectionError) as exc:  # gloo/NCCL/store errors, DistError
            raise self.rank_error(what, exc) from exc

    def rank_error(self, what: str, exc: BaseException) -> TrainerRankError:
        """The error to raise for a failed collective: which ranks stopped, and the fix."""
        stopped = self.stopped_ranks()
        if stopped:
            named = ", ".join(str(r) for r in stopped)
            message = (
                f"trainer rank(s) {named} of {self.size} stopped during {what} (no heartbeat for "
                f"{DIAGNOSE_S:g}s); rank {self.rank} gave up: {exc}. See rank {named}'s log (pod "
                "or logs/trainer-N.log) for why; the job resumes from its last checkpoint"
            )
        else:
            message = (
                f"a collective of the trainer group failed during {what} on rank {self.rank} "
                f"of {self.size}, every rank still beating: {exc}"
            )
        return TrainerRankError(message, stopped)

    def stopped_ranks(self) -> list[int]:
        """Ranks whose heartbeat did not move for :data:`DIAGNOSE_S` (all others when the store
        itself is gone: rank 0 hosts it, so rank 0 stopped)."""
        try:
            first = self._beats()
            time.sleep(DIAGNOSE_S)
            second = self._beats()
        except (RuntimeError, ConnectionError, OSError):
            return [0] if self.rank != 0 else []
        return [r for r in range(self.size) if r != self.rank and first[r] == second[r]]

    def _beats(self) -> list[int]:
        assert self.store is not None
        return [int(self.store.add(f"{_PREFIX}beat/{r}", 0)) for r in range(self.size)]

    def _beat(self) -> None:
        assert self.store is not None
        key = f"{_PREFIX}beat/{self.rank}"
        while not self._beat_stop.wait(HEARTBEAT_S):
            try:
                self.store.add(key, 1)
            except (RuntimeError, ConnectionError, OSError):
                return  # the store (rank 0) is gone: the next collective or command says so

    def close(self) -> None:
        """Stop the heartbeat and leave the process group (idempotent).

        The heartbeat thread is joined, not left to die with the process: a daemon thread still
        inside a store call when the interpreter exits is ended by ``pthread_exit`` unwinding
        through C++ frames, and the process aborts ("terminate called without an active
        exception", exit -6) after its work is done."""
        self._beat_stop.set()
        beat = self._beat_thread
        if beat is not None and beat is not threading.current_thread():
            beat.join(timeout=BEAT_JOIN_S)
            if beat.is_alive():
                log.warning("trainer rank %d: heartbeat still in a store call after %gs",
                            self.rank, BEAT_JOIN_S)  # fmt: skip
        if self.sharded and dist.is_initialized():
            dist.destroy_process_group()


def join_world(
    rendezvous: TrainerRendezvous | None,
    local_rank: int,
    device_type: str,
    timeout_s: float,
) -> TrainerWorld:
    """This process's :class:`TrainerWorld`; for more than one rank, join the group.

    ``device_type`` is ``cuda`` (one GPU per local rank, NCCL) or ``cpu`` (gloo). Every
    collective, and the wait for all ranks to arrive, is bounded by ``timeout_s``.
    """
    device = torch.device(device_type, local_rank) if device_type == "cuda" else torch.device("cpu")
    if rendezvous is None or rendezvous.world_size == 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return TrainerWorld(device=device)
    rank, size = rendezvous.rank(local_rank), rendezvous.world_size
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=timeout_s)
    try:
        store = dist.TCPStore(  # type: ignore[attr-defined]
            rendezvous.master_addr,
            rendezvous.master_port,
            size,
            is_master=rank == 0,
            timeout=timeout,
        )
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout)
    except (RuntimeError, ConnectionError) as exc:
        raise TrainerRankError(
            f"trainer rank {rank} of {size} could not join the group at "
            f"{rendezvous.init_method} within {timeout_s:g}s: {exc}. Are all "
            f"{rendezvous.nnodes} trainer pod(s) running, and is MASTER_ADDR reachable?",
            [],
        ) from exc
    world = TrainerWorld(rank=rank, size=size, local_rank=local_rank, device=device, store=store)
    world._beat_thread = threading.Thread(target=world._beat, name="trainer-heartbeat", daemon=True)
    world._beat_thread.start()
    log.info("trainer rank %d of %d joined (%s on %s)", rank, size, backend, device)
    return world
