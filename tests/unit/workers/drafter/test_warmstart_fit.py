"""Offline drafter fitting: the loss falls and a fitted drafter gets more drafts accepted."""

from __future__ import annotations

import pytest
from helpers import mean_accepted_length
from tiny_targets import random_prompts

from longtail_api.policies import DrafterTrainingSpec
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
from longtail_workers.warmstart.fit import (
    collect_training_sequences,
    fit_drafter,
    pair_batch,
    training_sequences,
)

VOCAB = 48


def test_fitted_drafter_beats_untrained_one_in_the_engine(target) -> None:
    requests = [
        GenerationRequest(p, max_new_tokens=48, temperature=1.0, seed=i)
        for i, p in enumerate(random_prompts(0, 64, VOCAB))
    ]
    seqs = collect_training_sequences(
        TorchEngine(target, config=EngineConfig(max_running=64)), requests
    )
    assert len(seqs) == 64 and seqs[0].hidden.shape[1] == 64
    untrained = EagleDrafter(target, target_id="tiny-fit", seed=1)
    fitted = EagleDrafter(target, target_id="tiny-fit", seed=1)
    training = DrafterTrainingSpec(learning_rate=3e-3, window_tokens=32)
    report = fit_drafter(fitted, seqs, steps=200, training=training, batch_size=16, seed=0)
    first, last = sum(report.total[:10]) / 10, sum(report.total[-10:]) / 10
    assert last < 0.7 * first, (first, last)
    assert not fitted.training  # left in eval mode for the engine
    for temperature in (0.0, 1.0):
        before = mean_accepted_length(target, untrained, temperature)
        after = mean_accepted_length(target, fitted, temperature)
        assert after > before + 0.3, (temperature, before, after)


def test_pair_batch_masks_padding(target) -> None:
    res = TorchEngine(target).generate(
        [
            GenerationRequest([1, 2], max_new_tokens=5, seed=0, return_hidden_states=True),
            GenerationRequest([3], max_new_tokens=3, seed=1, return_hidden_states=True),
        ]
    )
    seqs = training_sequences(res)
    ids, hidden, pos, tgt, valid = pair_batch(seqs)
    assert ids.shape == (2, 4) and hidden.shape == (2, 4, 64) and tgt.shape == (2, 4, 64)
    assert valid.tolist() == [[True] * 4, [True, True, False, False]]
    assert pos[0].tolist() == [1, 2, 3, 4] and pos[1, :2].tolist() == [0, 1]
    with pytest.raises(ValueError, match="return_hidden_states"):
        training_sequences(TorchEngine(target).generate([GenerationRequest([1], 3)]))
