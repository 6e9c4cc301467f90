"""Offline drafter fitting: roll out the target, then train the drafter on its own states.

Used to warm-start a drafter before RL (and by tests, to get a drafter that is "partly right").
The online spot trainer does the same thing incrementally, from the rollouts of the current RL
step, with the same pieces: ``pairs.build_training_pairs`` (the pairing convention),
``loss.drafter_loss`` (TLT's loss) and AdamW on the drafter's own parameters only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch.nn.utils.rnn import pad_sequence

from longtail_api.policies import DrafterTrainingSpec
from longtail_workers.drafter.loss import DrafterLoss, drafter_loss
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.pairs import build_training_pairs, sequence_from_result
from longtail_workers.engine.interface import GenerationRequest, GenerationResult, RolloutEngine


@dataclass
class TrainingSequence:
    """Tokens and the target states at those tokens (``hidden[t]`` after reading ``tokens[t]``)."""

    tokens: torch.Tensor
    """``[N]`` int64."""
    hidden: torch.Tensor
    """``[N, H]``."""
    start_position: int
    """Absolute position of ``tokens[0]``."""


@dataclass
class FitReport:
    """Loss history of a fit (unweighted parts, per step)."""

    total: list[float] = field(default_factory=list)
    smooth_l1: list[float] = field(default_factory=list)
    cross_entropy: list[float] = field(default_factory=list)


def training_sequences(results: Sequence[GenerationResult]) -> list[TrainingSequence]:
    """Convert engine results (generated with hidden states) into training sequences."""
    out = []
    for r in results:
        if r.hidden_states is None:
            raise ValueError(
                f"result {r.request_id!r} has no hidden_states; generate with "
                "return_hidden_states=True"
            )
        if len(r.output_token_ids) < 2:
            continue  # one state, no pair
        tokens, hidden, start = sequence_from_result(
            r.prompt_token_ids, r.output_token_ids, r.hidden_states
        )
        out.append(TrainingSequence(tokens, hidden.detach(), start))
    return out


def collect_training_sequences(
    engine: RolloutEngine, requests: Sequence[GenerationRequest]
) -> list[TrainingSequence]:
    """Generate ``requests`` (with hidden states) and return their training sequences."""
    with_hidden = [dataclasses.replace(r, return_hidden_states=True) for r in requests]
    return training_sequences(engine.generate(with_hidden))


def _window(seq: TrainingSequence, max_pairs: int, gen: torch.Generator) -> TrainingSequence:
    """A random window of at most ``max_pairs + 1`` tokens of ``seq``."""
    n = int(seq.tokens.shape[0])
    if n <= max_pairs + 1:
        return seq
    start = int(torch.randint(0, n - max_pairs, (1,), generator=gen))
    end = start + max_pairs + 1
    return TrainingSequence(
        seq.tokens[start:end], seq.hidden[start:end], seq.start_position + start
    )


def pair_batch(
    seqs: Sequence[TrainingSequence],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded pair batch: ``(input_ids, hidden, positions, target_hidden, valid)``.

    Shapes ``[B, T]``, ``[B, T, H]``, ``[B, T]``, ``[B, T, H]``, ``[B, T]`` (bool).
    """
    pairs = [build_training_pairs(s.tokens, s.hidden, s.start_position) for s in seqs]
    ids = pad_sequence([p[0].input_ids for p in pairs], batch_first=True)
    hidden = pad_sequence([p[0].hidden for p in pairs], batch_first=True)
    pos = pad_sequence([p[0].position_ids for p in pairs], batch_first=True)
    target = pad_sequence([p[1].hidden for p in pairs], batch_first=True)
    lengths = torch.tensor([p[0].input_ids.shape[0] for p in pairs], device=ids.device)
    valid = torch.arange(ids.shape[1], device=ids.device)[None, :] < lengths[:, None]
    return ids, hidden, pos, target, valid


def training_step_loss(
    drafter: EagleDrafter, seqs: Sequence[TrainingSequence], training: DrafterTrainingSpec
) -> DrafterLoss:
    """Forward a batch of sequences through the drafter and return TLT's loss."""
    ids, hidden, pos, target, valid = pair_batch(seqs)
    mask = drafter.mask(valid[:, :0], valid)  # causal + padding
    predicted = drafter(ids, hidden, pos, attention_mask=mask)  # [B, T, H]
    return drafter_loss(drafter, predicted, target, training.loss_weights, valid)


def fit_drafter(
    drafter: EagleDrafter,
    sequences: Sequence[TrainingSequence],
    *,
    steps: int,
    training: DrafterTrainingSpec | None = None,
    batch_size: int = 8,
    seed: int = 0,
    on_step: Callable[[int, DrafterLoss], object] | None = None,
) -> FitReport:
    """Train ``drafter`` for ``steps`` AdamW steps on random windows of ``sequences``."""
    if not sequences:
        raise ValueError("fit_drafter needs at least one training sequence with >= 2 tokens")
    training = training or DrafterTrainingSpec()
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=training.learning_rate)
    report = FitReport()
    drafter.train()
    try:
        for step in range(steps):
            picks = torch.randint(0, len(sequences), (batch_size,), generator=gen).tolist()
            batch = [_window(sequences[i], training.window_tokens, gen) for i in picks]
            loss = training_step_loss(drafter, batch, training)
            optimizer.zero_grad(set_to_none=True)
            loss.total.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            optimizer.step()
            report.total.append(float(loss.total.detach()))
            report.smooth_l1.append(float(loss.smooth_l1))
            report.cross_entropy.append(float(loss.cross_entropy))
            if on_step is not None:
                on_step(step, loss)
    finally:
        drafter.eval()
    return report
