"""Save and load a drafter's own weights, bound to the target they were trained for.

Used by the drafter trainers (publish a version) and by rollout engines (load the newest
version); the drafter exchange (``drafter/exchange.py``) sends the same config and weight bytes
in memory (:func:`drafter_config`, :func:`drafter_weights_bytes`, :func:`build_drafter`). A
drafter directory holds ``model.safetensors`` (only the trainable weights: ``fc`` and the
decoder layer; never the target's embedding or LM head, so publishing a drafter can
never overwrite the shared weights) and ``config.json`` naming the target: architecture,
identifier, and the shapes the weights depend on. Loading onto a different target is refused
with an error that lists every mismatching field.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save
from torch import nn

from longtail_workers.drafter.model import EagleDrafter, TargetInfo
from longtail_workers.weights.checksum import canonical_tensors

DRAFTER_FORMAT = "longtail-eagle-drafter"
DRAFTER_FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


class DrafterMismatchError(ValueError):
    """The drafter on disk was made for another target (or is not a drafter directory)."""


def save_drafter(drafter: EagleDrafter, directory: str | Path, version: int | None = None) -> Path:
    """Write ``drafter``'s trainable weights and its target's identity into ``directory``."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / WEIGHTS_FILE).write_bytes(drafter_weights_bytes(drafter))
    (path / CONFIG_FILE).write_text(config_text(drafter_config(drafter, version)))
    return path


def drafter_weights_bytes(drafter: EagleDrafter) -> bytes:
    """``model.safetensors`` of ``drafter`` as bytes: what :func:`save_drafter` writes and the
    drafter exchange (``drafter/exchange.py``) sends."""
    tensors = canonical_tensors(drafter.trainable_state_dict())
    return save(tensors, metadata={"format": DRAFTER_FORMAT})


def drafter_config(drafter: EagleDrafter, version: int | None = None) -> dict[str, Any]:
    """``config.json`` of ``drafter``: format, its target's identity, its layout."""
    return {
        "format": DRAFTER_FORMAT,
        "format_version": DRAFTER_FORMAT_VERSION,
        "target": dataclasses.asdict(drafter.info),
        "drafter": {
            "layers": 1,
            "final_norm": False,
            "input_norm": drafter.input_norm,
            "fc_bias": drafter.fc_bias,
            "pairing": "input (embed(x[t+1]), h[t]) at position t -> predicts h[t+1]",
        },
        "dtype": str(drafter.fc.weight.dtype).removeprefix("torch."),
        "version": version,
    }


def config_text(config: Mapping[str, Any]) -> str:
    """``config.json``'s text for ``config`` (one spelling, so saved files compare equal)."""
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def read_drafter_config(directory: str | Path) -> dict[str, object]:
    """The parsed ``config.json`` of a drafter directory (format checked)."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise DrafterMismatchError(f"{path} does not exist; not a drafter directory")
    try:
        config = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DrafterMismatchError(f"{path}: not JSON ({exc}); not a drafter directory") from exc
    return check_drafter_config(config, str(path))


def check_drafter_config(config: object, where: str) -> dict[str, object]:
    """``config`` (a parsed ``config.json`` from ``where``) if it is a drafter's of this format."""
    if not isinstance(config, dict):
        raise DrafterMismatchError(f"{where}: holds a {type(config).__name__}, not a JSON object")
    if config.get("format") != DRAFTER_FORMAT:
        raise DrafterMismatchError(
            f"{where}: format {config.get('format')!r}, expected {DRAFTER_FORMAT!r}"
        )
    if config.get("format_version") != DRAFTER_FORMAT_VERSION:
        raise DrafterMismatchError(
            f"{where}: format_version {config.get('format_version')!r}, this code reads "
            f"{DRAFTER_FORMAT_VERSION}"
        )
    return dict(config)


def load_drafter(directory: str | Path, target: nn.Module, *, target_id: str) -> EagleDrafter:
    """Build a drafter on ``target`` and load the weights from ``directory``.

    Raises :class:`DrafterMismatchError` when the directory's target differs from ``target``
    (architecture, identifier or shapes) or the weight file does not match the module.
    """
    config = read_drafter_config(directory)
    weights = load_file(str(Path(directory) / WEIGHTS_FILE))
    return build_drafter(config, weights, target, target_id=target_id, where=str(directory))


def build_drafter(
    config: Mapping[str, object],
    weights: Mapping[str, torch.Tensor],
    target: nn.Module,
    *,
    target_id: str,
    where: str,
) -> EagleDrafter:
    """A drafter on ``target`` from a checked ``config`` and its ``weights`` (from a directory or
    from the drafter exchange's payload, ``where`` names which in errors)."""
    saved = config.get("target")
    actual = dataclasses.asdict(TargetInfo.of(target, target_id))
    if not isinstance(saved, dict):
        raise DrafterMismatchError(f"{where}/{CONFIG_FILE}: no 'target' object")
    diffs = [
        f"{key}: drafter was trained for {saved.get(key)!r}, this target has {value!r}"
        for key, value in actual.items()
        if saved.get(key) != value
    ]
    if diffs:
        raise DrafterMismatchError(
            f"drafter in {where} does not belong to this target ({'; '.join(diffs)}); "
            "load a drafter trained for this model or start from a fresh one"
        )
    layout = config.get("drafter")
    layout = layout if isinstance(layout, dict) else {}
    drafter = EagleDrafter(
        target,
        target_id=target_id,
        input_norm=bool(layout.get("input_norm", True)),
        fc_bias=bool(layout.get("fc_bias", True)),
    )
    expected = drafter.trainable_state_dict()
    missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    bad_shapes = [k for k in expected if k in weights and weights[k].shape != expected[k].shape]
    if missing or unexpected or bad_shapes:
        raise DrafterMismatchError(
            f"{where}/{WEIGHTS_FILE} does not fit the drafter module: missing {missing}, "
            f"unexpected {unexpected}, wrong shapes {bad_shapes}"
        )
    device = drafter.fc.weight.device
    drafter.load_state_dict({k: v.to(device, expected[k].dtype) for k, v in weights.items()})
    return drafter
