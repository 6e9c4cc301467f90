"""GrowingLayer: in-place appends read exactly like HF's concatenating DynamicLayer."""

from __future__ import annotations

import torch
from tiny_targets import tiny_qwen2
from transformers.cache_utils import DynamicLayer

from longtail_workers.engine.target import TargetModel
from longtail_workers.kvcache.layer import MIN_SPARE_SLOTS, GrowingLayer


def _kv(b: int, q: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 2, q, 4, generator=g), torch.randn(b, 2, q, 4, generator=g)


def test_appends_match_dynamic_layer_and_grow_geometrically() -> None:
    grow, ref = GrowingLayer(), DynamicLayer()
    capacities = []
    for i, q in enumerate([7, 1, 1, 3, *([1] * 40), 5]):
        k, v = _kv(3, q, seed=i)
        gk, gv = grow.update(k, v)
        rk, rv = ref.update(k, v)
        assert torch.equal(gk, rk) and torch.equal(gv, rv)
        capacities.append(grow.capacity)
    assert grow.get_seq_length() == ref.get_seq_length() == 57
    # 57 slots in 4 buffers (7+16, then x1.5), not one buffer per append.
    assert len(set(capacities)) <= 4
    assert capacities[0] == 7 + MIN_SPARE_SLOTS


def test_a_crop_keeps_the_buffer_and_the_next_append_overwrites_it() -> None:
    layer = GrowingLayer()
    layer.update(*_kv(2, 10, seed=0))
    buffer = layer.keys.data_ptr()
    kept = layer.keys[..., :6, :].clone()
    layer.keys = layer.keys[..., :-4, :]  # what PaddedKVCache.drop_last does
    layer.values = layer.values[..., :-4, :]
    assert layer.get_seq_length() == 6 and layer.keys.data_ptr() == buffer
    k, v = _kv(2, 2, seed=1)
    keys, values = layer.update(k, v)
    assert keys.shape[2] == 8 and keys.data_ptr() == buffer  # no reallocation
    assert torch.equal(keys[..., :6, :], kept) and torch.equal(keys[..., 6:, :], k)
    assert torch.equal(values[..., 6:, :], v)


def test_assigning_a_new_tensor_adopts_it() -> None:
    layer = GrowingLayer()
    layer.update(*_kv(2, 10, seed=0))
    window = layer.keys[..., 4:, :]  # a sliding window: not a prefix, so it is adopted
    layer.keys, layer.values = window, layer.values[..., 4:, :]
    assert layer.get_seq_length() == 6
    k, v = _kv(2, 1, seed=2)
    keys, _ = layer.update(k, v)
    assert torch.equal(keys[..., :6, :], window) and torch.equal(keys[..., 6:, :], k)


def test_select_rows_keeps_spare_slots() -> None:
    layer = GrowingLayer()
    k, v = _kv(3, 5, seed=0)
    layer.update(k, v)
    rows = torch.tensor([2, 0])
    layer.select_rows(rows)
    assert torch.equal(layer.keys, k[rows]) and torch.equal(layer.values, v[rows])
    assert layer.capacity == 5 + MIN_SPARE_SLOTS
    k2, v2 = _kv(2, 1, seed=3)
    keys, _ = layer.update(k2, v2)
    assert torch.equal(keys, torch.cat([k[rows], k2], dim=2))


def test_the_engine_cache_uses_growing_layers_and_decodes_as_without_cache() -> None:
    model = tiny_qwen2(seed=3, vocab_size=32, dtype=torch.float64)
    target = TargetModel(model)
    kv = target.new_cache(1)
    assert all(isinstance(layer, GrowingLayer) for layer in kv.cache.layers)
    tokens = [1, 5, 9]
    ids = torch.tensor([tokens])
    ones = torch.ones(1, 3, dtype=torch.bool)
    logits, _ = target.forward(ids, torch.arange(3)[None], kv, ones)
    for step in range(30):  # several buffer growths
        nxt = int(logits[0, -1].argmax())
        tokens.append(nxt)
        pos = torch.tensor([[len(tokens) - 1]])
        logits, _ = target.forward(torch.tensor([[nxt]]), pos, kv, ones[:, :1])
        with torch.no_grad():
            full = model(input_ids=torch.tensor([tokens])).logits[0, -1]
        assert torch.allclose(logits[0, -1], full, atol=1e-9), step
