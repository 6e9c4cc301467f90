"""Trainer checkpoints: policy weights, optimizer state and the step, written atomically.

The step driver saves every ``checkpoint.everySteps`` steps, at the end and on a stop request
(Ctrl-C in local mode, ``POST /v1/checkpoint`` or SIGTERM in a pod), through
``trainer/policy.py``, which calls :func:`save_checkpoint` on every trainer rank at once (a
collective); ``--resume`` (``longtail run --resume``, a restarted pod) finds the newest one with
:func:`latest_checkpoint` and every rank calls :func:`load_checkpoint`. Layout::

    <root>/step-000010/dcp/            Distributed Checkpoint (torch.distributed.checkpoint):
                                       model and AdamW state, one shard file per rank
                       state.json      step, versions, checksum, world size; written last
    <root>/.tmp-<uuid>/                a checkpoint being written

DCP stores every tensor with its global shape, so a checkpoint written by N ranks loads at any
world size, world 1 included (it reshards on load). ``model_sha256`` is the checksum of the whole
policy state dict (``weights/checksum.py``, the published version's); a load gathers the loaded
weights and refuses a mismatch. Every rank writes its shards into the same temporary directory
(a filesystem all trainer pods share); DCP fsyncs them, and rank 0 then writes ``state.json``,
fsyncs and renames the directory into place; only directories whose ``state.json`` parses count.
A crash mid-write therefore leaves the last good checkpoint untouched, and the next save or load
ignores the debris. Older checkpoints beyond ``keep_last`` are deleted only after the new one is
in place. A write that fails (a full disk, a quota, an I/O error) raises
:class:`CheckpointWriteError`, an ``OSError`` carrying the OS errno, naming the checkpoint's
directory, the OS reason (``No space left on device``), its tensors' size and the free space,
the last complete checkpoint (intact) and the fix; every rank raises it (DCP shares each rank's
failure).
Checkpoints of earlier versions (``model.safetensors`` + ``optimizer.pt``) still load
at world 1.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from longtail_workers.trainer.diskspace import first_line, free_bytes, mib, os_error_in, state_bytes
from longtail_workers.trainer.sharding import full_state_dict, load_sharded_state, sharded_state
from longtail_workers.trainer.world import TrainerWorld
from longtail_workers.weights.checksum import state_dict_checksum

log = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"^step-(\d{6,})$")
DCP_DIR, STATE_FILE = "dcp", "state.json"
MODEL_FILE, OPTIMIZER_FILE = "model.safetensors", "optimizer.pt"  # earlier versions' layout


@dataclass(frozen=True)
class CheckpointState:
    """``state.json``: what the checkpoint is."""

    step: int
    """RL steps completed when it was written; a resumed run continues at ``step + 1``."""
    policy_version: int
    drafter_version: int
    model_sha256: str
    """sha256 of the whole policy state dict's canonical bytes (``weights/checksum.py``)."""
    created_unix: float
    extra: dict[str, Any]
    world_size: int = 1
    """Trainer ranks that wrote it (any world size can load it)."""


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read (message names the directory and what is wrong)."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; ``errno`` is the OS's (``ENOSPC`` for a full disk) and
    the message names the directory, the reason, the space figures and the fix."""


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    root: str | Path,
    *,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    policy_version: int,
    drafter_version: int,
    keep_last: int,
    extra: dict[str, Any] | None = None,
    world: TrainerWorld | None = None,
    tmp_name: str | None = None,
    model_sha256: str | None = None,
) -> Path:
    """Write the checkpoint of ``step`` atomically; returns its directory.

    At world > 1 every rank calls it with the same ``tmp_name`` (rank 0 chooses it) and the same
    ``model_sha256``; only rank 0's ``policy_version``, ``drafter_version``, ``keep_last`` and
    ``extra`` are used. ``model_sha256`` (the published version's checksum) saves gathering the
    whole state dict again; None computes it.
    """
    world = world or TrainerWorld()
    root = Path(root)
    final = root / f"step-{step:06d}"
    tmp = root / (tmp_name or f".tmp-{uuid.uuid4().hex}")
    try:
        if model_sha256 is None:
            full = full_state_dict(model, world)  # a collective when sharded
            model_sha256 = "" if full is None else state_dict_checksum(full)
        state = sharded_state(model, optimizer)
        with _write_errors(step, root, final, state_bytes(state)):
            tmp.mkdir(parents=True, exist_ok=True)
            with _quiet_single_process():
                dcp_save(state, checkpoint_id=tmp / DCP_DIR, no_dist=not world.sharded)
            if not world.leader:
                return final  # rank 0 finishes (dcp.save returned there after every shard)
            meta = CheckpointState(
                step, policy_version, drafter_version, model_sha256, time.time(), extra or {},
                world.size,
            )  # fmt: skip
            _commit(tmp, final, meta)
    finally:
        if world.leader and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _prune(root, keep_last)
    log.info("checkpoint of step %d written to %s (%d rank(s))", step, final, world.size)
    return final


def _commit(tmp: Path, final: Path, meta: CheckpointState) -> None:
    """Rank 0: write ``state.json``, fsync everything, rename ``tmp`` to ``final``."""
    (tmp / STATE_FILE).write_text(json.dumps(asdict(meta), indent=2) + "\n")
    _fsync(tmp / STATE_FILE)
    _fsync(tmp / DCP_DIR)
    _fsync(tmp)
    if final.exists():  # the same step saved again (stop right after a periodic save)
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync(final.parent)


@contextmanager
def _write_errors(step: int, root: Path, final: Path, needed: int) -> Iterator[None]:
    """Turn a failed write into :class:`CheckpointWriteError` (read the free space before the
    caller deletes the partial write). A failure that is not the filesystem's (a rank's
    collective) passes through; DCP's ``CheckpointException``, a ``BaseException``, becomes a
    :class:`CheckpointError`."""
    try:
        yield
    except (OSError, RuntimeError, CheckpointException) as exc:
        cause, free = os_error_in(exc), free_bytes(root)
        # A lost peer (ConnectionError is an OSError) fails the group, not the disk.
        code = None if cause is None or isinstance(cause, ConnectionError) else cause.errno
        if code is None and free is not None and free < needed:
            code = errno.ENOSPC  # torch kept only "unexpected pos" but the disk is full
        if code is None:
            if isinstance(exc, CheckpointException):
                raise CheckpointError(
                    f"the checkpoint of step {step} could not be written to {final}: "
                    f"{first_line(exc)}"
                ) from exc
            raise
        raise _write_error(step, root, final, code, cause, exc, needed, free) from exc


def _write_error(
    step: int, root: Path, final: Path, code: int, cause: OSError | None, exc: BaseException,
    needed: int, free: int | None,
) -> CheckpointWriteError:  # fmt: skip
    reason = f"{os.strerror(code)} (errno {code}, {errno.errorcode.get(code, '?')})"
    if cause is None:
        reason += f"; torch reported {first_line(exc)}"
    elif cause.filename:
        reason += f" writing {cause.filename}"
    latest = latest_checkpoint(root)
    kept = f"the last complete checkpoint, {latest}, is intact" if latest else (
        "there is no earlier checkpoint"
    )  # fmt: skip
    err = CheckpointWriteError(
        f"the checkpoint of step {step} could not be written to {final}: {reason}; its tensors "
        f"take {mib(needed)}, {mib(free)} is free there; {kept}. Free space in {root} or move "
        "it to a larger disk and point spec.checkpoint.location there, then resume "
        "(`longtail run --resume RUN_DIR`; a trainer pod resumes when it restarts)"
    )
    err.errno = code  # not filename: OSError.__str__ would then print "[Errno N] None: PATH"
    return err


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as ``(step, dir)``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = _STEP_DIR.match(d.name)
        has_weights = (d / DCP_DIR / ".metadata").is_file() or (d / MODEL_FILE).is_file()
        if m and (d / STATE_FILE).is_file() and has_weights:
            found.append((int(m.group(1)), d))
    return sorted(found)


def latest_checkpoint(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def read_state(directory: str | Path) -> CheckpointState:
    path = Path(directory) / STATE_FILE
    try:
        return CheckpointState(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint state ({exc})") from exc


def load_checkpoint(
    directory: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    world: TrainerWorld | None = None,
) -> CheckpointState:
    """Load weights (checksum-verified) and optimizer state into ``model``/``optimizer``.

    At world > 1 every rank calls it (a collective); each keeps its own shards.
    """
    world = world or TrainerWorld()
    directory = Path(directory)
    state = read_state(directory)
    if (directory / DCP_DIR / ".metadata").is_file():
        target = sharded_state(model, optimizer)
        with _quiet_single_process():
            dcp_load(target, checkpoint_id=directory / DCP_DIR, no_dist=not world.sharded)
        load_sharded_state(model, optimizer, target)
    elif (directory / MODEL_FILE).is_file():
        _load_single_file(directory, model, optimizer, world)
    else:
        raise CheckpointError(
            f"{directory}: no weights ({DCP_DIR}/.metadata or {MODEL_FILE}); the checkpoint is "
            "incomplete: resume from an older one (delete this one)"
        )
    full = full_state_dict(model, world)  # a collective when sharded; rank 0 checks it
    actual = None if full is None else state_dict_checksum(full)
    if actual is not None and actual != state.model_sha256:
        raise CheckpointError(
            f"{directory}: loaded weights hash to sha256 {actual}, not {state.model_sha256} "
            f"recorded in {STATE_FILE}; the checkpoint is corrupt: resume from an older one "
            "(delete this one)"
        )
    return state


def _load_single_file(
    directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None, world: TrainerWorld
) -> None:
    """An earlier version's checkpoint: one safetensors file and ``optimizer.pt``."""
    if world.sharded:
        raise CheckpointError(
            f"{directory} was written by an earlier longtail as one {MODEL_FILE}; it loads at "
            f"world 1 only: resume it with trainer.replicas 1 for a step, then at {world.size}"
        )
    model.load_state_dict(load_file(str(directory / MODEL_FILE)), strict=True)
    opt_path = directory / OPTIMIZER_FILE
    if optimizer is not None and opt_path.is_file():
        optimizer.load_state_dict(torch.load(opt_path, weights_only=True))


@contextmanager
def _quiet_single_process() -> Iterator[None]:
    """DCP warns that it assumes one process whenever no group is initialised; at world 1 that
    is exactly the intent (``no_dist``), so the warning would only be noise in every run."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _prune(root: Path, keep_last: int) -> None:
    found = list_checkpoints(root)
    for _, d in found[: max(0, len(found) - keep_last)]:
        shutil.rmtree(d, ignore_errors=True)
    for d in root.glob(".tmp-*"):  # debris of a crashed writer
        shutil.rmtree(d, ignore_errors=True)
