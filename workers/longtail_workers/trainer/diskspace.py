"""Why a checkpoint write failed, in the operating system's words, and how much space there is.

Used by ``trainer/checkpoint.py`` when a save fails. torch hides the cause: a full disk surfaces
as ``unexpected pos 704 vs 598`` from its zip writer (a ``RuntimeError`` whose ``__context__``
is the ``OSError``), and Distributed Checkpoint wraps every rank's failure in a
``CheckpointException`` (a ``BaseException``). :func:`os_error_in` digs the ``OSError`` out;
:func:`free_bytes` and :func:`state_bytes` give the figures the error message shows.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch.distributed.checkpoint.api import CheckpointException


def os_error_in(exc: BaseException) -> OSError | None:
    """The first ``OSError`` in ``exc``, its causes and contexts, and the per-rank failures of a
    DCP ``CheckpointException``; None when there is none (breadth first, each error once)."""
    todo: list[BaseException] = [exc]
    seen: set[int] = set()
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError):
            return e
        if isinstance(e, CheckpointException):
            todo += [failure for failure, _ in e.failures.values()]
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
    return None


def first_line(exc: BaseException) -> str:
    """``Type: message`` on one line; a ``CheckpointException`` shows its first rank's error."""
    if isinstance(exc, CheckpointException) and exc.failures:
        rank, (failure, _) = next(iter(exc.failures.items()))
        return f"rank {rank}: {first_line(failure)}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on ``path``'s filesystem (the nearest existing
    parent's); None when it cannot be read."""
    for p in (path, *path.parents):
        if p.exists():
            try:
                st = os.statvfs(p)
            except OSError:
                return None
            return st.f_bavail * st.f_frsize
    return None


def state_bytes(state: object) -> int:
    """Bytes of the tensors in a (nested) state dict: about what a checkpoint of it needs."""
    if isinstance(state, torch.Tensor):
        local = state.to_local() if hasattr(state, "to_local") else state  # a DTensor's shard
        return int(local.numel() * local.element_size())
    if isinstance(state, Mapping):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, Sequence) and not isinstance(state, str | bytes):
        return sum(state_bytes(v) for v in state)
    return 0


def mib(n: int | None) -> str:
    """``n`` bytes as ``1.5 MiB`` (``unknown`` for None)."""
    return "unknown" if n is None else f"{n / (1 << 20):.1f} MiB"
