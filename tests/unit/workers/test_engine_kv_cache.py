"""PaddedKVCache: holes, compaction and merging never change what a forward computes."""

from __future__ import annotations

import pytest
import torch
from tiny_targets import tiny_qwen2

from longtail_workers.engine.target import TargetModel
from longtail_workers.kvcache.cache import attention_mask


@pytest.fixture(scope="module")
def target() -> TargetModel:
    torch.set_num_threads(1)
    return TargetModel(tiny_qwen2(seed=5, vocab_size=32, sharpness=5.0, dtype=torch.float64))


def _reference(target: TargetModel, tokens: list[int]) -> torch.Tensor:
    """Last-position logits of an uncached forward ``[V]``."""
    with torch.no_grad():
        return target.model(input_ids=torch.tensor([tokens])).logits[0, -1]


def _prefill(target: TargetModel, prompts: list[list[int]]):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    valid = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
    pos = (valid.cumsum(1) - 1).clamp(min=0)
    kv = target.new_cache(len(prompts))
    target.forward(ids, pos, kv, valid)
    return kv


def _step(target, kv, tokens: list[int], positions: list[int]) -> torch.Tensor:
    ones = torch.ones(len(tokens), 1, dtype=torch.bool)
    logits, _ = target.forward(
        torch.tensor(tokens)[:, None], torch.tensor(positions)[:, None], kv, ones
    )
    return logits[:, 0]


def test_mask_padding_queries_attend_only_to_themselves() -> None:
    past = torch.tensor([[True, False, True]])
    new = torch.tensor([[True, False]])
    additive = attention_mask(past, new, torch.float64, "eager")[0, 0]  # [2, 5]
    boolean = attention_mask(past, new, torch.float64, "sdpa")[0, 0]
    assert boolean.tolist() == (additive == 0).tolist()
    assert boolean.tolist() == [
        [True, False, True, True, False],  # valid query: valid past + itself
        [False, False, False, False, True],  # padding query: itself only
    ]


def _mask_by_definition(past: torch.Tensor, new: torch.Tensor) -> list[list[list[bool]]]:
    """The documented rule, slot by slot: valid queries see valid slots up to themselves."""
    b, q = new.shape
    length = past.shape[1]
    kv = torch.cat([past, new], dim=1)
    return [
        [
            [
                (j == length + i) if not new[r, i] else bool(kv[r, j]) and j <= length + i
                for j in range(length + q)
            ]
            for i in range(q)
        ]
        for r in range(b)
    ]


@pytest.mark.parametrize("q", [1, 3])
def test_mask_matches_its_definition_for_single_and_multi_token_queries(q: int) -> None:
    gen = torch.Generator().manual_seed(q)
    past = torch.rand(4, 6, generator=gen) > 0.3
    new = torch.rand(4, q, generator=gen) > 0.3
    mask = attention_mask(past, new, torch.float32, "sdpa")  # [B, 1, Q, L+Q]
    assert mask.shape == (4, 1, q, 6 + q)
    assert mask[:, 0].tolist() == _mask_by_definition(past, new)


def test_holes_compaction_and_merge_preserve_results(target) -> None:
    prompts = [[3, 4, 5, 6, 7], [8, 9]]
    kv = _prefill(target, prompts)
    # Speculate 3 tokens per row; row 0 keeps 1 input slot, row 1 keeps all 3 (ragged).
    spec = torch.tensor([[10, 11, 12], [13, 14, 15]])
    pos = torch.tensor([[5, 6, 7], [2, 3, 4]])
    target.forward(spec, pos, kv, torch.ones(2, 3, dtype=torch.bool))
    kv.invalidate_tail(torch.tensor([[True, False, False], [True, True, True]]))
    seq0, seq1 = [3, 4, 5, 6, 7, 10], [8, 9, 13, 14, 15]
    got = _step(target, kv, [20, 21], [6, 5])
    torch.testing.assert_close(got[0], _reference(target, [*seq0, 20]), rtol=0, atol=1e-10)
    torch.testing.assert_close(got[1], _reference(target, [*seq1, 21]), rtol=0, atol=1e-10)
    seq0, seq1 = [*seq0, 20], [*seq1, 21]
    slots_before = kv.num_slots
    kv.compact()
    assert kv.num_slots < slots_before and kv.valid_counts().tolist() == [7, 6]
    got = _step(target, kv, [22, 23], [7, 6])
    torch.testing.assert_close(got[0], _reference(target, [*seq0, 22]), rtol=0, atol=1e-10)
    torch.testing.assert_close(got[1], _reference(target, [*seq1, 23]), rtol=0, atol=1e-10)
    seq0, seq1 = [*seq0, 22], [*seq1, 23]
    # Merge a newly prefilled row with a longer prompt, then drop row 0.
    other = _prefill(target, [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]])
    kv.extend(other)
    got = _step(target, kv, [24, 25, 26], [8, 7, 11])
    torch.testing.assert_close(got[2], _reference(target, [*range(1, 12), 26]), rtol=0, atol=1e-10)
    torch.testing.assert_close(got[1], _reference(target, [*seq1, 25]), rtol=0, atol=1e-10)
    kv.select(torch.tensor([1, 2]))
    got = _step(target, kv, [27, 28], [8, 12])
    torch.testing.assert_close(got[0], _reference(target, [*seq1, 25, 27]), rtol=0, atol=1e-10)
    torch.testing.assert_close(
        got[1], _reference(target, [*range(1, 12), 26, 28]), rtol=0, atol=1e-10
    )


def test_drop_last_and_waste(target) -> None:
    kv = _prefill(target, [[1, 2, 3], [4]])
    assert kv.num_slots == 3 and kv.waste() == 0
    target.forward(
        torch.tensor([[5, 6], [7, 8]]),
        torch.tensor([[3, 4], [1, 2]]),
        kv,
        torch.ones(2, 2, dtype=torch.bool),
    )
    kv.drop_last(2)
    assert kv.num_slots == 3
    got = _step(target, kv, [9, 10], [3, 1])
    torch.testing.assert_close(got[0], _reference(target, [1, 2, 3, 9]), rtol=0, atol=1e-10)
    torch.testing.assert_close(got[1], _reference(target, [4, 10]), rtol=0, atol=1e-10)
    kv.invalidate_tail(torch.tensor([[False], [False]]))
    assert kv.waste() == 1


def test_keep_last_is_attention_over_the_newest_slots_only(target) -> None:
    """After keep_last(n) a query sees exactly the newest n slots: the same logits as a model
    that never had the older ones (keys carry their positions, so nothing else changes)."""
    kv = _prefill(target, [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    kv.keep_last(2)
    assert kv.num_slots == 2 and bool(kv.valid.all())
    got = _step(target, kv, [11, 12], [5, 5])
    window = _prefill(target, [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    window.valid[:, :3] = False  # the same cache with the three oldest slots masked out
    expected = _step(target, window, [11, 12], [5, 5])
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    full = _step(target, _prefill(target, [[1, 2, 3, 4, 5]]), [11], [5])[0]
    assert not torch.allclose(got[0], full)  # the cut really removed context
    kv.keep_last(5)  # asking for more than there is keeps everything
    assert kv.num_slots == 3
    with pytest.raises(ValueError, match="n >= 0"):
        kv.keep_last(-1)
