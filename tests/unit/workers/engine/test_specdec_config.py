"""Speculative-decoding setup errors are explicit, and drafter versions can be swapped."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import fixed_sd
from tiny_targets import tiny_qwen2

from longtail_api.policies import SpeculativeSpec, StrategySpec
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine

SD = fixed_sd(threshold=8)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.set_num_threads(1)
    return tiny_qwen2(seed=12, vocab_size=24, sharpness=10.0, dtype=torch.float64)


def test_enabled_without_drafter_is_an_error(model) -> None:
    with pytest.raises(ValueError, match=r"speculative\.enabled is true but no drafter"):
        TorchEngine(model, speculative=SD)


def test_drafter_of_another_model_instance_is_refused(model) -> None:
    twin = tiny_qwen2(seed=12, vocab_size=24, sharpness=10.0, dtype=torch.float64)
    with pytest.raises(ValueError, match="another model instance"):
        TorchEngine(model, speculative=SD, drafter=EagleDrafter(twin, target_id="t"))


def test_drafter_in_training_mode_is_refused(model) -> None:
    drafter = EagleDrafter(model, target_id="t").train()
    with pytest.raises(ValueError, match=r"drafter\.eval\(\)"):
        TorchEngine(model, speculative=SD, drafter=drafter)


def test_tree_drafting_strategy_is_refused(model) -> None:
    spec = replace(SD, strategies=[StrategySpec(draft_depth=3, verify_tokens=9)])
    with pytest.raises(ValueError, match=r"strategies\[0\]\.verifyTokens=9"):
        TorchEngine(model, speculative=spec, drafter=EagleDrafter(model, target_id="t"))


def test_attention_without_explicit_masks_is_refused() -> None:
    model = tiny_qwen2(seed=1, vocab_size=24)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        TorchEngine(model)


def test_disabled_spec_never_speculates_even_with_a_drafter(model) -> None:
    spec = SpeculativeSpec(enabled=False)
    engine = TorchEngine(model, speculative=spec, drafter=EagleDrafter(model, target_id="t"))
    engine.generate([GenerationRequest([1, 2], max_new_tokens=6, temperature=0.0)])
    assert engine.stats.sd_steps == 0 and engine.stats.plain_steps > 0


def test_swapping_drafter_versions_between_rollouts(model) -> None:
    engine = TorchEngine(model, speculative=SD, drafter=EagleDrafter(model, target_id="t"))
    reqs = [GenerationRequest([1, 2, 3], max_new_tokens=10, temperature=0.0)]
    first = engine.generate(reqs)
    drafts_before = engine.stats.drafted
    engine.set_drafter(EagleDrafter(model, target_id="t", seed=7))
    second = engine.generate(reqs)
    assert second[0].output_token_ids == first[0].output_token_ids  # lossless either way
    assert engine.stats.drafted > drafts_before
