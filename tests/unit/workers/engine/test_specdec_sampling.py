"""Speculative sampling is lossless: SD output is distributed exactly as the target's sampling.

For a tiny vocabulary the exact distribution of the first few generated tokens is computed by
enumerating every continuation with direct (uncached) target forwards and the engine's own
definition of the sampling distribution (``sampling_probs``: temperature, then top-p). 20k
sequences (seeds 0..19999, in calls of :data:`CALL` requests) are generated with SD forced on
from the first decode step, and their empirical distribution is compared with the exact one by
Pearson's chi-square test (cells with expected count < 5 pooled; critical value from the
Wilson-Hilferty approximation at alpha = 1e-4). The same check must FAIL for deliberately
broken acceptance rules plugged into the engine: that shows the test has the power to catch a
lossy engine.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
import torch
from helpers import fixed_sd
from lossless import chi_square, exact_distribution
from tiny_targets import tiny_qwen2

from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
from longtail_workers.engine.rejection import AcceptanceRule, Verdict, rejection_sample
from longtail_workers.engine.sampling import sample_from_probs

VOCAB = 8
PROMPT = [1, 2, 3]
SAMPLES = 20_000
CALL = 2_000
"""Requests per ``generate`` call. Each request is seeded, so the samples (and the chi-square
statistics) are those of one call of all :data:`SAMPLES`, which costs many times more: the
scheduler's prefill grouping is quadratic in the batch and the KV buffers get a row each."""


def _target() -> torch.nn.Module:
    return tiny_qwen2(
        seed=11,
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_heads=4,
        num_kv_heads=2,
        sharpness=12.0,
        dtype=torch.float64,
    )


def _sd_samples(
    model: torch.nn.Module,
    *,
    n_tokens: int,
    depth: int,
    temperature: float,
    top_p: float,
    stop: int | None,
    rule: AcceptanceRule = rejection_sample,
) -> tuple[Counter[tuple[int, ...]], TorchEngine]:
    spec = fixed_sd(depth=depth, threshold=65536)
    drafter = EagleDrafter(model, target_id="tiny-sampling", seed=5)
    engine = TorchEngine(
        model,
        config=EngineConfig(max_running=CALL, max_prefill_tokens=10 * CALL),
        speculative=spec,
        drafter=drafter,
        acceptance_rule=rule,
    )
    stops: Sequence[int] = () if stop is None else (stop,)
    requests = [
        GenerationRequest(
            PROMPT,
            max_new_tokens=n_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=i,
            stop_token_ids=stops,
        )
        for i in range(SAMPLES)
    ]
    results = [r for i in range(0, SAMPLES, CALL) for r in engine.generate(requests[i : i + CALL])]
    return Counter(tuple(r.output_token_ids) for r in results), engine


def _accept_always(p, q, drafts, u_accept, u_next) -> Verdict:
    """Broken: every draft is accepted (output follows the drafter, not the target)."""
    b, k = drafts.shape
    bonus = sample_from_probs(p[:, k : k + 1], u_next[:, k : k + 1]).squeeze(1)
    return Verdict(torch.full((b,), k, dtype=torch.long), bonus)


def _resample_from_p(p, q, drafts, u_accept, u_next) -> Verdict:
    """Broken: on rejection resample from p instead of norm(max(0, p - q))."""
    b, k = drafts.shape
    px = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)
    qx = q.gather(-1, drafts[..., None]).squeeze(-1)
    accepted = torch.cumprod((u_accept * qx < px).long(), dim=1).sum(1)
    rows = torch.arange(b)
    nxt = sample_from_probs(p[rows, accepted][:, None], u_next[rows, accepted][:, None])
    return Verdict(accepted, nxt.squeeze(1))


CASES = {
    # temperature 1, no top-p, k=2: paths reject@1, accept1+reject@2, accept both + bonus.
    "t1-k2": dict(n_tokens=4, depth=2, temperature=1.0, top_p=1.0, stop=None),
    # temperature and top-p processing on both p and q, deeper drafts, and a stop token that
    # ends sequences inside accepted runs.
    "t0.7-p0.9-k3-stop": dict(n_tokens=4, depth=3, temperature=0.7, top_p=0.9, stop=0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sd_sampling_matches_target_distribution(case: str) -> None:
    torch.set_num_threads(1)
    cfg = CASES[case]
    model = _target()
    exact = exact_distribution(
        model, PROMPT, cfg["n_tokens"], cfg["temperature"], cfg["top_p"], cfg["stop"]
    )
    observed, engine = _sd_samples(model, **cfg)
    # SD really ran, with both acceptances and rejections (otherwise the test proves little).
    assert engine.stats.sd_steps > 0
    assert 0.05 < engine.stats.acceptance_rate < 0.95, engine.stats.snapshot()
    stat, crit, df = chi_square(observed, exact, SAMPLES)
    assert stat < crit, f"chi-square {stat:.1f} >= {crit:.1f} (df={df}): SD is not lossless"


@pytest.mark.parametrize(
    "rule", [_accept_always, _resample_from_p], ids=["accept-always", "resample-p"]
)
def test_broken_acceptance_rules_are_caught(rule: AcceptanceRule) -> None:
    torch.set_num_threads(1)
    cfg = CASES["t1-k2"]
    model = _target()
    exact = exact_distribution(
        model, PROMPT, cfg["n_tokens"], cfg["temperature"], cfg["top_p"], cfg["stop"]
    )
    observed, _ = _sd_samples(model, rule=rule, **cfg)
    stat, crit, _ = chi_square(observed, exact, SAMPLES)
    assert stat > crit, f"broken rule passed the check: chi-square {stat:.1f} < {crit:.1f}"
