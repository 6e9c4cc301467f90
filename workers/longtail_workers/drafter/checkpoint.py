"""Save and load a drafter's own weights, bound to the target they were trained for.

Used by the drafter trainers (publish a version) and by rollout engines (load the newest
version). A drafter directory holds ``model.safetensors`` (only the trainable weights: ``fc``
and the decoder layer; never the target's embedding or LM head, so publishing a drafter can
never overwrite the shared weights) and ``config.json`` naming the target: architecture,
identifier, and the shapes the weights depend on. Loading onto a different target is refused
with an error that lists every mismatching field.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import nn

from longtail_workers.drafter.model import EagleDrafter, TargetInfo

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
    tensors = {k: v.detach().contiguous().cpu() for k, v in drafter.trainable_state_dict().items()}
    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": DRAFTER_FORMAT})
    config = {
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
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return path


def read_drafter_config(directory: str | Path) -> dict[str, object]:
    """The parsed ``config.json`` of a drafter directory (format checked)."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise DrafterMismatchError(f"{path} does not exist; not a drafter directory")
    try:
        config = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DrafterMismatchError(f"{path}: not JSON ({exc}); not a drafter directory") from exc
    if not isinstance(config, dict):
        raise DrafterMismatchError(f"{path}: holds a {type(config).__name__}, not a JSON object")
    if config.get("format") != DRAFTER_FORMAT:
        raise DrafterMismatchError(
            f"{path}: format {config.get('format')!r}, expected {DRAFTER_FORMAT!r}"
        )
    if config.get("format_version") != DRAFTER_FORMAT_VERSION:
        raise DrafterMismatchError(
            f"{path}: format_version {config.get('format_version')!r}, this code reads "
            f"{DRAFTER_FORMAT_VERSION}"
        )
    return dict(config)


def load_drafter(directory: str | Path, target: nn.Module, *, target_id: str) -> EagleDrafter:
    """Build a drafter on ``target`` and load the weights from ``directory``.

    Raises :class:`DrafterMismatchError` when the directory's target differs from ``target``
    (architecture, identifier or shapes) or the weight file does not match the module.
    """
    config = read_drafter_config(directory)
    saved = config.get("target")
    actual = dataclasses.asdict(TargetInfo.of(target, target_id))
    if not isinstance(saved, dict):
        raise DrafterMismatchError(f"{directory}/{CONFIG_FILE}: no 'target' object")
    diffs = [
        f"{key}: drafter was trained for {saved.get(key)!r}, this target has {value!r}"
        for key, value in actual.items()
        if saved.get(key) != value
    ]
    if diffs:
        raise DrafterMismatchError(
            f"drafter in {directory} does not belong to this target ({'; '.join(diffs)}); "
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
    weights = load_file(str(Path(directory) / WEIGHTS_FILE), device=str(drafter.fc.weight.device))
    expected = drafter.trainable_state_dict()
    missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    bad_shapes = [k for k in expected if k in weights and weights[k].shape != expected[k].shape]
    if missing or unexpected or bad_shapes:
        raise DrafterMismatchError(
            f"{directory}/{WEIGHTS_FILE} does not fit the drafter module: missing {missing}, "
            f"unexpected {unexpected}, wrong shapes {bad_shapes}"
        )
    drafter.load_state_dict({k: v.to(expected[k].dtype) for k, v in weights.items()})
    return drafter
