"""``builtin:small`` (models/recipe.py): its size and build estimate without allocating it, its
recipe built for real at a micro size on the CPU through the same build, cache and loading
path, its drafter, the registries that must agree, and ``builtin:tiny``'s cache names as they
were."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest
import torch
from micro_models import MICRO, MICRO_SMALL
from transformers import Qwen2ForCausalLM

from longtail_api.context import BUILTIN_MODEL_POSITIONS, spec_context_error
from longtail_api.manifest import validate_file
from longtail_api.rules import BUILTIN_DRAFTERS
from longtail_workers.models import loading, recipe, sft
from longtail_workers.models.builtin import (
    BUILD_INFO_FILE,
    ensure_policy,
    policy_dir,
    read_build_info,
)
from longtail_workers.models.cache import CACHE_ENV
from longtail_workers.models.recipe import (
    SMALL,
    TINY,
    build_device,
    build_estimate,
    longest_sequence,
    model_config,
    parameter_count,
)
from longtail_workers.models.tokenizer import build_char_tokenizer
from longtail_workers.tasks import arith_long
from longtail_workers.tasks.arith import ArithConfig, generate
from longtail_workers.warmstart import builtin as drafters
from longtail_workers.warmstart.builtin import (
    BuiltinTarget,
    DrafterRecipe,
    builtin_drafter_dir,
    ensure_builtin_drafter,
)
from longtail_workers.warmstart.offline import OfflineFit

REPO = Path(__file__).resolve().parents[4]
EXAMPLE = REPO / "examples" / "06-small-arith-gpu.yaml"


def test_tiny_cache_names_are_unchanged() -> None:
    # Names computed before builtin:small and label_letters existed: no user rebuilds tiny.
    assert TINY.fingerprint() == "516bf86367ce"
    assert builtin_drafter_dir("builtin:tiny", "longtail").name == (
        "tiny-516bf86367ce-longtail-3403ecd994d9"
    )
    assert builtin_drafter_dir("builtin:tiny", "eagle1").name == (
        "tiny-516bf86367ce-eagle1-3403ecd994d9"
    )
    assert MICRO.fingerprint() == "73093f5919e0"
    # The new knobs count once they leave the values that build as before.
    assert dataclasses.replace(TINY, device="auto").fingerprint() != TINY.fingerprint()
    two_letters = dataclasses.replace(TINY, task=ArithConfig(label_letters=2))
    assert two_letters.fingerprint() != TINY.fingerprint()
    assert DrafterRecipe(device="auto").fingerprint() != DrafterRecipe().fingerprint()


def test_small_is_half_a_billion_parameters_counted_without_allocating() -> None:
    assert parameter_count(SMALL) == 535_275_520 >= 500_000_000
    assert parameter_count(TINY) == 2_693_120  # the figure docs/tasks-and-rewards.md gives
    config = model_config(SMALL, build_char_tokenizer())
    assert config.hidden_size // config.num_attention_heads == 128  # Triton attention: 2**k


def test_small_build_fits_the_gpu_session_budget() -> None:
    estimate = build_estimate(SMALL)
    # 6 N + attention per token, 660 steps of 16k tokens, 35% of an H100's bf16 peak: ~115 s of
    # SFT (docs/tasks-and-rewards.md), under the 150 s a GPU session gives the whole build.
    assert estimate.train_tokens == 660 * 16384
    assert 110 < estimate.train_seconds < 125
    assert estimate.flops_per_token == pytest.approx(3.676e9, rel=1e-3)


def test_small_holds_the_longest_prompt_and_answer_budget() -> None:
    longest_prompt = longest_sequence(SMALL.train_task) - 2036  # minus the longest answer
    assert longest_prompt == 485
    assert longest_prompt + arith_long.MAX_NEW_TOKENS <= SMALL.max_position_embeddings
    assert SMALL.train_task == arith_long.CONFIG and SMALL.task.label_letters == 2


def test_the_registries_name_the_same_builtin_models() -> None:
    assert (
        sorted(loading.BUILTIN_MODELS) == sorted(recipe.RECIPES) == sorted(drafters.BUILTIN_TARGETS)
    )
    assert sorted(BUILTIN_MODEL_POSITIONS) == sorted(BUILTIN_DRAFTERS)
    for name, shipped in recipe.RECIPES.items():
        assert BUILTIN_MODEL_POSITIONS[f"builtin:{name}"] == shipped.max_position_embeddings
        assert drafters.BUILTIN_TARGETS[name].model == shipped and shipped.name == name


def test_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    assert build_device(SMALL) == torch.device("cpu")  # no GPU here: the CPU, float32
    assert drafters.SMALL_DRAFTER_RECIPE.placement() == ("cpu", "float32")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert build_device(SMALL) == torch.device("cuda", 0) and build_device(TINY).type == "cpu"
    assert drafters.SMALL_DRAFTER_RECIPE.placement() == ("cuda:0", "bfloat16")
    assert drafters.DEFAULT_DRAFTER_RECIPE.placement() == ("cpu", "float32")
    with pytest.raises(ValueError, match=r"PolicyRecipe.device: 'gpu'"):
        build_device(dataclasses.replace(SMALL, device="gpu"))
    with pytest.raises(ValueError, match=r"DrafterRecipe.device: 'gpu'"):
        DrafterRecipe(device="gpu").placement()


def test_the_padding_mask_is_redundant_for_right_padded_sft() -> None:
    # Why the CUDA fit may drop it (sft._loss): same loss with and without the mask.
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(model_config(MICRO_SMALL, tok))
    encoded = sft.encode_items(generate(6, seed=0, config=MICRO_SMALL.train_task), tok)
    input_ids, mask, labels = sft.collate(encoded, list(range(6)), tok.pad_token_id)
    assert (mask == 0).any()  # the batch really is padded
    masked = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
    unmasked = model(input_ids=input_ids, labels=labels).loss
    assert torch.allclose(masked, unmasked, atol=1e-5)
    assert isinstance(sft.autocast_for(model), contextlib.nullcontext)


def test_micro_small_builds_on_the_cpu_and_loads_as_builtin_small(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    path = ensure_policy(MICRO_SMALL)
    assert (
        path
        == policy_dir(MICRO_SMALL)
        == tmp_path / "models" / f"small-{MICRO_SMALL.fingerprint()}"
    )
    info = read_build_info(path)
    assert info["device"] == "cpu" and info["recipe"]["name"] == "small"
    assert info["estimate"]["parameters"] == info["parameters"]  # the meta count is the real one
    assert len(info["phase_losses"]) == 2 and info["eval_items"] == MICRO_SMALL.eval_items
    monkeypatch.setitem(loading.BUILTIN_MODELS, "small", lambda: ensure_policy(MICRO_SMALL))
    model, tok = loading.load_policy("builtin:small")
    assert model.config.max_position_embeddings == 4096 and model.config.num_key_value_heads == 1
    assert len(tok) == model.config.vocab_size == 259
    # Its drafter: sampled on arith-long prompts, fitted where the recipe says (here the CPU).
    quick = dataclasses.replace(
        drafters.SMALL_DRAFTER_RECIPE,
        prompts=10,
        max_new_tokens=12,
        fit=OfflineFit(steps=3, batch_size=2),
    )
    monkeypatch.setitem(drafters.BUILTIN_TARGETS, "small", BuiltinTarget(MICRO_SMALL, quick))
    fitted = ensure_builtin_drafter("builtin:small", "longtail")
    assert fitted.name.startswith(f"small-{MICRO_SMALL.fingerprint()}-longtail-")
    record = read_build_info(fitted)
    assert record["device"] == "cpu" and record["recipe"]["dataset"] == "builtin:arith-long"
    assert (fitted / BUILD_INFO_FILE).is_file() and record["sampled_tokens"] > 0


def test_example_06_runs_small_on_arith_long_on_one_gpu() -> None:
    (result,) = validate_file(EXAMPLE)
    assert result.errors == [] and result.spec is not None
    spec = result.spec
    assert spec.model.path == spec.drafter_training.initial_drafter == "builtin:small"
    assert spec.dataset.path == "builtin:arith-long"
    assert spec.algorithm.max_new_tokens == arith_long.MAX_NEW_TOKENS
    assert spec.rollout.resources.gpus == spec.trainer.resources.gpus == 1
    assert spec.weight_sync_transport() == "http" and spec_context_error(spec) is None
