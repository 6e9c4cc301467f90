"""The policy on one trainer rank: (sharded) model, AdamW, and the collective operations on it.

``trainer/setup.py`` (rank 0) and ``trainer/group.py`` (the follower ranks) build it with
:func:`build_policy`; rank 0's step driver reaches it through
:class:`~longtail_workers.trainer.group.PolicyLeader`, which first tells the followers which
operation comes next, so that every rank runs :meth:`Policy.train`, :meth:`Policy.gather_pass`
(a weight sync), :meth:`Policy.full_state`, :meth:`Policy.save` or :meth:`Policy.load` at the
same point. At world 1 the same methods run
on the unsharded model, with no group at all. Each operation is one
:meth:`~longtail_workers.trainer.world.TrainerWorld.collective` phase, so a rank that dies in it
fails it with an error naming that rank.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from longtail_api.spec import RLJobSpec
from longtail_workers.runtime import role_device
from longtail_workers.trainer.batch import GrpoBatch
from longtail_workers.trainer.checkpoint import CheckpointState, load_checkpoint, save_checkpoint
from longtail_workers.trainer.optim import (
    StepStats,
    TrainConfig,
    build_optimizer,
    micro_batch_budget,
    train_step,
)
from longtail_workers.trainer.row_gather import RowGatherer
from longtail_workers.trainer.sharding import (
    StateDict,
    full_state_dict,
    gather_tensors,
    shard_policy,
    wire_layout,
)
from longtail_workers.trainer.world import TrainerWorld
from longtail_workers.weights.sync import TensorMeta

log = logging.getLogger(__name__)


class Policy:
    """One rank's share of the policy and its optimiser (see the module text)."""

    def __init__(
        self,
        model: nn.Module,
        cfg: TrainConfig,
        world: TrainerWorld | None = None,
        reference: nn.Module | None = None,
        wire_dtype: torch.dtype | None = None,
    ) -> None:
        self.model, self.cfg = model, cfg
        self.world = world or TrainerWorld()
        self.reference = reference
        """The frozen KL reference (the policy as loaded), whole, on rank 0 only: rank 0 scores
        the batch with it and the followers receive the log-probs with the batch."""
        self.optimizer = build_optimizer(model, cfg)
        self.layout: list[TensorMeta] = wire_layout(model, wire_dtype)
        """Each published version's tensors as they travel (the rollout engine's dtype), in the
        order every rank gathers them (:meth:`gather_pass`)."""
        self.gatherer = RowGatherer(max((m.nbytes for m in self.layout), default=0))
        """Where rank 0 lands the whole tensors of every :meth:`gather_pass` (reused)."""
        own = {k: v.dtype for k, v in model.state_dict().items()}
        self.wire_is_native = all(own[m.name] == m.dtype for m in self.layout)
        """True when a version travels in the model's own dtypes: its sha256 is then the
        checksum of the model's state dict (the checkpoint's ``model_sha256``)."""

    def train(
        self, batch: GrpoBatch, step: int, stop: Callable[[], bool] | None = None
    ) -> StepStats:
        """One GRPO update on this rank's rows of ``batch`` (the whole batch, on every rank);
        ``stop``: see :func:`~longtail_workers.trainer.optim.train_step` (rank 0's)."""
        with self.world.collective(f"the GRPO update of step {step}"):
            self.model.train()
            try:
                return train_step(
                    self.model, self.optimizer, batch, self.cfg, self.world, stop=stop
                )
            finally:
                self.model.eval()

    def gather_pass(self) -> Iterator[torch.Tensor]:
        """One pass over the whole tensors of :attr:`layout`, in its order (a weight sync).

        A collective at world > 1: every rank runs the whole pass (the followers only send
        their rows); a rank that stops fails it with an error naming that rank. Rank 0 holds at
        most two whole tensors at a time (the one given out, the next one in flight), the
        others none.
        """
        with self.world.collective("gathering the policy weights for a weight sync"):
            yield from gather_tensors(self.model, self.layout, self.gatherer)

    def full_state(self) -> StateDict | None:
        """The whole state dict on rank 0 (None on the others), in the model's dtypes: a whole
        CPU copy, so a weight sync never uses it (it streams: :meth:`gather_pass`); the tests
        compare what was published with it."""
        with self.world.collective("gathering the policy weights"):
            return full_state_dict(self.model, self.world)

    def save(self, root: Path, *, step: int, tmp_name: str, **fields: Any) -> Path:
        """This rank's part of the checkpoint of ``step`` (``fields``: see
        :func:`~longtail_workers.trainer.checkpoint.save_checkpoint`)."""
        with self.world.collective(f"the checkpoint of step {step}"):
            return save_checkpoint(
                root, step=step, model=self.model, optimizer=self.optimizer, world=self.world,
                tmp_name=tmp_name, **fields,
            )  # fmt: skip

    def load(self, directory: Path) -> CheckpointState:
        """Load the checkpoint in ``directory`` (written at any world size)."""
        with self.world.collective(f"loading the checkpoint {directory}"):
            return load_checkpoint(directory, self.model, self.optimizer, self.world)


def build_policy(
    spec: RLJobSpec, world: TrainerWorld, model: nn.Module | None = None
) -> tuple[Policy, Any]:
    """``(policy, tokenizer)`` for ``spec`` on ``world``: loaded (unless ``model`` is given, its
    tokenizer then None), the KL reference copied on rank 0, sharded, AdamW built."""
    tokenizer = None
    if model is None:
        from longtail_workers.models.loading import load_policy

        loaded, tokenizer = load_policy(spec.model.path, dtype=spec.model.dtype)
        model = nn.Module.to(loaded, world.device)  # the rank's device (cuda:LOCAL_RANK on GPU)
    reference = None
    if spec.algorithm.kl_coef > 0 and world.leader:  # before sharding: a whole, frozen copy
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    model = shard_policy(
        model, world, activation_checkpointing=spec.trainer.activation_checkpointing
    )
    budget = micro_batch_budget(spec.trainer.micro_batch_tokens, world.device)
    cfg = TrainConfig.from_algorithm(spec.algorithm, micro_batch_tokens=budget)
    return Policy(model, cfg, world, reference, wire_dtype(spec)), tokenizer


def wire_dtype(spec: RLJobSpec) -> torch.dtype:
    """The dtype policy versions travel in: the rollout engine's (``model.dtype`` resolved on
    the rollout role's device), so the trainer casts once and no receiver does."""
    from longtail_workers.models.loading import resolve_dtype  # transformers: only when used

    return resolve_dtype(spec.model.dtype, torch.device(role_device(spec.rollout.resources)))
