"""The drafter module: frozen shared embedding/LM head, architecture, cached == uncached."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_targets import tiny_qwen2
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

from longtail_api.policies import LossWeightsSpec
from longtail_workers.drafter.loss import drafter_loss
from longtail_workers.drafter.model import EagleDrafter, layout_options
from longtail_workers.kvcache.slot_attention import use_slot_attention
from longtail_workers.kvcache.slots import SlotAttention, SlotKVCache


@pytest.fixture
def target() -> torch.nn.Module:
    torch.set_num_threads(1)
    return tiny_qwen2(seed=2, vocab_size=32, hidden_size=64)


def _data(seed: int = 0, b: int = 2, t: int = 6):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randint(0, 32, (b, t), generator=gen),
        torch.randn(b, t, 64, generator=gen),
        torch.arange(t).expand(b, t),
        torch.randn(b, t, 64, generator=gen),
    )


def test_shared_parts_are_references_outside_state_and_parameters(target) -> None:
    drafter = EagleDrafter(target, target_id="t")
    assert drafter.embedding is target.get_input_embeddings()
    assert drafter.lm_head is target.get_output_embeddings()
    shared = {id(target.get_input_embeddings().weight), id(target.get_output_embeddings().weight)}
    assert not shared & {id(p) for p in drafter.parameters()}
    assert set(drafter.state_dict()) == {n for n, _ in drafter.named_parameters()}
    assert isinstance(drafter.layer, Qwen2DecoderLayer)
    assert drafter.fc.in_features == 128 and drafter.fc.out_features == 64
    clone = copy.deepcopy(drafter)
    assert clone.lm_head is target.get_output_embeddings()  # deepcopy never copies the target


def test_optimizer_step_never_touches_the_target(target) -> None:
    drafter = EagleDrafter(target, target_id="t")
    target.requires_grad_(True)  # even a trainable target must stay untouched
    embed_before = target.get_input_embeddings().weight.detach().clone()
    head_before = target.get_output_embeddings().weight.detach().clone()
    fc_before = drafter.fc.weight.detach().clone()
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-2)
    ids, hidden, pos, nxt = _data()
    loss = drafter_loss(drafter, drafter(ids, hidden, pos), nxt, LossWeightsSpec())
    loss.total.backward()
    opt.step()
    assert target.get_input_embeddings().weight.grad is None
    assert target.get_output_embeddings().weight.grad is None
    torch.testing.assert_close(target.get_input_embeddings().weight, embed_before, rtol=0, atol=0)
    torch.testing.assert_close(target.get_output_embeddings().weight, head_before, rtol=0, atol=0)
    assert not torch.equal(drafter.fc.weight, fc_before)


def test_cached_incremental_forward_equals_full_forward(target) -> None:
    drafter = EagleDrafter(target, target_id="t", seed=4).double()
    target.double()
    ids, hidden, pos, _ = _data(t=7)
    hidden = hidden.double()
    with torch.no_grad():
        full = drafter(ids, hidden, pos)  # [B, T, H], causal
        use_slot_attention(drafter.config)
        kv = SlotKVCache(drafter.config, 2, 8, torch.device("cpu"), torch.float64, num_layers=1)
        parts = []
        for lo, hi in ((0, 3), (3, 4), (4, 7)):
            at = pos[:, lo:hi]
            kv.step = SlotAttention(at, torch.zeros_like(at), span=hi)
            parts.append(drafter(ids[:, lo:hi], hidden[:, lo:hi], at, kv.step, kv))
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-12)


def test_loss_weights_and_mask(target) -> None:
    drafter = EagleDrafter(target, target_id="t")
    ids, hidden, pos, nxt = _data()
    pred = drafter(ids, hidden, pos)
    only_l1 = drafter_loss(drafter, pred, nxt, LossWeightsSpec(smooth_l1=1.0, cross_entropy=0.0))
    only_ce = drafter_loss(drafter, pred, nxt, LossWeightsSpec(smooth_l1=0.0, cross_entropy=1.0))
    both = drafter_loss(drafter, pred, nxt, LossWeightsSpec())
    torch.testing.assert_close(only_l1.total, only_l1.smooth_l1)
    torch.testing.assert_close(only_ce.total, only_ce.cross_entropy)
    torch.testing.assert_close(both.total, both.smooth_l1 + 0.1 * both.cross_entropy)
    # Perfect prediction: SmoothL1 is 0 and CE equals the target distribution's entropy.
    perfect = drafter_loss(drafter, nxt, nxt, LossWeightsSpec())
    p = torch.softmax(drafter.logits(nxt), -1)
    entropy = -(p * p.log()).sum(-1).mean()
    assert float(perfect.smooth_l1) == 0.0
    torch.testing.assert_close(perfect.cross_entropy, entropy, rtol=1e-5, atol=1e-6)
    # Masked positions do not count, whatever garbage they hold.
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[:, 4:] = False
    garbage = pred.detach().clone()
    garbage[:, 4:] = 1e3
    masked = drafter_loss(drafter, garbage, nxt, LossWeightsSpec(), valid)
    trimmed = drafter_loss(drafter, pred[:, :4], nxt[:, :4], LossWeightsSpec())
    torch.testing.assert_close(masked.total, trimmed.total.detach())


def test_unsupported_targets_are_refused() -> None:
    model = tiny_qwen2(seed=0, vocab_size=16)
    model.lm_head = torch.nn.Sequential(model.lm_head)
    with pytest.raises(ValueError, match=r"nn\.Linear LM head"):
        EagleDrafter(model, target_id="x")


def test_named_layouts_build_the_documented_modules(target) -> None:
    eagle1 = EagleDrafter(target, target_id="t", **layout_options("eagle1"))
    assert eagle1.fc.bias is None
    assert isinstance(eagle1.layer.input_layernorm, torch.nn.Identity)
    default = EagleDrafter(target, target_id="t", **layout_options("longtail"))
    assert default.fc.bias is not None
    assert not isinstance(default.layer.input_layernorm, torch.nn.Identity)
    with pytest.raises(ValueError, match=r"drafterTraining\.layout"):
        layout_options("medusa")
