"""The pure harvest decision shared by the operator and local mode."""

from __future__ import annotations

import pytest

from longtail_api.harvest import (
    WorkerView,
    decide,
    default_activity,
    desired_activity,
    is_idle_utilization,
)
from longtail_api.policies import HarvestSpec

SPEC = HarvestSpec(idle_seconds=2.0, eligible_roles=["rollout"])


def rollout(
    name: str, idle: float | None, assigned: str = "rollout", pending: bool = False
) -> WorkerView:
    return WorkerView(name, "rollout", assigned, idle, pending)  # type: ignore[arg-type]


def test_idle_long_enough_is_harvested_only_during_rollout() -> None:
    workers = [rollout("a", 3.0), rollout("b", 1.0), rollout("c", None)]
    assert decide(SPEC, True, workers) == {"a": "drafter-train"}
    assert decide(SPEC, False, workers) == {}


def test_threshold_is_inclusive() -> None:
    assert decide(SPEC, True, [rollout("a", 2.0)]) == {"a": "drafter-train"}


def test_harvested_worker_stays_until_rollout_ends_then_returns() -> None:
    harvested = rollout("a", None, assigned="drafter-train")  # busy training: not idle
    assert decide(SPEC, True, [harvested]) == {}
    assert decide(SPEC, False, [harvested]) == {"a": "rollout"}


def test_pending_work_wins_back_a_harvested_worker() -> None:
    w = rollout("a", 10.0, assigned="drafter-train", pending=True)
    assert decide(SPEC, True, [w]) == {"a": "rollout"}
    assert decide(SPEC, True, [rollout("b", 10.0, pending=True)]) == {}


def test_disabled_harvest_returns_everyone_home() -> None:
    off = HarvestSpec(enabled=False)
    assert decide(off, True, [rollout("a", 99.0, assigned="drafter-train")]) == {"a": "rollout"}
    assert decide(off, True, [rollout("b", 99.0)]) == {}


def test_only_eligible_roles_are_harvested() -> None:
    trainer = WorkerView("t", "trainer", "train", 30.0)
    verifier = WorkerView("v", "verifier", "verify", 30.0)
    assert decide(SPEC, True, [trainer, verifier]) == {}
    both = HarvestSpec(idle_seconds=2.0, eligible_roles=["rollout", "trainer"])
    assert decide(both, True, [trainer, verifier]) == {"t": "drafter-train"}
    assert (
        desired_activity(both, False, WorkerView("t", "trainer", "drafter-train", None)) == "train"
    )


def test_a_decision_already_assigned_is_not_returned_again() -> None:
    w = rollout("a", 5.0)
    first = decide(SPEC, True, [w])
    assert first == {"a": "drafter-train"}
    assigned = WorkerView("a", "rollout", first["a"], 6.0)
    assert decide(SPEC, True, [assigned]) == {}


def test_utilization_threshold_and_roles() -> None:
    assert is_idle_utilization(SPEC, 10.0) and not is_idle_utilization(SPEC, 10.5)
    assert not is_idle_utilization(SPEC, None)
    assert default_activity("drafter") == "drafter-train"
    with pytest.raises(ValueError, match="unknown worker role 'gpu'; known roles: rollout"):
        default_activity("gpu")
