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
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from longtail_api.reader import Reader


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
_NO_FIELDS: dict[str, Callable[[], RankCommand]] = {c.op: c for c in (Stream, Gather, Stop, Abort)}
OPS = ("train", "save", "load", *_NO_FIELDS)
"""Every command's ``op``."""


def encode(command: RankCommand) -> str:
    """The command as the JSON a follower's :func:`decode` reads."""
    return json.dumps({"op": command.op, **dataclasses.asdict(command)})


def decode(text: str) -> RankCommand:
    """The command in ``text``; :class:`~longtail_api.protocol.ProtocolError` (a ValueError)
    names the field when it is malformed (rank 0 of another version?)."""
    r = Reader(json.loads(text), "command")
    op = r.choice("op", OPS)
    if op == "train":
        return Train(r.int_("step"))
    if op == "save":
        return Save(r.str_("root"), r.int_("step"), r.str_("tmp"), r.opt_str("sha"))
    if op == "load":
        return Load(r.str_("path"))
    return _NO_FIELDS[op]()
