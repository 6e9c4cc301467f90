"""The engine with history and hybrid strategies: greedy output is unchanged, a job with no
learned drafter speculates from its first step, repeated answers are drafted whole, and the
learned drafter's cache stays exact across history steps (which never feed it).

The target and prompts are ``test_specdec_greedy.py``'s (float64, so batched and verify forwards
cannot flip a near-tie). GRPO-like groups: every prompt is asked several times in one call, with
different budgets and a frequent stop token, so history drafts are long and accepted runs are
cut by stops and budgets.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_drafter_pairs import _drafter_logits_from_pairs
from test_specdec_greedy import TARGET, _assert_same, _prompts, _stop_token

from longtail_api.policies import HistorySpec, SelectorSpec, SpeculativeSpec, StrategySpec
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.pairs import build_training_pairs
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.specdec import DraftTrace
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
from longtail_workers.engine.stats import StepRecord

__all__ = ["TARGET"]  # conftest.py's ``target`` fixture builds this policy

BUDGETS = [2, 5, 9, 13, 24, 30]


def _group_requests(stop: tuple[int, ...], group: int = 3) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            p,
            max_new_tokens=BUDGETS[(i + g) % len(BUDGETS)],
            temperature=0.0,
            stop_token_ids=stop,
            return_hidden_states=True,
            request_id=f"r{i}.{g}",
        )
        for i, p in enumerate(_prompts()[:10])
        for g in range(group)
    ]


def _spec(*strategies: tuple[str, int], selector: str = "bandit", **kw: object) -> SpeculativeSpec:
    return SpeculativeSpec(
        enabled=True,
        batch_threshold=int(kw.pop("threshold", 1024)),  # type: ignore[call-overload]
        warmup_steps=int(kw.pop("warmup", 0)),  # type: ignore[call-overload]
        strategies=[StrategySpec(draft_depth=d, drafter=k) for k, d in strategies],  # type: ignore[arg-type]
        selector=SelectorSpec(type=selector, epsilon=0.3, buckets=[2, 4, 8, 16]),  # type: ignore[arg-type]
        history=HistorySpec(min_match=2, hybrid_min_match=3),
    )


def _steps(engine: TorchEngine) -> list[StepRecord]:
    """Every step record the engine books from now on."""
    steps: list[StepRecord] = []
    record = engine.stats.record
    engine.stats.record = lambda s: (steps.append(s), record(s))[1]  # type: ignore[method-assign]
    return steps


def test_greedy_with_history_and_hybrid_strategies_equals_plain(target) -> None:
    stop = (_stop_token(target),)
    requests = _group_requests(stop)
    plain = TorchEngine(target, config=EngineConfig(max_running=8)).generate(requests)
    spec = _spec(("learned", 3), ("history", 4), ("hybrid", 4), ("history", 2))
    engine = TorchEngine(
        target,
        config=EngineConfig(max_running=8),
        speculative=spec,
        drafter=EagleDrafter(target, target_id="tiny-history-greedy", seed=1),
    )
    steps = _steps(engine)
    _assert_same(plain, engine.generate(requests))  # groups drafting from each other
    _assert_same(plain, engine.generate(requests))  # and from the earlier call's answers
    st = engine.stats
    assert st.source_sd_tokens["history"] > 0 and st.source_sd_tokens["learned"] > 0
    assert any(s.source_tokens.keys() == {"history", "learned"} for s in steps)  # hybrid rows
    assert st.sd_cut_by_stop > 0 and st.sd_cut_by_length > 0
    assert max(st.source_accepted_hist["history"]) >= 4
    reasons = Counter(r.finish_reason for r in plain)
    assert reasons["stop"] >= 3 and reasons["length"] >= 3, reasons


def test_no_drafter_speculates_with_history_from_the_first_step(target) -> None:
    requests = _group_requests(stop=(), group=4)
    plain = TorchEngine(target, config=EngineConfig(max_running=40)).generate(requests)
    engine = TorchEngine(
        target, config=EngineConfig(max_running=40), speculative=_spec(("history", 6))
    )
    assert engine.sd is None and engine.speculating
    steps = _steps(engine)
    _assert_same(plain, engine.generate(requests))
    assert next(s.mode for s in steps if s.mode != "prefill") == "sd"  # no drafter needed
    assert engine.row_shape is not None and not engine.row_shape.drafter  # no drafter cache
    first = engine.stats.source_accepted_hist["history"].copy()
    engine.stats.reset()
    _assert_same(plain, engine.generate(requests))
    # The same answers again (an earlier step's, and the group's): drafted whole.
    assert engine.stats.source_mean_accepted_length("history") > 4.0
    assert sum(n * c for n, c in first.items()) > sum(first.values())  # > 1 on the first call


def test_strategies_that_need_a_learned_drafter_wait_for_one(target) -> None:
    with pytest.raises(ValueError, match="drafter: history"):
        TorchEngine(target, speculative=_spec(("learned", 2), ("hybrid", 2)))
    engine = TorchEngine(target, speculative=_spec(("learned", 2), ("hybrid", 2), ("history", 2)))
    requests = _group_requests(stop=())
    engine.generate(requests)
    assert set(engine.stats.source_sd_tokens) == {"history"}  # learned and hybrid skipped
    engine.set_drafter(EagleDrafter(target, target_id="tiny-history-later", seed=2))
    engine.generate(requests)
    assert engine.stats.source_sd_tokens["learned"] > 0


def test_learned_drafts_stay_exact_after_history_steps(target) -> None:
    """History steps never feed the drafter: the next learned step catches it up first, and its
    draft logits are still the drafter's output on the training pairs of each context."""
    traces: list[DraftTrace] = []
    drafter = EagleDrafter(target, target_id="tiny-history-pairs", seed=3)
    spec = _spec(("learned", 2), ("history", 3), ("hybrid", 2), selector="bandit")
    spec.selector.epsilon = 0.6
    engine = TorchEngine(
        target,
        config=EngineConfig(max_running=6),
        speculative=spec,
        drafter=drafter,
        draft_observer=traces.append,
    )
    assert engine.sd is not None
    catch_ups: list[int] = []
    catch_up = engine.sd.catch_up
    engine.sd.catch_up = lambda rows, shape: (catch_ups.append(1), catch_up(rows, shape))[1]  # type: ignore[method-assign]
    reqs = [
        GenerationRequest(p, max_new_tokens=16, temperature=1.0, seed=i)
        for i, p in enumerate(_prompts()[:6] * 2)
    ]
    engine.generate(reqs)
    assert catch_ups, "no learned step followed history steps"
    assert engine.stats.source_sd_tokens["history"] > 0
    checked = 0
    for trace in traces:
        for row, context in enumerate(trace.contexts):
            first = trace.prompt_lengths[row] - 1
            drafts = trace.drafts[row, :-1].tolist()
            expected = _drafter_logits_from_pairs(
                target, drafter, context, first, build_training_pairs, drafts
            )
            torch.testing.assert_close(trace.draft_logits[row], expected, rtol=0, atol=1e-9)
            checked += 1
    assert checked >= 20


def test_clear_on_new_policy_forgets_earlier_steps(target) -> None:
    for clear in (False, True):
        spec = _spec(("history", 2))
        spec.history.clear_on_new_policy = clear
        engine = TorchEngine(target, speculative=spec)
        engine.generate(_group_requests(stop=(), group=1))
        assert engine.history is not None and engine.history.prompts == 10
        engine.policy_loaded()  # the rollout worker loaded a new policy version
        assert engine.history.prompts == (0 if clear else 10)
