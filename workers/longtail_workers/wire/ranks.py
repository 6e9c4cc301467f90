"""Rank 0's commands to the follower trainer ranks: one typed class per operation.

Rank 0's :class:`~longtail_workers.trainer.group.PolicyLeader` announces each collective
operation with one of these; :class:`~longtail_workers.trainer.group.CommandChannel` carries it
through the rendezvous store as :func:`encode`'s JSON (``{"op": ..., **fields}``) and
:func:`~longtail_workers.trainer.group.follow` runs what :func:`decode` gives back. These two
functions are the only places that spell the JSON.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import ClassVar

from longtail_api.protocol import ProtocolError
from longtail_api.wirecodec import from_wire


@dataclass(frozen=True)
class Train:
    """Train on the step's batch, which rank 0 broadcasts right after the command."""

    op: ClassVar[str] = "train"
    step: int
    """The RL step the batch belongs to."""


@dataclass(frozen=True)
class Stream:
    """Take part in one gather pass of a weight sync (rank 0 publishes the tensors)."""

    op: ClassVar[str] = "stream"


@dataclass(frozen=True)
class Gather:
    """Take part in gathering the whole state dict (rank 0 keeps it)."""

    op: ClassVar[str] = "gather"


@dataclass(frozen=True)
class Save:
    """Write this rank's part of a checkpoint."""

    op: ClassVar[str] = "save"
    root: str
    """The checkpoint root directory."""
    step: int
    """The RL step the checkpoint is of."""
    tmp: str
    """Name of the temporary directory every rank writes into (rank 0 picks it)."""
    sha: str | None
    """sha256 of the policy's model files, as rank 0 records it (None: not computed)."""


@dataclass(frozen=True)
class Load:
    """Load this rank's part of the checkpoint in ``path``."""

    op: ClassVar[str] = "load"
    path: str
    """The checkpoint's directory."""


@dataclass(frozen=True)
class Stop:
    """Rank 0 finished: exit 0."""

    op: ClassVar[str] = "stop"


@dataclass(frozen=True)
class Abort:
    """Rank 0 failed: exit 1."""

    op: ClassVar[str] = "abort"


RankCommand = Train | Stream | Gather | Save | Load | Stop | Abort
_BY_OP: dict[str, type[RankCommand]] = {
    c.op: c for c in (Train, Stream, Gather, Save, Load, Stop, Abort)
}
OPS = tuple(_BY_OP)
"""Every command's ``op``."""


def encode(command: RankCommand) -> str:
    """The command as the JSON a follower's :func:`decode` reads."""
    return json.dumps({"op": command.op, **dataclasses.asdict(command)})


def decode(text: str) -> RankCommand:
    """The command in ``text``; :class:`~longtail_api.protocol.ProtocolError` (a ValueError)
    names the field when it is malformed (rank 0 of another version?)."""
    data = json.loads(text)
    op = data.get("op") if isinstance(data, dict) else None
    if op not in _BY_OP:
        raise ProtocolError("command.op", f"must be one of {', '.join(map(repr, OPS))}", op)
    return from_wire(_BY_OP[op], data, "command")
