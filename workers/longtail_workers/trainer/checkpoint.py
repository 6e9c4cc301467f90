"""Trainer checkpoints: policy weights, optimizer state and the step, written atomically.

The step driver calls :func:`save_checkpoint` every ``checkpoint.everySteps`` steps, at the end
and on a stop request (Ctrl-C in local mode, ``POST /v1/checkpoint`` or SIGTERM in a pod), and
:func:`latest_checkpoint` / :func:`load_checkpoint` when it starts with ``--resume``. Layout::

    <root>/step-000010/model.safetensors   policy state dict (canonical, checksummed)
                       optimizer.pt        AdamW state (torch.save)
                       state.json          step, versions, checksum, time; written last
    <root>/.tmp-<uuid>/                    a checkpoint being written

A checkpoint is written into a temporary directory, every file fsynced, then renamed into
place; only directories whose ``state.json`` parses count. A crash mid-write therefore leaves
the last good checkpoint untouched, and the next save or load ignores the debris. Older
checkpoints beyond ``keep_last`` are deleted only after the new one is in place.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from longtail_workers.weights.checksum import canonical_tensors, state_dict_checksum

log = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"^step-(\d{6,})$")
MODEL_FILE, OPTIMIZER_FILE, STATE_FILE = "model.safetensors", "optimizer.pt", "state.json"


@dataclass(frozen=True)
class CheckpointState:
    """``state.json``: what the checkpoint is."""

    step: int
    """RL steps completed when it was written; a resumed run continues at ``step + 1``."""
    policy_version: int
    drafter_version: int
    model_sha256: str
    created_unix: float
    extra: dict[str, Any]


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read (message names the directory and what is wrong)."""


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
) -> Path:
    """Write the checkpoint of ``step`` atomically; returns its directory."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        tensors = canonical_tensors(model.state_dict())
        save_file(tensors, str(tmp / MODEL_FILE))
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        state = CheckpointState(
            step, policy_version, drafter_version, state_dict_checksum(tensors), time.time(),
            extra or {},
        )  # fmt: skip
        (tmp / STATE_FILE).write_text(json.dumps(asdict(state), indent=2) + "\n")
        for f in tmp.iterdir():
            _fsync(f)
        _fsync(tmp)
        if final.exists():  # the same step saved again (stop right after a periodic save)
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync(root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _prune(root, keep_last)
    log.info("checkpoint of step %d written to %s", step, final)
    return final


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as ``(step, dir)``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and (d / STATE_FILE).is_file() and (d / MODEL_FILE).is_file():
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
    directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> CheckpointState:
    """Load weights (checksum-verified) and optimizer state into ``model``/``optimizer``."""
    directory = Path(directory)
    state = read_state(directory)
    tensors = load_file(str(directory / MODEL_FILE))
    actual = state_dict_checksum(tensors)
    if actual != state.model_sha256:
        raise CheckpointError(
            f"{directory / MODEL_FILE}: sha256 {actual} != {state.model_sha256} recorded in "
            f"{STATE_FILE}; the file is corrupt: resume from an older checkpoint (delete this one)"
        )
    model.load_state_dict(tensors, strict=True)
    opt_path = directory / OPTIMIZER_FILE
    if optimizer is not None and opt_path.is_file():
        optimizer.load_state_dict(torch.load(opt_path, weights_only=True))
    return state


def _prune(root: Path, keep_last: int) -> None:
    found = list_checkpoints(root)
    for _, d in found[: max(0, len(found) - keep_last)]:
        shutil.rmtree(d, ignore_errors=True)
    for d in root.glob(".tmp-*"):  # debris of a crashed writer
        shutil.rmtree(d, ignore_errors=True)
