"""The drafter's explicit 4D masks (``kvcache/masks.py``): padding and causality by slot order."""

from __future__ import annotations

import pytest
import torch

from longtail_workers.kvcache.masks import attention_mask


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
