"""THE pairing convention between tokens, target hidden states and drafter inputs/targets.

Used by every drafter trainer (offline ``fit.py``, the online spot trainer) to turn captured
rollouts into training examples; the rollout engine's draft step follows the same convention
(``engine/native/specdec.py``), and ``tests/unit/workers/drafter/test_drafter_pairs.py``
checks the two agree.

Convention (EAGLE's). Let ``x_0 .. x_{N-1}`` be tokens and ``h_t`` the target's last-layer hidden
state (post final norm) at position ``t``, i.e. after reading ``x_0 .. x_t``; ``lm_head(h_t)``
predicts ``x_{t+1}``. Then for ``t = 0 .. N-2``::

    drafter input  at position t :  (embedding of x_{t+1},  h_t)
    drafter target at position t :  h_{t+1}  (soft target softmax(lm_head(h_{t+1})) ~ x_{t+2})

So the drafter sees the token the target just produced together with the state that produced it,
and predicts the state one step ahead. At draft time the engine feeds (x_N, h_{N-1}) for the
newest committed token x_N; the drafter's output ``f`` stands in for ``h_N`` and
``lm_head(f)`` proposes ``x_{N+1}``. Deeper draft steps feed ``(d, f)`` with the drafter's own
previous feature in place of the unavailable target state.

Context (what the drafter attends over): the **response** pairs only, from pair ``P-1`` =
``(y_0, h_{P-1})`` on, for a prompt of P tokens. Trainers build exactly those pairs
(``sequence_from_result`` starts at ``x_{P-1}``; ``spot/windows.py`` windows start there) and the
engine's drafter cache holds the same ones (``engine/native/specdec.py``); the prompt reaches the
drafter only through the target states ``h_t``. Feeding the prompt's pairs too, which the drafter
never saw in training, cost much of the long-tail speedup (docs/performance.md), and would make
every switch-on re-read the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class DrafterInputs:
    """Drafter inputs for the pairs of one sequence (leading batch dims allowed)."""

    input_ids: torch.Tensor
    """``[..., N-1]`` token ``x_{t+1}`` per pair."""
    hidden: torch.Tensor
    """``[..., N-1, H]`` target state ``h_t`` per pair."""
    position_ids: torch.Tensor
    """``[..., N-1]`` absolute position ``t`` of each pair."""


@dataclass
class DrafterTargets:
    """What the drafter should output for each pair."""

    hidden: torch.Tensor
    """``[..., N-1, H]`` the next target state ``h_{t+1}``; the soft next-token target is
    ``softmax(lm_head(hidden))``."""


def build_training_pairs(
    tokens: torch.Tensor, hidden: torch.Tensor, start_position: int = 0
) -> tuple[DrafterInputs, DrafterTargets]:
    """Pairs of the module's convention from ``tokens`` ``[..., N]`` and ``hidden`` ``[..., N, H]``.

    ``hidden[..., t, :]`` must be the target state after reading ``tokens[..., t]`` and
    ``start_position`` the absolute position of ``tokens[..., 0]``.
    """
    n = tokens.shape[-1]
    if hidden.shape[:-1] != tokens.shape:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} must be tokens {tuple(tokens.shape)} plus a hidden "
            "dimension: one state per token"
        )
    if n < 2:
        raise ValueError(f"need at least 2 tokens to make a pair, got {n}")
    positions = torch.arange(n - 1, device=tokens.device) + start_position
    positions = positions.expand(*tokens.shape[:-1], n - 1)
    inputs = DrafterInputs(
        input_ids=tokens[..., 1:],
        hidden=hidden[..., :-1, :],
        position_ids=positions,
    )
    return inputs, DrafterTargets(hidden=hidden[..., 1:, :])


def sequence_from_result(
    prompt_token_ids: Sequence[int], output_token_ids: Sequence[int], hidden_states: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Align an engine result with the convention: ``(tokens [T], hidden [T, H], start)``.

    The engine returns, per output token ``y_i``, the state that produced it (the state at the
    previous token). So state ``i`` belongs to token ``[x_{P-1}, y_0, .., y_{T-2}][i]``, at absolute
    position ``P - 1 + i``; the last output token has no state (it was never fed back).
    """
    if hidden_states.shape[0] != len(output_token_ids):
        raise ValueError(
            f"hidden_states has {hidden_states.shape[0]} rows for {len(output_token_ids)} output "
            "tokens; generate with return_hidden_states=True"
        )
    p = len(prompt_token_ids)
    aligned = [int(prompt_token_ids[-1]), *[int(t) for t in output_token_ids[:-1]]]
    tokens = torch.tensor(aligned, dtype=torch.long, device=hidden_states.device)
    return tokens, hidden_states, p - 1
