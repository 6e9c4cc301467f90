"""Exact output distributions and Pearson's chi-square: the losslessness checks of SD engines.

Imported by ``test_specdec_sampling.py`` (torch engine) and ``test_vllm_engine.py`` (vLLM). For
a tiny vocabulary the exact distribution of the first few generated tokens is computed by
enumerating every continuation with direct (uncached) target forwards and the torch engine's
definition of the sampling distribution (``sampling_probs``: temperature, then top-p).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import torch

from longtail_workers.engine.sampling import sampling_probs

Z_ALPHA = 3.719  # standard normal upper quantile for alpha = 1e-4


def exact_distribution(
    model: torch.nn.Module,
    prompt: Sequence[int],
    n_tokens: int,
    temperature: float,
    top_p: float,
    stop: int | None,
) -> dict[tuple[int, ...], float]:
    """P(continuation) for every continuation of ``prompt`` of ``n_tokens`` (shorter if it
    hits ``stop``)."""
    vocab = int(model.get_output_embeddings().out_features)
    done: dict[tuple[int, ...], float] = {}
    frontier: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n_tokens):
        prefixes = list(frontier)
        ids = torch.tensor([list(prompt) + list(p) for p in prefixes])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, -1:, :].double()  # [M, 1, V]
        m = len(prefixes)
        probs = sampling_probs(
            logits,
            torch.full((m,), temperature, dtype=torch.float64),
            torch.full((m,), top_p, dtype=torch.float64),
        )[:, 0]
        nxt: dict[tuple[int, ...], float] = {}
        for row, prefix in enumerate(prefixes):
            for tok in range(vocab):
                pr = frontier[prefix] * float(probs[row, tok])
                if pr == 0.0:
                    continue
                seq = (*prefix, tok)
                (done if tok == stop else nxt)[seq] = pr
        frontier = nxt
    done.update(frontier)
    return done


def chi_square(
    observed: Counter[tuple[int, ...]], exact: dict[tuple[int, ...], float], n: int
) -> tuple[float, float, int]:
    """(statistic, critical value at alpha 1e-4, df); cells with expected < 5 pooled into one.
    The critical value uses the Wilson-Hilferty approximation."""
    unknown = [seq for seq in observed if seq not in exact]
    assert not unknown, f"engine produced impossible continuations {unknown[:5]}"
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for seq, pr in exact.items():
        expected = n * pr
        if expected < 5:
            pooled_obs += observed.get(seq, 0)
            pooled_exp += expected
            continue
        stat += (observed.get(seq, 0) - expected) ** 2 / expected
        cells += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    df = cells - 1
    crit = df * (1 - 2 / (9 * df) + Z_ALPHA * math.sqrt(2 / (9 * df))) ** 3
    return stat, crit, df
