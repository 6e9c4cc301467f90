"""Deterministic drafts are lossless: SD with the history drafter samples exactly the target.

The exact distribution of the first tokens (``lossless.py``) against the engine's output by
Pearson's chi-square, as ``test_specdec_sampling.py`` does for the learned drafter, with the same
tiny target and prompt. Token 1 is sampled at prefill; SD is on from the first decode step, so
tokens 2+ come out of speculative steps whose drafts are the history's: a first call fills the
index (an earlier RL step's answers to the same prompt), then every row of the counted call also
drafts from the answers of its group still being generated. A hybrid case mixes, in the same
steps, rows drafted from history with rows drafted by a (random) learned drafter, and greedy
rows of another prompt that must stay token-identical to plain decoding. A rule that resamples
from ``p`` on rejection (instead of ``p`` without the draft) must fail the same check.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from lossless import chi_square, exact_distribution
from test_specdec_sampling import PROMPT, _resample_from_p, _target

from longtail_api.policies import HistorySpec, SelectorSpec, SpeculativeSpec, StrategySpec
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
from longtail_workers.engine.rejection import AcceptanceRule, rejection_sample
from longtail_workers.engine.stats import StepRecord

SAMPLES = 6000
WARM = 300
"""Answers of the earlier call that fills the index."""
GREEDY_PROMPT = [4, 5, 6, 7]


def _engine(
    model: torch.nn.Module, drafter: str, depth: int, rule: AcceptanceRule, learned: bool
) -> TorchEngine:
    spec = SpeculativeSpec(
        enabled=True,
        batch_threshold=65536,
        warmup_steps=0,
        strategies=[StrategySpec(draft_depth=depth, drafter=drafter)],  # type: ignore[arg-type]
        selector=SelectorSpec(type="fixed"),
        history=HistorySpec(min_match=2, hybrid_min_match=6),
    )
    return TorchEngine(
        model,
        config=EngineConfig(max_running=SAMPLES + 64, max_prefill_tokens=20 * SAMPLES),
        speculative=spec,
        drafter=EagleDrafter(model, target_id="tiny-history", seed=5) if learned else None,
        acceptance_rule=rule,
    )


def _requests(n: int, seed0: int, **sampling: object) -> list[GenerationRequest]:
    return [GenerationRequest(PROMPT, seed=seed0 + i, **sampling) for i in range(n)]  # type: ignore[arg-type]


def _sample(
    model: torch.nn.Module, cfg: dict, rule: AcceptanceRule = rejection_sample
) -> tuple[Counter[tuple[int, ...]], TorchEngine, list[StepRecord]]:
    drafter, depth, greedy = cfg["drafter"], cfg["depth"], cfg.get("greedy", 0)
    engine = _engine(model, drafter, depth, rule, learned=drafter != "history")
    sampling = dict(
        max_new_tokens=cfg["n_tokens"],
        temperature=cfg["temperature"],
        top_p=cfg["top_p"],
        stop_token_ids=() if cfg["stop"] is None else (cfg["stop"],),
    )
    engine.generate(_requests(WARM, 10**6, **sampling))  # an earlier step's answers
    steps: list[StepRecord] = []
    record = engine.stats.record
    engine.stats.record = lambda s: (steps.append(s), record(s))[1]  # type: ignore[method-assign]
    greedy_reqs = [GenerationRequest(GREEDY_PROMPT, 6, temperature=0.0)] * greedy
    results = engine.generate(_requests(SAMPLES, 0, **sampling) + greedy_reqs)
    if greedy:
        plain = TorchEngine(model).generate(greedy_reqs[:1])[0].output_token_ids
        assert all(r.output_token_ids == plain for r in results[SAMPLES:])
    return Counter(tuple(r.output_token_ids) for r in results[:SAMPLES]), engine, steps


CASES = {
    "t1-k2": dict(n_tokens=4, depth=2, temperature=1.0, top_p=1.0, stop=None, drafter="history"),
    # Temperature and top-p: history drafts outside the nucleus have p = 0 (always rejected);
    # a stop token ends sequences inside accepted runs.
    "t0.7-p0.9-k3-stop": dict(
        n_tokens=4, depth=3, temperature=0.7, top_p=0.9, stop=0, drafter="history"
    ),
    # One hybrid step holds history rows, learned rows and greedy rows of another prompt.
    "hybrid-mixed": dict(
        n_tokens=5, depth=2, temperature=1.0, top_p=1.0, stop=None, drafter="hybrid", greedy=8
    ),
}


def _exact(model: torch.nn.Module, cfg: dict) -> dict[tuple[int, ...], float]:
    return exact_distribution(
        model, PROMPT, cfg["n_tokens"], cfg["temperature"], cfg["top_p"], cfg["stop"]
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_history_drafts_sample_the_target_distribution(case: str) -> None:
    torch.set_num_threads(1)
    cfg = CASES[case]
    model = _target()
    observed, engine, steps = _sample(model, cfg)
    st = engine.stats
    assert st.sd_steps > 0 and st.sd_tokens > st.tokens // 2
    hist = st.source_accepted_hist["history"]
    # History drafts were really proposed, accepted and rejected (else the test proves little).
    assert hist[1] > 100 and sum(c for n, c in hist.items() if n > 1) > 100, dict(hist)
    if cfg["drafter"] == "hybrid":
        mixed = [s for s in steps if s.source_tokens.keys() == {"history", "learned"}]
        assert mixed, "no hybrid step drafted rows from both sources"
    stat, crit, df = chi_square(observed, _exact(model, cfg), SAMPLES)
    assert stat < crit, f"chi-square {stat:.1f} >= {crit:.1f} (df={df}): history SD is lossy"


def test_a_wrong_residual_for_history_drafts_is_caught() -> None:
    torch.set_num_threads(1)
    cfg = CASES["t1-k2"]
    model = _target()
    observed, _, _ = _sample(model, cfg, rule=_resample_from_p)
    stat, crit, _ = chi_square(observed, _exact(model, cfg), SAMPLES)
    assert stat > crit, f"the wrong residual passed: chi-square {stat:.1f} < {crit:.1f}"
