"""When speculative decoding has collapsed: one rule for the trainer, ``longtail run`` and the
operator.

A drafter that stops matching the policy (NaN weights that slipped through, a policy that moved
away from it) leaves speculation running at an accepted length of ~1: every verify pass keeps
only the policy's own token, so rollout pays the drafting for nothing. The trainer evaluates
:func:`acceptance_collapsed` over its per-step mean accepted lengths (``trainer/driver.py``) and
reports it in its status; ``longtail run`` shows it in the live line and the summary, and the
operator as the ``AcceptanceCollapsed`` condition. The Prometheus alert
``LongtailAcceptanceCollapsed`` is the cluster-side equivalent over a time window.
"""

from __future__ import annotations

from collections.abc import Sequence

COLLAPSED_BELOW = 1.1
"""Mean accepted length (accepted drafts + 1 per verify step) under which a step accepted
almost nothing."""
HEALTHY_AT = 1.3
"""An earlier step at or above this shows the drafter once worked: a fresh drafter that has not
learnt yet is not a collapse."""
STEPS = 3
"""Consecutive speculating steps below :data:`COLLAPSED_BELOW` that make a collapse."""


def acceptance_collapsed(lengths: Sequence[float | None]) -> bool:
    """Whether the last :data:`STEPS` steps that speculated all accepted almost nothing after
    an earlier step had worked; ``lengths`` is the per-step mean accepted length, oldest first,
    None or 0 for a step without speculation (those are skipped)."""
    speculated = [x for x in lengths if x]
    if len(speculated) <= STEPS:
        return False
    earlier, recent = speculated[:-STEPS], speculated[-STEPS:]
    return max(earlier) >= HEALTHY_AT and all(x < COLLAPSED_BELOW for x in recent)
