"""RunningBatch.commit cuts a speculative run exactly at a stop token or the token budget."""

from __future__ import annotations

import torch
from tiny_targets import tiny_qwen2

from longtail_workers.engine.batch import RunningBatch, SequenceState
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.kvcache.cache import PaddedKVCache


def _batch(requests: list[GenerationRequest]) -> RunningBatch:
    config = tiny_qwen2(vocab_size=16).config
    seqs = [
        SequenceState(
            index=i,
            request=r,
            seed=i,
            keep_hidden=True,
            prompt=list(r.prompt_token_ids),
        )
        for i, r in enumerate(requests)
    ]
    for s in seqs:  # prompt pairs, as a prefill would have recorded (not kept: offset P-1)
        s.record_pairs(torch.zeros(len(s.prompt) - 1, 4))
    return RunningBatch(
        seqs, PaddedKVCache(config, len(seqs), torch.device("cpu")), torch.device("cpu")
    )


def test_commit_truncates_at_stop_and_budget() -> None:
    batch = _batch(
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
    states = torch.arange(64, dtype=torch.float64).view(4, 4, 4)
    kept = batch.commit(tokens, emitted, logprobs, states)
    assert kept.tolist() == [2, 2, 2, 3]
    s0, s1, s2, s3 = batch.seqs
    assert (s0.output, s0.finish_reason) == ([5, 7], "stop")
    assert (s1.output, s1.finish_reason) == ([5, 6], "length")
    assert (s2.output, s2.finish_reason) == ([5, 6], None)  # the 7 was never emitted
    assert (s3.output, s3.finish_reason) == ([5, 6, 8], None)
    assert s0.logprobs == [0.0, -0.1]
    assert batch.last_token.tolist() == [7, 6, 6, 8]
    assert batch.out_len.tolist() == [2, 2, 2, 3]
    # Pair states recorded for exactly the kept tokens, in order.
    torch.testing.assert_close(s3.pair_states(len(s3.prompt) - 1), states[3, :3])
    assert s3.num_pairs == len(s3.prompt) - 1 + 3
