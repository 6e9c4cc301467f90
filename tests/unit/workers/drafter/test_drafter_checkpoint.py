"""Drafter checkpoints: only the drafter's own weights, bound to (and checked against) a target."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_targets import tiny_qwen2

from longtail_workers.drafter.checkpoint import (
    DrafterMismatchError,
    load_drafter,
    read_drafter_config,
    save_drafter,
)
from longtail_workers.drafter.model import EagleDrafter

# conftest.py's ``target`` fixture builds this policy
TARGET = dict(seed=1, vocab_size=32, hidden_size=64)


def _inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 32, (2, 7), generator=gen)
    hidden = torch.randn(2, 7, 64, generator=gen)
    pos = torch.arange(7).expand(2, 7)
    return ids, hidden, pos


def test_round_trip_stores_only_trainable_weights(target, tmp_path) -> None:
    drafter = EagleDrafter(target, target_id="tiny-ckpt", seed=3)
    save_drafter(drafter, tmp_path / "d", version=4)
    stored = load_file(str(tmp_path / "d" / "model.safetensors"))
    assert set(stored) == {name for name, _ in drafter.named_parameters()}
    assert all(k.startswith(("fc.", "layer.")) for k in stored)
    assert not any("embed" in k or "lm_head" in k for k in stored)
    config = read_drafter_config(tmp_path / "d")
    assert config["target"]["identifier"] == "tiny-ckpt"
    assert config["target"]["architecture"] == "Qwen2ForCausalLM"
    assert config["version"] == 4
    loaded = load_drafter(tmp_path / "d", target, target_id="tiny-ckpt")
    assert loaded.embedding is target.get_input_embeddings()
    ids, hidden, pos = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(ids, hidden, pos), drafter(ids, hidden, pos), rtol=0, atol=0
        )
    fresh = EagleDrafter(target, target_id="tiny-ckpt", seed=99)
    with torch.no_grad():
        assert not torch.allclose(fresh(ids, hidden, pos), drafter(ids, hidden, pos))


@pytest.mark.parametrize(
    ("other_kwargs", "target_id", "field"),
    [
        (dict(hidden_size=32), "tiny-ckpt", "hidden_size"),
        (dict(vocab_size=40), "tiny-ckpt", "vocab_size"),
        (dict(), "another-model", "identifier"),
        (dict(intermediate_size=96), "tiny-ckpt", "intermediate_size"),
    ],
)
def test_mismatched_target_is_refused(target, tmp_path, other_kwargs, target_id, field) -> None:
    save_drafter(EagleDrafter(target, target_id="tiny-ckpt"), tmp_path / "d")
    base = dict(seed=1, vocab_size=32, hidden_size=64)
    other = tiny_qwen2(**{**base, **other_kwargs})
    with pytest.raises(DrafterMismatchError, match=field) as err:
        load_drafter(tmp_path / "d", other, target_id=target_id)
    assert "trained for" in str(err.value)


def test_not_a_drafter_directory(target, tmp_path) -> None:
    with pytest.raises(DrafterMismatchError, match="not a drafter directory"):
        load_drafter(tmp_path, target, target_id="tiny-ckpt")
    (tmp_path / "config.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(DrafterMismatchError, match="format"):
        load_drafter(tmp_path, target, target_id="tiny-ckpt")


def test_weights_with_foreign_keys_are_refused(target, tmp_path) -> None:
    save_drafter(EagleDrafter(target, target_id="tiny-ckpt"), tmp_path / "d")
    weights = load_file(str(tmp_path / "d" / "model.safetensors"))
    weights["embed_tokens.weight"] = torch.zeros(32, 64)  # a push that would overwrite the target
    save_file(weights, str(tmp_path / "d" / "model.safetensors"))
    before = target.get_input_embeddings().weight.clone()
    with pytest.raises(DrafterMismatchError, match="unexpected"):
        load_drafter(tmp_path / "d", target, target_id="tiny-ckpt")
    torch.testing.assert_close(target.get_input_embeddings().weight, before, rtol=0, atol=0)
