"""Windows cover every training pair once; packed windows never attend to each other."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.pairs import build_training_pairs
from longtail_workers.spot.buffer import CapturedSequence
from longtail_workers.spot.windows import (
    block_causal_allowed,
    make_windows,
    pack_windows,
    packed_forward,
)

VOCAB, HIDDEN = 32, 32


# conftest.py's ``target`` fixture builds this policy
TARGET = dict(
    seed=4, vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, dtype=torch.float64
)


def captured(n: int, start: int, seed: int) -> CapturedSequence:
    gen = torch.Generator().manual_seed(seed)
    return CapturedSequence(
        tokens=torch.randint(0, VOCAB, (n,), generator=gen),
        hidden=torch.randn(n, HIDDEN, generator=gen, dtype=torch.float64),
        start_position=start,
        policy_version=0,
        step=0,
    )


def test_windows_cover_every_pair_exactly_once() -> None:
    seq = captured(n=23, start=5, seed=0)  # 22 pairs
    windows = make_windows(seq, window_tokens=8)
    assert [w.num_pairs for w in windows] == [8, 8, 6]
    assert [w.start_position for w in windows] == [5, 13, 21]  # window 0 = last prompt position
    for a, b in itertools.pairwise(windows):
        assert torch.equal(a.tokens[-1:], b.tokens[:1])  # consecutive windows share one token
    whole_in, whole_out = build_training_pairs(seq.tokens, seq.hidden, seq.start_position)
    parts = [build_training_pairs(w.tokens, w.hidden, w.start_position) for w in windows]
    assert torch.equal(torch.cat([p[0].input_ids for p in parts]), whole_in.input_ids)
    assert torch.equal(torch.cat([p[0].position_ids for p in parts]), whole_in.position_ids)
    assert torch.equal(torch.cat([p[0].hidden for p in parts]), whole_in.hidden)
    assert torch.equal(torch.cat([p[1].hidden for p in parts]), whole_out.hidden)
    assert make_windows(captured(n=1, start=0, seed=1), 8) == []  # no pair, no window


def test_block_causal_mask() -> None:
    seg = torch.tensor([[0, 0, 1, 1, 1, -1]])
    allowed = block_causal_allowed(seg)[0, 0].int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],  # padding attends to itself only (no NaN), nobody attends to it
    ]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_outputs_equal_unpacked_and_windows_are_isolated(target, attn) -> None:
    drafter = EagleDrafter(target, target_id="tiny-win", seed=2, attn_implementation=attn)
    windows = [
        w
        for i, (n, start) in enumerate([(9, 3), (6, 40), (13, 0), (4, 7)])
        for w in make_windows(captured(n, start, seed=10 + i), window_tokens=8)
    ]
    batch = pack_windows(windows, row_tokens=16)
    assert batch.input_ids.shape[0] >= 2 and bool((batch.segments == -1).any())  # padding
    with torch.no_grad():
        packed = packed_forward(drafter, batch)  # [B, T, H]
    assert torch.isfinite(packed).all()
    at: dict[tuple[int, int], int] = {}
    for w in windows:  # each window alone, as its own unpacked batch
        inputs, _ = build_training_pairs(w.tokens, w.hidden, w.start_position)
        with torch.no_grad():
            alone = drafter(inputs.input_ids[None], inputs.hidden[None], inputs.position_ids[None])
        row, col = _locate(batch, w, at)
        torch.testing.assert_close(packed[row, col : col + w.num_pairs], alone[0])

    # Changing the tokens of window 1 changes its own outputs, never its row neighbour's.
    row_of_first = batch.segments[0]
    assert int(row_of_first.max()) >= 1, "row 0 must hold two windows for this check"
    changed = dataclasses.replace(windows[0], tokens=(windows[0].tokens + 1) % VOCAB)
    batch2 = pack_windows([changed, *windows[1:]], row_tokens=16)
    with torch.no_grad():
        packed2 = packed_forward(drafter, batch2)
    first, second = row_of_first == 0, row_of_first == 1
    assert not torch.allclose(packed2[0][first], packed[0][first])
    torch.testing.assert_close(packed2[0][second], packed[0][second], rtol=0, atol=0)


def _locate(batch, window, seen: dict[tuple[int, int], int]) -> tuple[int, int]:
    """Row and first column of ``window`` in ``batch`` (windows were packed in order)."""
    for row in range(batch.segments.shape[0]):
        for seg in range(int(batch.segments[row].max()) + 1):
            if (row, seg) in seen:
                continue
            cols = (batch.segments[row] == seg).nonzero().flatten()
            pos = batch.position_ids[row, cols]
            if len(cols) == window.num_pairs and int(pos[0]) == window.start_position:
                seen[(row, seg)] = 1
                return row, int(cols[0])
    raise AssertionError("window not found in the packed batch")
