"""The adaptive SD policy: threshold/warm-up latch, buckets, fixed selector, bandit, validation."""

from __future__ import annotations

import random

import pytest

from longtail_api.policies import SelectorSpec, SpeculativeSpec, StrategySpec
from longtail_workers.engine.sd_policy import SpecDecodePolicy


def _spec(**kwargs) -> SpeculativeSpec:
    selector = kwargs.pop("selector", SelectorSpec())
    strategies = kwargs.pop("strategies", [StrategySpec(draft_depth=d) for d in (2, 4, 6)])
    return SpeculativeSpec(strategies=strategies, selector=selector, **kwargs)


def test_latch_turns_on_after_warmup_and_off_when_batch_grows() -> None:
    policy = SpecDecodePolicy(_spec(batch_threshold=4, warmup_steps=3))
    assert [policy.observe(n) for n in (10, 8, 5)] == [False, False, False]  # above threshold
    assert [policy.observe(n) for n in (4, 4, 3)] == [False, False, False]  # warming up
    assert policy.observe(3) is True  # 4th consecutive step at/below the threshold
    assert [policy.observe(n) for n in (4, 2, 1)] == [True, True, True]  # latched
    assert policy.observe(5) is False  # admission refilled the batch: off at once
    assert [policy.observe(n) for n in (4, 4, 4)] == [False, False, False]  # warm-up restarts
    assert policy.observe(4) is True


def test_warmup_interrupted_restarts_count() -> None:
    policy = SpecDecodePolicy(_spec(batch_threshold=4, warmup_steps=2))
    assert [policy.observe(n) for n in (3, 5, 3, 3, 3)] == [False, False, False, False, True]


def test_zero_warmup_reset_and_disabled() -> None:
    policy = SpecDecodePolicy(_spec(batch_threshold=4, warmup_steps=0))
    assert policy.observe(4) is True
    policy.reset()
    assert policy.active is False
    assert policy.observe(1) is True
    off = SpecDecodePolicy(_spec(enabled=False, batch_threshold=4, warmup_steps=0))
    assert [off.observe(n) for n in (1, 1, 1)] == [False, False, False]


def test_buckets_are_upper_bounds_and_overflow_uses_last() -> None:
    policy = SpecDecodePolicy(_spec(selector=SelectorSpec(buckets=[1, 2, 4, 8])))
    assert [policy.bucket_of(n) for n in (1, 2, 3, 4, 5, 8, 9, 100)] == [0, 1, 2, 2, 3, 3, 3, 3]


def test_fixed_selector() -> None:
    policy = SpecDecodePolicy(_spec(selector=SelectorSpec(type="fixed", fixed_index=2)))
    choices = {policy.choose(n).draft_depth for n in (1, 3, 30)}
    assert choices == {6}


def _run_bandit(policy: SpecDecodePolicy, running: int, speed: dict[int, float], steps: int):
    """Synthetic environment: strategy i yields speed[i] tokens/s (+-10% noise)."""
    noise = random.Random(0)
    picks = []
    for _ in range(steps):
        choice = policy.choose(running)
        picks.append(choice.strategy)
        rate = speed[choice.strategy] * noise.uniform(0.9, 1.1)
        policy.record(choice, emitted_tokens=rate * 0.01, latency_s=0.01)
    return picks


def test_bandit_converges_to_the_fastest_arm_per_bucket() -> None:
    sel = SelectorSpec(type="bandit", epsilon=0.1, window=20, buckets=[1, 8, 32])
    policy = SpecDecodePolicy(_spec(selector=sel), seed=1)
    # bs=1 prefers deep drafts, bs=32 shallow ones (TLT's measured preference).
    small = _run_bandit(policy, 1, {0: 100.0, 1: 150.0, 2: 220.0}, 300)
    large = _run_bandit(policy, 32, {0: 900.0, 1: 700.0, 2: 500.0}, 300)
    assert small[:3] == [0, 1, 2] and large[:3] == [0, 1, 2]  # each arm tried first
    assert small[-100:].count(2) >= 85
    assert large[-100:].count(0) >= 85
    means0 = policy.mean_rewards(0)
    assert means0[2] is not None and means0[2] > max(m for m in means0[:2] if m is not None)


