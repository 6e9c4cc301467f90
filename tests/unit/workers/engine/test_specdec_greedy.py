"""Greedy speculative decoding is token-identical to plain greedy decoding (and to HF generate).

The target is a tiny random Qwen2 in float64 (so batched/verify forwards cannot flip a near-tie
by rounding). The drafter is briefly fitted on the target's own rollouts, so it is partly right:
rows accept different numbers of drafts in the same step (ragged rollback of both KV caches).
Prompts have different lengths, there are more prompts than running slots (continuous admission
while SD is on), budgets are small enough that ``max_new_tokens`` falls inside accepted runs,
and a frequent token is a stop token so that EOS lands inside accepted runs too.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from longtail_api.policies import SelectorSpec, SpeculativeSpec, StrategySpec
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.interface import GenerationRequest, GenerationResult
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
from longtail_workers.kvcache.slots import SlotAttention
from longtail_workers.warmstart.fit import collect_training_sequences, fit_drafter

VOCAB = 48


# conftest.py's ``target`` fixture builds this policy
TARGET = dict(seed=4, vocab_size=VOCAB, sharpness=30.0, dtype=torch.float64)


@pytest.fixture(scope="module")
def fitted_drafter(target: torch.nn.Module) -> EagleDrafter:
    # Fitted on the target's greedy answers to the test's own prompts: a random target's sampled
    # answers are nearly noise, and a drafter that accepts ~10% of drafts rarely lets a budget
    # or a stop token fall inside an accepted run, which this test must cover.
    requests = [GenerationRequest(p, max_new_tokens=30, temperature=0.0) for p in _prompts()]
    seqs = collect_training_sequences(
        TorchEngine(target, config=EngineConfig(max_running=32)), requests
    )
    drafter = EagleDrafter(target, target_id="tiny-greedy", seed=1)
    fit_drafter(drafter, seqs, steps=240, batch_size=16, seed=0)
    return drafter


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(42)
    return [torch.randint(0, VOCAB, (2 + (i * 7) % 19,), generator=gen).tolist() for i in range(20)]


def _requests(stop: tuple[int, ...]) -> list[GenerationRequest]:
    budgets = [1, 2, 3, 5, 7, 11, 24, 30]
    return [
        GenerationRequest(
            p,
            max_new_tokens=budgets[i % len(budgets)],
            temperature=0.0,
            stop_token_ids=stop,
            return_hidden_states=True,
            request_id=f"r{i}",
        )
        for i, p in enumerate(_prompts())
    ]


def _spec(threshold: int = 1024, warmup: int = 0, selector: str = "bandit") -> SpeculativeSpec:
    return SpeculativeSpec(
        enabled=True,
        batch_threshold=threshold,
        warmup_steps=warmup,
        strategies=[StrategySpec(draft_depth=d) for d in (2, 4, 6)],
        selector=SelectorSpec(type=selector, epsilon=0.2, buckets=[2, 4, 8, 16]),
    )


def _stop_token(target: torch.nn.Module) -> int:
    """A token that greedy outputs produce often, mid-sequence: EOS will land inside drafts."""
    runs = TorchEngine(target).generate(
        [GenerationRequest(p, max_new_tokens=30, temperature=0.0) for p in _prompts()]
    )
    counts = Counter(t for r in runs for t in r.output_token_ids[2:])
    return counts.most_common(1)[0][0]


def _assert_same(plain: list[GenerationResult], spec: list[GenerationResult]) -> None:
    for a, b in zip(plain, spec, strict=True):
        assert b.output_token_ids == a.output_token_ids, a.request_id
        assert b.finish_reason == a.finish_reason, a.request_id
        assert b.output_logprobs == pytest.approx(a.output_logprobs, abs=1e-9)
        assert a.hidden_states is not None and b.hidden_states is not None
        torch.testing.assert_close(b.hidden_states, a.hidden_states, rtol=0, atol=1e-9)


def test_greedy_sd_equals_plain_with_ragged_acceptance(target, fitted_drafter) -> None:
    stop = (_stop_token(target),)
    requests = _requests(stop)
    plain = TorchEngine(target, config=EngineConfig(max_running=6)).generate(requests)
    engine = TorchEngine(
        target,
        config=EngineConfig(max_running=6),
        speculative=_spec(),
        drafter=fitted_drafter,
    )
    spec = engine.generate(requests)
    _assert_same(plain, spec)
    # The scenario really covered what it claims.
    reasons = Counter(r.finish_reason for r in plain)
    assert reasons["stop"] >= 3 and reasons["length"] >= 3, reasons
    # Stop tokens and budgets fell inside accepted runs (tokens after them were discarded).
    assert engine.stats.sd_cut_by_stop > 0 and engine.stats.sd_cut_by_length > 0
    hist = engine.stats.accepted_length_hist
    assert engine.stats.sd_steps > 0
    assert len(hist) >= 3, f"acceptance lengths not ragged enough: {hist}"
    assert sum(c for n, c in hist.items() if n > 1) > 0
    accepted = [r.accepted_tokens / max(r.drafted_tokens, 1) for r in spec if r.spec_steps]
    assert len(set(accepted)) > 3


def test_greedy_sd_switching_on_mid_generation(target, fitted_drafter) -> None:
    """SD switches on when the batch shrinks: the drafter is re-prefilled from the survivors."""
    requests = _requests(stop=())
    plain = TorchEngine(target, config=EngineConfig(max_running=12)).generate(requests)
    engine = TorchEngine(
        target,
        config=EngineConfig(max_running=12),
        speculative=_spec(threshold=5, warmup=2),
        drafter=fitted_drafter,
    )
    spec = engine.generate(requests)
    _assert_same(plain, spec)
    assert engine.stats.plain_steps > 0 and engine.stats.sd_steps > 0
    assert engine.stats.accepted > 0


def test_greedy_sd_with_short_drafter_context(target, fitted_drafter) -> None:
    """A truncated drafter context only changes proposals, never the output."""
    requests = _requests(stop=())
    plain = TorchEngine(target, config=EngineConfig(max_running=20)).generate(requests)
    engine = TorchEngine(
        target,
        config=EngineConfig(max_running=20, drafter_context_window=3),
        speculative=_spec(threshold=8, warmup=1, selector="fixed"),
        drafter=fitted_drafter,
    )
    # Record what every drafter query may read: at most the W newest pairs, and the window
    # must actually slide (some query starts past the row's first response pair).
    sd = engine.sd
    assert sd is not None
    reads: list[int] = []
    starts: list[int] = []
    forward = sd.drafter.forward

    def recording(ids, hidden, pos, attention_mask=None, cache=None):  # type: ignore[no-untyped-def]
        assert isinstance(attention_mask, SlotAttention)
        reads.append(int((attention_mask.q_pos - attention_mask.lo).max()) + 1)
        starts.append(int(attention_mask.lo.max()))
        return forward(ids, hidden, pos, attention_mask=attention_mask, cache=cache)

    sd.drafter.forward = recording  # type: ignore[method-assign]
    try:
        _assert_same(plain, engine.generate(requests))
    finally:
        del sd.drafter.forward
    assert engine.stats.sd_steps > 0
    assert reads and max(reads) <= 3, reads
    assert max(starts) > max(len(r.prompt_token_ids) for r in plain)  # the window slid
    assert max(len(r.output_token_ids) for r in plain) > 4 * 3  # long enough to slide


def test_greedy_sd_matches_hf_generate(target, fitted_drafter) -> None:
    """An independent oracle: Hugging Face's own greedy generate."""
    engine = TorchEngine(target, speculative=_spec(), drafter=fitted_drafter)
    prompts = _prompts()[:3]
    results = engine.generate(
        [GenerationRequest(p, max_new_tokens=25, temperature=0.0) for p in prompts]
    )
    for prompt, result in zip(prompts, results, strict=True):
        ids = torch.tensor([prompt])
        out = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=25,
            pad_token_id=0,
        )
        assert result.output_token_ids == out[0, len(prompt) :].tolist()
    assert engine.stats.sd_steps > 0


