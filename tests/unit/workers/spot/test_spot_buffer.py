"""The capture buffer: token and byte bounds, oldest-first eviction, two steps, never blocking."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from tiny_targets import tiny_qwen2

from longtail_workers.drafter.pairs import sequence_from_result
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.spot.buffer import CapturedSequence, RolloutBuffer

H = 8  # hidden size of the synthetic sequences: 8 float32 + 1 int64 = 40 bytes per token


def seq(n: int, *, step: int = 0, fill: float = 0.0) -> CapturedSequence:
    return CapturedSequence(
        tokens=torch.arange(n, dtype=torch.long),
        hidden=torch.full((n, H), float(fill)),
        start_position=3,
        policy_version=step,
        step=step,
    )


def test_token_bound_evicts_oldest_first() -> None:
    buf = RolloutBuffer(max_tokens=100, max_bytes=1 << 30)
    for i in range(5):
        assert buf.add(seq(30, fill=i)) == 30
        assert buf.num_tokens <= 100
    kept = buf.snapshot().sequences
    assert [int(s.hidden[0, 0]) for s in kept] == [2, 3, 4]  # 0 and 1 were evicted, in order
    assert [s.seq_id for s in kept] == [2, 3, 4]
    assert buf.num_tokens == 90 and buf.evicted["capacity"] == 2


def test_byte_bound_and_truncation() -> None:
    per_token = seq(1).bytes_per_token
    assert per_token == 8 + 4 * H
    buf = RolloutBuffer(max_tokens=10_000, max_bytes=50 * per_token)
    buf.add(seq(20, fill=0))
    buf.add(seq(20, fill=1))
    buf.add(seq(20, fill=2))  # 60 tokens would exceed 50 tokens' bytes: the oldest goes
    assert buf.num_bytes <= 50 * per_token
    assert [int(s.hidden[0, 0]) for s in buf.snapshot().sequences] == [1, 2]
    # A sequence larger than the whole budget keeps its first tokens (the response start).
    assert buf.add(seq(80, fill=7)) == 50
    (only,) = buf.snapshot().sequences
    assert only.tokens.tolist() == list(range(50)) and buf.num_bytes == 50 * per_token
    # Budgets smaller than one pair store nothing.
    tiny = RolloutBuffer(max_tokens=100, max_bytes=per_token)
    assert tiny.add(seq(5)) == 0 and tiny.dropped["too_short"] == 1


def test_keeps_current_and_previous_step_only() -> None:
    buf = RolloutBuffer(max_tokens=1000, max_bytes=1 << 30)
    buf.add(seq(10, step=0))
    buf.add(seq(10, step=1))
    assert sorted({s.step for s in buf.snapshot().sequences}) == [0, 1]
    buf.add(seq(10, step=2))
    assert sorted({s.step for s in buf.snapshot().sequences}) == [1, 2]
    assert buf.evicted["old_step"] == 1
    assert buf.add(seq(10, step=0)) == 0 and buf.dropped["stale_step"] == 1
    assert buf.add(seq(10, step=1)) == 10  # the previous step is still accepted


def test_add_never_waits_for_the_lock() -> None:
    buf = RolloutBuffer(max_tokens=1000, max_bytes=1 << 30, lock_timeout_s=0.005)
    held, release = threading.Event(), threading.Event()

    def hog() -> None:  # e.g. a trainer stuck inside snapshot()
        with buf._lock:
            held.set()
            release.wait(5.0)

    t = threading.Thread(target=hog)
    t.start()
    try:
        assert held.wait(5.0)
        t0 = time.perf_counter()
        assert buf.add(seq(10)) == 0
        assert time.perf_counter() - t0 < 0.25  # bounded by lock_timeout_s, not by the hog
        assert buf.dropped["lock_contended"] == 1
    finally:
        release.set()
        t.join(5.0)
    assert buf.add(seq(10)) == 10


def test_add_results_from_the_engine_matches_the_pairing_convention() -> None:
    torch.set_num_threads(1)
    engine = TorchEngine(tiny_qwen2(seed=3, vocab_size=32, sharpness=10.0))
    reqs = [
        GenerationRequest([1, 2, 3], max_new_tokens=6, seed=0, return_hidden_states=True),
        GenerationRequest([4], max_new_tokens=1, seed=1, return_hidden_states=True),
    ]
    results = engine.generate(reqs)
    buf = RolloutBuffer(max_tokens=1000, max_bytes=1 << 30)
    kept = buf.add_results(results, policy_version=7, step=2)
    (captured,) = buf.snapshot().sequences  # the 1-token answer has no pair and is skipped
    tokens, hidden, start = sequence_from_result(
        results[0].prompt_token_ids, results[0].output_token_ids, results[0].hidden_states
    )
    assert kept == 6 and buf.dropped["too_short"] == 1
    assert torch.equal(captured.tokens, tokens) and torch.equal(captured.hidden, hidden)
    assert captured.start_position == start == 2  # the last prompt position
    assert (captured.policy_version, captured.step) == (7, 2)
    plain = engine.generate([GenerationRequest([1], max_new_tokens=3, seed=0)])
    with pytest.raises(ValueError, match="return_hidden_states=True"):
        buf.add_results(plain, policy_version=7, step=2)