def test_bandit_follows_a_change_through_its_window() -> None:
    sel = SelectorSpec(type="bandit", epsilon=0.2, window=10, buckets=[4])
    policy = SpecDecodePolicy(_spec(selector=sel), seed=3)
    _run_bandit(policy, 2, {0: 300.0, 1: 100.0, 2: 100.0}, 150)
    after = _run_bandit(policy, 2, {0: 100.0, 1: 100.0, 2: 400.0}, 300)  # drafter improved
    assert after[-100:].count(2) >= 80


def test_bandit_is_reproducible_with_a_seed() -> None:
    sel = SelectorSpec(type="bandit", epsilon=0.5, window=5)
    speeds = {0: 1.0, 1: 1.1, 2: 1.2}
    a = _run_bandit(SpecDecodePolicy(_spec(selector=sel), seed=9), 3, speeds, 60)
    b = _run_bandit(SpecDecodePolicy(_spec(selector=sel), seed=9), 3, speeds, 60)
    assert a == b


def test_record_returns_tokens_per_second() -> None:
    policy = SpecDecodePolicy(_spec())
    choice = policy.choose(2)
    assert policy.record(choice, emitted_tokens=30, latency_s=0.5) == pytest.approx(60.0)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        (_spec(selector=SelectorSpec(buckets=[4, 2])), "strictly increasing"),
        (_spec(selector=SelectorSpec(type="fixed", fixed_index=5)), "fixedIndex=5"),
        (_spec(strategies=[StrategySpec(draft_depth=4, verify_tokens=8)]), "tree drafting"),
    ],
)
def test_invalid_specs_name_the_field(spec, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        SpecDecodePolicy(spec)


def test_without_a_learned_drafter_only_history_strategies_are_picked() -> None:
    kinds = ["learned", "history", "hybrid", "history"]
    strategies = [StrategySpec(draft_depth=2 + i, drafter=k) for i, k in enumerate(kinds)]
    policy = SpecDecodePolicy(_spec(strategies=strategies, selector=SelectorSpec(epsilon=0.5)))
    assert policy.eligible(learned=True) == [0, 1, 2, 3]
    assert policy.eligible(learned=False) == [1, 3]
    picked = set()
    for _ in range(60):
        choice = policy.choose(2, learned=False)
        assert choice is not None and choice.drafter == "history"
        picked.add(choice.strategy)
        policy.record(choice, emitted_tokens=choice.draft_depth, latency_s=0.01)
    assert picked == {1, 3}
    # With a drafter every strategy competes; the choice names what drafts and how deep.
    tried = []
    for _ in range(2):  # the untried ones first
        choice = policy.choose(2)
        assert choice is not None
        tried.append((choice.strategy, choice.drafter, choice.draft_depth))
        policy.record(choice, emitted_tokens=1, latency_s=0.01)
    assert tried == [(0, "learned", 2), (2, "hybrid", 4)]
    fixed = SpecDecodePolicy(_spec(strategies=strategies, selector=SelectorSpec(type="fixed")))
    assert fixed.eligible(learned=False) == [] and fixed.choose(1, learned=False) is None


def test_history_match_bounds_are_checked() -> None:
    spec = _spec()
    spec.history.min_match, spec.history.max_match = 8, 4
    with pytest.raises(ValueError, match="maxMatch=4 is below minMatch=8"):
        SpecDecodePolicy(spec)


def test_policy_module_needs_no_torch() -> None:
    import ast
    from pathlib import Path

    import longtail_workers.engine.sd_policy as mod

    tree = ast.parse(Path(mod.__file__).read_text())
    imported = {
        (n.module or "") if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in (n.names if isinstance(n, ast.Import) else [n])
    }
    assert not any(name.split(".")[0] in {"torch", "numpy", "transformers"} for name in imported)