def test_greedy_rows_stay_exact_in_a_batch_mixed_with_sampled_rows(target, fitted_drafter) -> None:
    greedy = _requests(stop=())
    mixed = [
        r if i % 2 == 0 else GenerationRequest(r.prompt_token_ids, 20, temperature=1.0, seed=i)
        for i, r in enumerate(greedy)
    ]
    plain = TorchEngine(target, config=EngineConfig(max_running=20)).generate(greedy)
    engine = TorchEngine(
        target, config=EngineConfig(max_running=20), speculative=_spec(), drafter=fitted_drafter
    )
    spec = engine.generate(mixed)
    for i in range(0, len(greedy), 2):
        assert spec[i].output_token_ids == plain[i].output_token_ids
    assert engine.stats.sd_steps > 0 and engine.stats.accepted > 0


def test_padded_batch_buckets_change_nothing(target, fitted_drafter) -> None:
    """Steps padded to batch buckets (what a CUDA engine replays) give the same output: the
    padding rows are inert and nothing they compute is read."""
    requests = _requests(stop=(_stop_token(target),))
    plain = TorchEngine(target, config=EngineConfig(max_running=6)).generate(requests)
    engine = TorchEngine(
        target,
        config=EngineConfig(max_running=6, batch_buckets=(1, 4, 8)),
        speculative=_spec(threshold=5, warmup=1),
        drafter=fitted_drafter,
    )
    _assert_same(plain, engine.generate(requests))
    assert engine.stats.sd_steps > 0 and engine.row_shape is not None
    # Batches of 2-3 rows ran as the 4-row bucket, 5 as the 6-row one (the capacity caps it).
    assert engine.row_shape.capacity == 6
