"""The static buffers' size: slots per row, rows under a memory budget, and the errors.

``engine/native/sizing.py`` on its own, and through the engine: a budget caps the rows that decode
together (every request still completes) and the buffers stay within it; a request longer than
``max_model_len`` or a budget below one row is refused naming the setting and the fix.
"""

from __future__ import annotations

import pytest
import torch
from tiny_targets import tiny_qwen2

from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.sizing import GIB, Limits, Needs, row_shape
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine


def _needs(requests: int = 10, longest: int = 100, depth: int = 4) -> Needs:
    return Needs(requests, longest, stops=2, hidden=True, drafter=True, depth=depth)


def _limits(**kw: object) -> Limits:
    base: dict[str, object] = {
        "max_running": 64,
        "max_model_len": None,
        "kv_cache_gb": None,
        "buckets": None,
        "rounding": 256,
        "bytes_per_slot": 1000,
    }
    base.update(kw)
    return Limits(**base)  # type: ignore[arg-type]


def test_row_shape_sizes_rows_and_slots() -> None:
    shape = row_shape(_needs(), _limits())
    assert (shape.capacity, shape.length) == (10, 256)  # 100 + 4 + 2 rounded up
    assert row_shape(_needs(requests=100), _limits()).capacity == 64
    assert row_shape(_needs(requests=5), _limits(buckets=(1, 2, 4, 8, 16))).capacity == 8
    assert row_shape(_needs(), _limits(max_model_len=4096)).length == 4096
    budget = 3 * 256 * 1000 / GIB  # three rows of 256 slots
    assert row_shape(_needs(), _limits(kv_cache_gb=budget)).capacity == 3


def test_row_shape_refuses_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match=r"max_model_len=100; raise max_model_len"):
        row_shape(_needs(longest=100), _limits(max_model_len=100))
    with pytest.raises(ValueError, match=r"kv_cache_gb=1e-06 cannot hold one row"):
        row_shape(_needs(), _limits(kv_cache_gb=1e-6))


def test_a_budget_caps_the_running_rows_and_every_request_completes() -> None:
    torch.set_num_threads(1)
    model = tiny_qwen2(seed=3, vocab_size=40, dtype=torch.float64)
    requests = [GenerationRequest([1, 2, 3], max_new_tokens=5, temperature=0.0)] * 9
    free = TorchEngine(model, config=EngineConfig(max_running=16))
    wide = free.generate(requests)
    row_bytes = free.buffer_bytes // 9  # nine rows were allocated
    budget_gb = 3.5 * row_bytes / GIB
    capped = TorchEngine(model, config=EngineConfig(max_running=16, kv_cache_gb=budget_gb))
    narrow = capped.generate(requests)
    assert capped.row_shape is not None and capped.row_shape.capacity == 3
    assert 0 < capped.buffer_bytes <= budget_gb * GIB
    assert [r.output_token_ids for r in narrow] == [r.output_token_ids for r in wide]
    with pytest.raises(ValueError, match=r"EngineConfig\.max_model_len=8"):
        TorchEngine(model, config=EngineConfig(max_model_len=8)).generate(requests)
    with pytest.raises(ValueError, match="attention_backend='triton' needs Triton and a CUDA"):
        TorchEngine(model, config=EngineConfig(attention_backend="triton"))
