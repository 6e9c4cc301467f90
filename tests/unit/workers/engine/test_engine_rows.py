"""The running batch's static buffers: commit cuts at stop and budget, retirement packs rows.

``engine/native/rows.py`` and ``engine/native/steps.py``'s ``commit``/``pack``: a speculative run
is cut exactly at a stop token or the token budget; retiring rows moves the last live rows into the
holes with everything they own (tokens, caches, hidden states, settings) and leaves the freed
rows inert, so a padded step over them changes nothing.
"""

from __future__ import annotations

import numpy as np
import torch
from tiny_targets import tiny_qwen2

from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.batch import SequenceState
from longtail_workers.engine.native.rows import RowShape, RowState
from longtail_workers.engine.native.steps import commit, pack, unpack
from longtail_workers.kvcache.slots import SlotKVCache

CPU = torch.device("cpu")


def _rows(requests: list[GenerationRequest], capacity: int = 6) -> RowState:
    config = tiny_qwen2(vocab_size=16).config
    shape = RowShape(capacity=capacity, length=16, stop_width=2, hidden=True, drafter=True)
    rows = RowState(
        shape,
        SlotKVCache(config, capacity, 16, CPU, torch.float64),
        SlotKVCache(config, capacity, 16, CPU, torch.float64, num_layers=1),
        hidden_size=4,
        dtype=torch.float64,
        device=CPU,
    )
    seqs = [
        SequenceState(index=i, request=r, seed=i, keep_hidden=True, prompt=list(r.prompt_token_ids))
        for i, r in enumerate(requests)
    ]
    rows.admit(seqs)
    return rows


def test_commit_truncates_at_stop_and_budget() -> None:
    rows = _rows(
        [
            GenerationRequest([1, 2], max_new_tokens=10, stop_token_ids=[7]),  # stop inside the run
            GenerationRequest([1], max_new_tokens=2),  # budget inside the run
            GenerationRequest([3], max_new_tokens=10, stop_token_ids=[7]),  # stop after `emitted`
            GenerationRequest([4, 4, 4], max_new_tokens=10),  # plain: keeps everything emitted
        ]
    )
    tokens = torch.tensor([[5, 7, 9, 9], [5, 6, 9, 9], [5, 6, 7, 9], [5, 6, 8, 9]])
    emitted = torch.tensor([4, 4, 2, 3])
    logprobs = -torch.arange(16, dtype=torch.float64).view(4, 4) / 10
    host = unpack(pack(commit(rows, 0, tokens, emitted, logprobs)), 4)
    assert host.keep.tolist() == [2, 2, 2, 3]
    assert host.stopped.tolist() == [True, False, False, False]
    assert host.finished.tolist() == [True, True, False, False]
    assert host.logprobs[0, :2].tolist() == [0.0, -0.1]  # float64 bits survive the packing
    assert rows.n_tok[:4].tolist() == [4, 3, 3, 6]
    assert rows.out_len[:4].tolist() == [2, 2, 2, 3]
    # The token store holds prompt + kept tokens; the newest token is where the next step reads.
    assert rows.tokens[0, :4].tolist() == [1, 2, 5, 7]
    assert rows.tokens[3, :6].tolist() == [4, 4, 4, 5, 6, 8]


def test_retire_moves_the_last_rows_into_the_holes_and_leaves_free_rows_inert() -> None:
    reqs = [GenerationRequest([i + 1] * (i + 1), max_new_tokens=5) for i in range(5)]
    rows = _rows(reqs)
    for buf in rows.kv.keys + rows.kv.values + rows.draft_kv.keys:  # type: ignore[union-attr]
        buf.copy_(torch.arange(rows.shape.capacity, dtype=buf.dtype)[:, None, None, None])
    assert rows.hidden is not None
    rows.hidden.copy_(torch.arange(rows.shape.capacity, dtype=torch.float64)[:, None, None])
    before = [s.index for s in rows.seqs]
    rows.retire([1, 3])
    # Rows 3 and 4 were the last live rows: 4 moves into hole 1, 3 itself is retired.
    assert [s.index for s in rows.seqs] == [before[0], 4, before[2]]
    assert rows.n_tok[:3].tolist() == [1, 5, 3]
    assert rows.tokens[1, :5].tolist() == [5] * 5
    used = 6  # the moved row's tokens + one slot
    assert bool((rows.kv.keys[0][1, :, :used] == 4).all())
    assert bool((rows.draft_kv.keys[0][1, :, :used] == 4).all())  # type: ignore[union-attr]
    assert bool((rows.hidden[1, :used] == 4).all())
    # Freed rows are inert: one token, no budget, so a padded step emits nothing there.
    assert rows.n_tok[3:].tolist() == [1, 1, 1] and rows.max_new[3:].tolist() == [0, 0, 0]
    assert rows.remaining().tolist() == [5, 5, 5]
    tokens = torch.full((6, 2), 9)
    out = commit(rows, 0, tokens, torch.full((6,), 2), torch.zeros(6, 2))
    assert out.keep.tolist() == [2, 2, 2, 0, 0, 0]
    assert np.array_equal(rows.n_tok_h[:3], [1, 5, 3])  # host mirrors move with their rows
