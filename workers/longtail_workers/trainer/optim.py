"""The policy optimiser and one GRPO update: :func:`train_step`.

The trainer's step driver builds the optimiser once with :func:`build_optimizer` and calls
:func:`train_step` once per RL step with the step's :class:`~longtail_workers.trainer.batch.
GrpoBatch`. A step is: micro-batched forward passes (token budget), :func:`~longtail_workers.
trainer.grpo.grpo_loss` normalised by the whole batch's token count (so the accumulated
gradient is exactly the full batch's), backward, gradient-norm clipping, AdamW step, zeroed
gradients. A sharded trainer (``trainer/policy.py``) runs the same function on every rank, each
on its share of the batch's rows. A non-finite gradient norm skips the update (the weights stay
as they were) and is reported in the stats, as veRL does, rather than writing NaN into the
policy.

A stop (SIGTERM, Ctrl-C: the driver's ``stop``) abandons the update between micro-batches and
before the optimiser step: the gradients are dropped, the weights and the optimiser state stay
those of the last completed step, and :class:`UpdateAbandoned` is raised (all ranks of a
sharded trainer agree on it, so none is left in a collective). The driver then checkpoints the
last completed step.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from longtail_api.spec import AlgorithmSpec
from longtail_workers.trainer.batch import GrpoBatch, micro_batches, shard_rows
from longtail_workers.trainer.grpo import grpo_loss, sequence_logprobs_and_entropy
from longtail_workers.trainer.world import TrainerWorld

log = logging.getLogger(__name__)

CPU_MICRO_BATCH_TOKENS = 1024
"""Padded tokens per forward pass on CPU. Small passes keep activations in cache, so a policy
update on a few CPU threads is faster in small micro-batches than in large ones (the sweep is in
docs/performance.md, "A stronger baseline")."""
GPU_MICRO_BATCH_TOKENS = 16384
"""Padded tokens per forward pass on an accelerator, where bigger passes use it better (veRL's
default token budget per GPU is the same)."""


def micro_batch_budget(requested: int | None, device: torch.device) -> int:
    """The update's token budget: ``requested`` (``spec.trainer.microBatchTokens``) if set,
    else the default for a policy on ``device`` (see the two constants)."""
    if requested:
        return requested
    return CPU_MICRO_BATCH_TOKENS if device.type == "cpu" else GPU_MICRO_BATCH_TOKENS


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser and loss settings of the policy update."""

    learning_rate: float = 1e-6
    weight_decay: float = 0.0
    """Decoupled (AdamW) decay on matrices only. 0 by default: RL fine-tunes a pretrained
    policy, and decay pulls it toward zero rather than toward anything useful."""
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this; ``None`` measures it without clipping."""
    clip_ratio: float = 0.2
    kl_coef: float = 0.0
    temperature: float = 1.0
    """Rollout sampling temperature; log-probs are taken at the same temperature."""
    micro_batch_tokens: int | None = None
    """Most padded tokens per forward pass; ``None`` runs the whole batch at once."""

    def __post_init__(self) -> None:
        checks = {
            "learning_rate": self.learning_rate > 0,
            "weight_decay": self.weight_decay >= 0,
            "adam_eps": self.adam_eps > 0,
            "max_grad_norm": self.max_grad_norm is None or self.max_grad_norm > 0,
            "clip_ratio": 0 < self.clip_ratio < 1,
            "kl_coef": self.kl_coef >= 0,
            "temperature": self.temperature > 0,
            "micro_batch_tokens": self.micro_batch_tokens is None or self.micro_batch_tokens > 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in bad)
            raise ValueError(
                f"invalid TrainConfig: {shown} (need learning_rate, adam_eps, temperature > 0; "
                "weight_decay, kl_coef >= 0; 0 < clip_ratio < 1; max_grad_norm and "
                "micro_batch_tokens > 0 or None)"
            )

    @classmethod
    def from_algorithm(cls, algorithm: AlgorithmSpec, **overrides: Any) -> TrainConfig:
        """The RLJob's ``spec.algorithm`` settings; ``overrides`` set the other fields.

        A greedy rollout (``temperature: 0``) is scored at temperature 1.
        """
        values: dict[str, Any] = {
            "learning_rate": algorithm.learning_rate,
            "clip_ratio": algorithm.clip_ratio,
            "kl_coef": algorithm.kl_coef,
            "temperature": algorithm.temperature if algorithm.temperature > 0 else 1.0,
        }
        values.update(overrides)
        return cls(**values)


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; no weight decay on biases and norm weights."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    if not decay and not no_decay:
        raise ValueError("model has no trainable parameters (all requires_grad=False)")
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=cfg.learning_rate,
        betas=cfg.betas,
        eps=cfg.adam_eps,
    )


class UpdateAbandoned(Exception):
    """A stop was asked for during the policy update: it was abandoned, nothing was applied."""


@dataclass(frozen=True)
class StepStats:
    """What one :func:`train_step` did; loss terms are token means over the whole batch."""

    loss: float
    pg_loss: float
    kl_ref: float
    clip_fraction: float
    approx_kl: float
    ratio_mean: float
    entropy: float
    """Mean entropy (nats) of the policy's tempered next-token distribution over the response
    tokens, from the update's own forward passes (veRL's ``actor/entropy``)."""
    grad_norm: float
    """Global gradient norm before clipping."""
    grad_clipped: bool
    skipped: bool
    """True when the gradient was not finite and the update was skipped."""
    tokens: int
    sequences: int
    micro_batches: int
    learning_rate: float

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in dataclasses.asdict(self).items()}


_STAT_FIELDS = ("pg_loss", "kl_ref", "clip_fraction", "approx_kl", "ratio_mean", "entropy")


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: GrpoBatch,
    cfg: TrainConfig,
    world: TrainerWorld | None = None,
    stop: Callable[[], bool] | None = None,
) -> StepStats:
    """One GRPO policy update on ``batch``; returns its :class:`StepStats`.

    ``stop()`` is asked before each micro-batch and before the optimiser step; once it says
    True the update is abandoned (:class:`UpdateAbandoned`, the weights untouched). On a sharded
    ``world`` rank 0's answer holds for every rank (the others pass None).

    With a sharded ``world`` every rank calls this with the same whole ``batch`` and trains on
    its :func:`~longtail_workers.trainer.batch.shard_rows` slice. Each micro-batch loss is still
    divided by the *whole* batch's token count, and FSDP sums (not averages) the ranks'
    gradients (``trainer/policy.py``), so the gradient is exactly world 1's, up to float
    summation order. The stats are summed over the ranks and equal on every rank.
    """
    world = world or TrainerWorld()
    total_tokens = batch.num_tokens
    if total_tokens == 0:
        raise ValueError("batch has no response tokens (response_mask is all 0)")
    optimizer.zero_grad(set_to_none=True)  # a stray gradient must not leak into this update
    plans = [
        micro_batches(batch, cfg.micro_batch_tokens, rows) if rows else []
        for rows in shard_rows(batch, world.size)
    ]
    mine = plans[world.rank]
    # FSDP gathers and reduces in every forward/backward pass, so all ranks must run the same
    # number of passes: a rank with fewer micro-batches runs zero-weight passes on one row.
    passes = max(len(p) for p in plans)
    filler = micro_batches(batch, None, shard_rows(batch, 1)[0][:1])[0]
    sums = torch.zeros(1 + len(_STAT_FIELDS), dtype=torch.float64)  # [loss, token-weighted stats]
    device = next(model.parameters()).device  # the batch is built on the host
    for k in range(passes):
        _check_stop(stop, world, optimizer, f"before micro-batch {k + 1} of {passes}")
        real = k < len(mine)
        mb = (mine[k] if real else filler).to(device)
        logprobs, entropy = sequence_logprobs_and_entropy(
            model, mb.input_ids, mb.attention_mask, mb.response_mask, cfg.temperature
        )  # [b, t] each; the entropy carries no gradient
        loss, stats = grpo_loss(
            logprobs,
            mb.old_logprobs,
            mb.advantages,
            mb.response_mask,
            cfg.clip_ratio,
            ref_logprobs=mb.ref_logprobs,
            kl_coef=cfg.kl_coef,
            num_tokens=total_tokens,  # token-mean over the whole batch, not per micro-batch
            entropy=entropy,
        )
        if not real:
            loss = loss * 0.0  # keeps the graph, so the pass's gradient reduction still runs
        loss.backward()  # type: ignore[no-untyped-call]  # accumulates across micro-batches
        if real:
            parts = [float(getattr(stats, f)) * stats.tokens for f in _STAT_FIELDS]
            sums += torch.tensor([float(loss.detach()), *parts], dtype=torch.float64)
    if world.sharded:
        on_device = sums.to(world.device)  # NCCL reduces device tensors only
        dist.all_reduce(on_device)
        sums = on_device.cpu()

    _check_stop(stop, world, optimizer, "before the optimizer step")
    grad_norm, clipped, skipped = _clip_and_step(optimizer, cfg.max_grad_norm)
    optimizer.zero_grad(set_to_none=True)
    means = {f: float(sums[1 + i]) / total_tokens for i, f in enumerate(_STAT_FIELDS)}
    return StepStats(
        loss=float(sums[0]),
        **means,
        grad_norm=grad_norm,
        grad_clipped=clipped,
        skipped=skipped,
        tokens=total_tokens,
        sequences=batch.num_sequences,
        micro_batches=sum(len(p) for p in plans),
        learning_rate=float(optimizer.param_groups[0]["lr"]),
    )


def _check_stop(
    stop: Callable[[], bool] | None,
    world: TrainerWorld,
    optimizer: torch.optim.Optimizer,
    where: str,
) -> None:
    """Abandon the update (drop the gradients, raise :class:`UpdateAbandoned`) when a stop is
    asked for; sharded, every rank takes rank 0's answer (one tiny all-reduce per check)."""
    asked = bool(stop is not None and stop())
    if world.sharded:
        flag = torch.tensor([1.0 if asked else 0.0], device=world.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        asked = bool(flag.item() > 0)
    if asked:
        optimizer.zero_grad(set_to_none=True)
        raise UpdateAbandoned(f"stop requested: the policy update was abandoned {where}")


def _clip_and_step(
    optimizer: torch.optim.Optimizer, max_grad_norm: float | None
) -> tuple[float, bool, bool]:
    """Clip, then step unless the norm is not finite: ``(pre-clip norm, clipped, skipped)``."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not params:
        raise RuntimeError("no parameter received a gradient; is the model in torch.no_grad?")
    grads = [p.grad for p in params if p.grad is not None]
    total = nn.utils.get_total_norm(grads)
    if isinstance(total, DTensor):  # sharded gradients: this rank's part of the norm
        total = total.full_tensor()  # all-reduce: the global norm, the same on every rank
    norm = float(total)
    if not math.isfinite(norm):
        log.warning("gradient norm is %s: skipping this update (weights unchanged)", norm)
        return norm, False, True
    clipped = False
    if max_grad_norm is not None and norm > max_grad_norm:
        # clip_grads_with_norm_'s scaling, with a Python float: it also multiplies DTensors
        coef = max_grad_norm / (norm + 1e-6)
        for g in grads:
            g.mul_(coef)
        clipped = True
    optimizer.step()
    return norm, clipped, False
