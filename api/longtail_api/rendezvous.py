"""The trainer group's rendezvous: the environment every trainer pod (or local process) gets.

The trainer world is ``trainer.replicas`` pods x ``local_world_size`` processes per pod (one per
GPU, or one on CPU). The operator (``longtail_operator``) writes :meth:`TrainerRendezvous.to_env`
into every trainer pod, and ``longtail run`` into every local trainer process; the trainer
entrypoint (``longtail_workers.trainer``) reads it back with :meth:`TrainerRendezvous.from_env`
and starts ``local_world_size`` ranks, each with ``RANK = node_rank * local_world_size +
local_rank``, as torchrun does. The names are torchrun's and Kubeflow PyTorchJob's, so a user's
own tooling reads them as it would there. Rank 0 (pod 0, local rank 0) drives the RL loop and
serves the trainer's HTTP port; the other ranks follow it.

Pure module: standard library and ``longtail_api`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from longtail_api.protocol import ProtocolError

MASTER_ADDR, MASTER_PORT = "MASTER_ADDR", "MASTER_PORT"
NNODES, NODE_RANK, LOCAL_WORLD_SIZE = "NNODES", "NODE_RANK", "LOCAL_WORLD_SIZE"
WORLD_SIZE = "WORLD_SIZE"
RANK, LOCAL_RANK = "RANK", "LOCAL_RANK"  # per process, set by the entrypoint for each rank
DEFAULT_PORT = 29500  # torchrun's default
WEIGHT_SYNC_PORT = 29600
"""Default port of the trainer's weight-sync store (``--weight-sync-port``): rank 0 hosts the
``broadcast`` transport's rendezvous there (``spec.weightSync``), next to the group's 29500."""
_NAMES = (MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK, LOCAL_WORLD_SIZE, WORLD_SIZE)


@dataclass(frozen=True)
class TrainerRendezvous:
    """Where the trainer ranks meet and which of them this pod (or process) holds."""

    master_addr: str
    """Host of rank 0: pod 0's stable DNS name behind the headless Service, or 127.0.0.1."""
    master_port: int = DEFAULT_PORT
    """TCP port of the rendezvous store on rank 0."""
    nnodes: int = 1
    """Trainer pods (``trainer.replicas``)."""
    node_rank: int = 0
    """This pod's index in the group, 0-based (pod 0 holds rank 0)."""
    local_world_size: int = 1
    """Ranks per pod: one per GPU (``trainer.resources.gpus``), one on CPU."""

    def __post_init__(self) -> None:
        if not self.master_addr:
            raise ProtocolError(MASTER_ADDR, "must not be empty", fix="the host of rank 0")
        if not 0 < self.master_port < 65536:
            raise ProtocolError(MASTER_PORT, "must be a TCP port (1-65535)", self.master_port)
        if self.nnodes < 1 or self.local_world_size < 1:
            raise ProtocolError(
                f"{NNODES}, {LOCAL_WORLD_SIZE}",
                "must both be >= 1",
                f"{self.nnodes}, {self.local_world_size}",
            )
        if not 0 <= self.node_rank < self.nnodes:
            raise ProtocolError(
                NODE_RANK, f"must be in [0, {NNODES}={self.nnodes})", self.node_rank
            )

    @property
    def world_size(self) -> int:
        """All trainer ranks of the job."""
        return self.nnodes * self.local_world_size

    def rank(self, local_rank: int) -> int:
        """Global rank of this pod's ``local_rank``."""
        if not 0 <= local_rank < self.local_world_size:
            raise ProtocolError(
                LOCAL_RANK,
                f"must be in [0, {LOCAL_WORLD_SIZE}={self.local_world_size})",
                local_rank,
            )
        return self.node_rank * self.local_world_size + local_rank

    @property
    def init_method(self) -> str:
        """``torch.distributed.init_process_group`` init method of this group."""
        return f"tcp://{self.master_addr}:{self.master_port}"

    def to_env(self) -> dict[str, str]:
        """The pod's (or local process's) environment variables."""
        return {
            MASTER_ADDR: self.master_addr,
            MASTER_PORT: str(self.master_port),
            NNODES: str(self.nnodes),
            NODE_RANK: str(self.node_rank),
            LOCAL_WORLD_SIZE: str(self.local_world_size),
            WORLD_SIZE: str(self.world_size),
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> TrainerRendezvous | None:
        """The rendezvous in ``environ``; None when none of its variables is set (a lone
        trainer, world 1). A partial or inconsistent set raises :class:`ProtocolError`."""
        present = [n for n in _NAMES if environ.get(n, "").strip()]
        if not present:
            return None
        missing = [n for n in (MASTER_ADDR, NNODES, NODE_RANK) if n not in present]
        if missing:
            raise ProtocolError(
                "trainer rendezvous",
                f"{', '.join(present)} set but {', '.join(missing)} missing",
                fix="set all of MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK, LOCAL_WORLD_SIZE "
                "(the operator and `longtail run` do) or none for a single trainer",
            )
        value = cls(
            master_addr=environ[MASTER_ADDR].strip(),
            master_port=_int(environ, MASTER_PORT, DEFAULT_PORT),
            nnodes=_int(environ, NNODES, 1),
            node_rank=_int(environ, NODE_RANK, 0),
            local_world_size=_int(environ, LOCAL_WORLD_SIZE, 1),
        )
        if WORLD_SIZE in present and _int(environ, WORLD_SIZE, 0) != value.world_size:
            raise ProtocolError(
                WORLD_SIZE,
                f"must equal {NNODES} x {LOCAL_WORLD_SIZE} = {value.world_size}",
                environ[WORLD_SIZE],
                f"drop {WORLD_SIZE} or make them agree",
            )
        return value


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ProtocolError(name, "must be an integer", raw) from None
