"""The acceptance-collapse rule shared by the trainer, ``longtail run`` and the operator."""

from __future__ import annotations

from longtail_api.acceptance import acceptance_collapsed


def test_a_drafter_that_worked_and_now_accepts_nothing_has_collapsed() -> None:
    assert acceptance_collapsed([1.6, 2.1, 1.0, 1.0, 1.02])
    assert acceptance_collapsed([2.0, None, 1.0, 0.0, 1.0, 1.05])  # steps without SD skipped


def test_a_fresh_drafter_or_a_dip_is_not_a_collapse() -> None:
    assert not acceptance_collapsed([1.0, 1.02, 1.0, 1.05, 1.08])  # never worked yet: learning
    assert not acceptance_collapsed([2.0, 1.0, 1.0])  # too few steps to tell
    assert not acceptance_collapsed([2.0, 1.0, 1.0, 1.3])  # it recovered
    assert not acceptance_collapsed([])
