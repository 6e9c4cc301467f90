"""The simulator's drafter kinds on hand-computed cases: what a history, learned or hybrid step
costs and gains, the learned drafter's catch-up after history steps, and ``--drafter``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_sim_step import DECODE_S, DRAFT_S, VERIFY_S, flat_profile, shape

from longtail_api.policies import DrafterKind, SelectorSpec, SpeculativeSpec, StrategySpec
from longtail_api.profile import EngineProfile, StepPoint
from longtail_workers.sim.drafters import HistoryAcceptance, history_acceptance
from longtail_workers.sim.latency import DEFAULT_PROPOSE_S, LatencyModel
from longtail_workers.sim.step import simulate_step

PROPOSE_S = 0.001
HISTORY_STEP_S = 0.05
EXAMPLE_01 = Path(__file__).parents[4] / "examples" / "01-tiny-arith.yaml"


def history_profile(**kw: object) -> EngineProfile:
    """The flat profile with a measured history-only step and per-row proposal cost."""
    fields: dict[str, object] = dict(
        history_speculative=[StepPoint(1, 0, 3, HISTORY_STEP_S)],
        history_propose=[StepPoint(1, 0, 2, PROPOSE_S)],
    )  # fmt: skip
    fields.update(kw)
    return dataclasses.replace(flat_profile(), **fields)  # type: ignore[arg-type]


def one_kind(kind: DrafterKind, threshold: int, depth: int = 2) -> SpeculativeSpec:
    return SpeculativeSpec(
        batch_threshold=threshold,
        warmup_steps=0,
        strategies=[StrategySpec(draft_depth=depth, drafter=kind)],
        selector=SelectorSpec(type="fixed"),
    )


def test_a_history_step_costs_the_verify_and_the_proposals_and_no_drafter_forward() -> None:
    # As test_sd_switches_on_when_running_batch_reaches_threshold, drafted from history at
    # accepted length 3: C and D take 6 steps of the history-only step plus 2 rows' proposals,
    # no draft steps, and the drafter reading 100 tokens/s is never charged (it does not run).
    acceptance = HistoryAcceptance(accepted_length=3.0)
    s = shape(speculative=one_kind("history", 2), history=acceptance)
    profile = history_profile(drafter_catch_up_tokens_per_s=100.0)
    r = simulate_step(s, [1, 2, 20, 20], profile)
    assert (r.workers[0].decode_steps, r.workers[0].speculative_steps) == (1, 6)
    assert r.rollout_s == pytest.approx(DECODE_S + 6 * (HISTORY_STEP_S + 2 * PROPOSE_S))
    # A profile without the history step (written before it): the speculative step less its
    # draft steps (here the verify alone), and the default proposal cost.
    r = simulate_step(s, [1, 2, 20, 20], flat_profile())
    assert r.rollout_s == pytest.approx(DECODE_S + 6 * (VERIFY_S + 2 * DEFAULT_PROPOSE_S))


def test_a_learned_step_after_history_steps_pays_the_catch_up() -> None:
    # Two rows of 30 tokens, SD on from the first decode step, a bandit over (learned, history)
    # that tries each once, then keeps the learned one (history steps cost more here). Step 1,
    # learned: the drafter reads both rows' first token (2 tokens); step 2, history: both rows
    # gain 3, which the drafter does not read; step 3, learned: it reads those 6 first. Then 7
    # more learned steps, nothing more to read.
    spec = SpeculativeSpec(
        batch_threshold=2, warmup_steps=0,
        strategies=[StrategySpec(draft_depth=2), StrategySpec(draft_depth=2, drafter="history")],
        selector=SelectorSpec(type="bandit", epsilon=0.0),
    )  # fmt: skip
    s = shape(group=2, max_running=2, speculative=spec, accepted_length=3.0,
              history=HistoryAcceptance(accepted_length=3.0))  # fmt: skip
    slow = history_profile(history_speculative=[StepPoint(1, 0, 3, 0.5)])
    free = simulate_step(s, [30, 30], slow)
    paid = simulate_step(
        s, [30, 30], dataclasses.replace(slow, drafter_catch_up_tokens_per_s=100.0)
    )
    assert paid.workers[0].speculative_steps == free.workers[0].speculative_steps == 10
    learned = 2 * DRAFT_S + VERIFY_S
    assert free.rollout_s == pytest.approx(9 * learned + 0.5 + 2 * PROPOSE_S)
    assert paid.rollout_s - free.rollout_s == pytest.approx((2 + 6) / 100.0)


@pytest.mark.parametrize("with_profile", [False, True])
def test_hybrid_sits_between_learned_and_history(with_profile: bool) -> None:
    # One answer of 25 tokens at depth 4: learned rows gain 4 a step (6 steps), history rows
    # 1.5 (16 steps); hybrid takes history for half of its rows at 2 and gains 3 (8 steps), each
    # step the learned one plus the row's proposal.
    acceptance = HistoryAcceptance(accepted_length=1.5, hybrid_share=0.5, hybrid_accepted_length=2)
    profile = history_profile() if with_profile else flat_profile()
    propose = PROPOSE_S if with_profile else DEFAULT_PROPOSE_S
    runs = {
        kind: simulate_step(
            shape(
                group=1,
                speculative=one_kind(kind, 1, depth=4),
                accepted_length=4.0,
                history=acceptance,
            ),
            [25],
            profile,
        )
        for kind in ("learned", "hybrid", "history")
    }
    steps = {kind: r.workers[0].speculative_steps for kind, r in runs.items()}
    assert steps == {"learned": 6, "hybrid": 8, "history": 16}
    learned = 4 * DRAFT_S + VERIFY_S
    assert runs["learned"].rollout_s == pytest.approx(6 * learned)
    assert runs["hybrid"].rollout_s == pytest.approx(8 * (learned + propose))


def test_history_figures_come_from_the_caller_then_the_profile_then_the_defaults() -> None:
    defaults, notes = history_acceptance(flat_profile())
    assert defaults == HistoryAcceptance() and len(notes) == 2
    profile = dataclasses.replace(
        flat_profile(), accepted_length={"learned": 3.0, "history": 1.9},
        hybrid_history_share=0.4, hybrid_history_accepted_length=2.2,
    )  # fmt: skip
    got, notes = history_acceptance(profile)
    assert (got, notes) == (HistoryAcceptance(1.9, 0.4, 2.2), [])
    got, _ = history_acceptance(profile, accepted_length=1.2, hybrid_share=0.1)
    assert (got.accepted_length, got.hybrid_share) == (1.2, 0.1)
    with pytest.raises(ValueError, match="share"):
        HistoryAcceptance(hybrid_share=1.5)


def test_latency_of_each_kind() -> None:
    model = LatencyModel(history_profile())
    spec = 2 * DRAFT_S + VERIFY_S
    assert model.speculative_step_s("learned", 3, 0, 2) == pytest.approx(spec)
    assert model.speculative_step_s("hybrid", 3, 0, 2) == pytest.approx(spec + 3 * PROPOSE_S)
    assert model.speculative_step_s("history", 3, 0, 2) == pytest.approx(
        HISTORY_STEP_S + 3 * PROPOSE_S
    )


def test_simulate_cli_projects_each_drafter_kind(capsys: pytest.CaptureFixture[str]) -> None:
    from longtail_workers.sim.main import main

    args = [str(EXAMPLE_01), "--roofline", "Qwen2-0.5B", "--lengths", "lognormal:median=8"]
    assert main([*args, "--drafter", "all"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "baseline" in line)
    assert header.split() == ["baseline", "learned", "history", "hybrid"]
    for kind in ("learned", "history", "hybrid"):
        assert f"projected speedup, {kind}" in out
    assert "history drafter: accepted length 1.6" in out  # the roofline records none
    with pytest.raises(SystemExit):
        main([*args, "--drafter", "tree"])
    assert "give all or one or more of learned, history, hybrid" in capsys.readouterr().err
