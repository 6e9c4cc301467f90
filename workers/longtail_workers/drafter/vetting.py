"""Checks that a drafter candidate is the job's drafter, with finite weights, before it is used.

Called by :class:`~longtail_workers.drafter.registry.DrafterRegistry`: when a candidate is stored
(``submit_candidate_files``, behind the trainer's upload endpoint in ``drafter/exchange.py``, which
answers 400 with the message and stores nothing), when candidates are merged (one that fails is
skipped and reported; the others are merged) and before any version is published (a drafter
with a NaN or infinite weight is never published). The trainer builds the
:class:`DrafterReference` from the job's own drafter (``runtime.initial_drafter`` on its policy,
``trainer/setup.py``): the names, shapes and dtypes of its tensors and the target it belongs
to. One non-finite candidate would otherwise poison the token-weighted average (``merge.py``)
and every version after it, and the run would go on drafting nothing with no warning.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from longtail_workers.drafter.checkpoint import (
    WEIGHTS_FILE,
    DrafterMismatchError,
    read_drafter_config,
)
from longtail_workers.drafter.model import EagleDrafter


class CandidateRejected(DrafterMismatchError):
    """A drafter candidate is not usable as the job's drafter (the message names the problem)."""


class NonFiniteDrafterError(CandidateRejected):
    """A drafter's weights hold NaN or infinite values; it is never stored or published."""


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one drafter tensor (dtype spelled like ``float32``)."""

    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorSpec:
        return cls(tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))


@dataclass(frozen=True)
class DrafterReference:
    """What every candidate of a job must be: the job's drafter's target and tensors."""

    target: Mapping[str, object]
    """``TargetInfo`` of the job's policy, as ``config.json`` spells it."""
    tensors: Mapping[str, TensorSpec]

    @classmethod
    def of(cls, drafter: EagleDrafter) -> DrafterReference:
        state = drafter.trainable_state_dict()
        tensors = {k: TensorSpec.of(v) for k, v in state.items()}
        return cls(dataclasses.asdict(drafter.info), tensors)

    def check_config(self, config: Mapping[str, object], source: str) -> None:
        """Refuse a ``config.json`` written for another target."""
        saved = config.get("target")
        if not isinstance(saved, dict):
            raise CandidateRejected(f"{source}: config.json has no 'target' object")
        diffs = [
            f"{key}={saved.get(key)!r} (the job's drafter has {value!r})"
            for key, value in self.target.items()
            if saved.get(key) != value
        ]
        if diffs:
            raise CandidateRejected(
                f"{source}: trained for another target: {'; '.join(diffs)}; train the "
                "candidate from the job's drafter (the version the trainer serves)"
            )

    def check_weights(self, weights: Mapping[str, torch.Tensor], source: str) -> None:
        """Refuse missing or unexpected tensors, other shapes or other dtypes (all listed)."""
        missing = sorted(set(self.tensors) - set(weights))
        unexpected = sorted(set(weights) - set(self.tensors))
        wrong = [
            f"{k}: {TensorSpec.of(weights[k])} (expected {want})"
            for k, want in sorted(self.tensors.items())
            if k in weights and TensorSpec.of(weights[k]) != want
        ]
        problems = [
            *([f"missing tensors {missing}"] if missing else []),
            *([f"unexpected tensors {unexpected}"] if unexpected else []),
            *wrong,
        ]
        if problems:
            raise CandidateRejected(
                f"{source}: {WEIGHTS_FILE} is not the job's drafter: {'; '.join(problems[:8])}"
                f"{f' (+{len(problems) - 8} more)' if len(problems) > 8 else ''}; send the "
                "weights save_drafter writes for the job's drafter layout"
            )


def check_finite(weights: Mapping[str, torch.Tensor], source: str) -> None:
    """Raise :class:`NonFiniteDrafterError` naming every tensor with a NaN or an infinity."""
    bad = []
    for name in sorted(weights):
        tensor = weights[name]
        if tensor.is_floating_point():
            count = int((~torch.isfinite(tensor)).sum())
            if count:
                bad.append(f"{name} ({count} of {tensor.numel()})")
    if bad:
        raise NonFiniteDrafterError(
            f"{source}: non-finite weights (NaN or inf) in {', '.join(bad)}; the drafter "
            "diverged (lower drafterTraining.learningRate); it is not used"
        )


def read_weights(path: Path, source: str) -> dict[str, torch.Tensor]:
    """The tensors of a drafter's ``model.safetensors``; refused when unreadable or empty."""
    try:
        weights = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise CandidateRejected(f"{source}: {WEIGHTS_FILE} is not safetensors: {exc}") from exc
    if not weights:
        raise CandidateRejected(
            f"{source}: {WEIGHTS_FILE} holds no tensors; a candidate carries the drafter's "
            "trained weights as save_drafter writes them"
        )
    return weights


def check_candidate_dir(
    directory: Path, reference: DrafterReference | None, source: str
) -> dict[str, torch.Tensor]:
    """Check a saved drafter (``config.json`` + ``model.safetensors``); returns its weights.

    Without a reference only the format, a non-empty weights file and finiteness are checked.
    """
    config = read_drafter_config(directory)
    weights = read_weights(directory / WEIGHTS_FILE, source)
    if reference is not None:
        reference.check_config(config, source)
        reference.check_weights(weights, source)
    check_finite(weights, source)
    return weights
