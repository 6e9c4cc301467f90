"""The harvested worker's one role state machine (``spot/harvested.py``).

A scripted harvestee and window cycle pin the machine itself: the harvestee's refusal is the
409, a refused start leaves the role as it was, a stop that does not finish in time is pending
(202) with ``drafter-train`` still observed, the candidate is submitted before the own activity
is reported, once per window, and :meth:`~HarvestedRole.reclaim` (the worker's own work
arriving) ends a window without any ``PUT /v1/role``. A real rollout worker (tiny Qwen2, real
spot trainer and directory registry) checks the same on its own hooks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from longtail_api.policies import DrafterTrainingSpec
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.registry import CandidateInfo, DrafterRegistry
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.rollout.control import RolloutWorker
from longtail_workers.spot.cycle import InvalidRoleError, RoleConflictError, WindowCycle
from longtail_workers.spot.harvested import HarvestedRole


@dataclass
class Script:
    """A harvestee whose hooks answer what the test says, and the cycle it submits through."""

    why: str | None = None
    stops: bool = True
    policy_version: int = 4
    now: float = 100.0
    events: list[str] = field(default_factory=list)
    role: HarvestedRole | None = None

    def refusal(self) -> str | None:
        return self.why

    def start_window(self) -> None:
        self.events.append("start")

    def stop_window(self, timeout_s: float) -> bool:
        self.events.append(f"stop {timeout_s:g}")
        return self.stops

    def submit(self, worker: str, policy_version: int, who: str) -> None:
        assert self.role is not None
        self.events.append(f"submit {worker} v{policy_version} {self.role.activity().observed}")


def scripted() -> tuple[Script, HarvestedRole]:
    script = Script()
    cycle: WindowCycle = script  # type: ignore[assignment]
    role = HarvestedRole(script, cycle, name="w0", own="rollout", who="a rollout worker",
                         switch_timeout_s=2.0, clock=lambda: script.now)  # fmt: skip
    script.role = role
    return script, role


def test_the_machine_on_a_scripted_harvestee() -> None:
    script, role = scripted()
    with pytest.raises(InvalidRoleError, match="unknown activity 'fly'"):
        role.set_role("fly")
    with pytest.raises(RoleConflictError, match="cannot take 'train'"):
        role.set_role("train")
    script.why = "no data yet"
    with pytest.raises(RoleConflictError, match="no data yet"):
        role.set_role("drafter-train")
    assert role.activity().desired == "rollout" and script.events == []
    script.why, script.now = None, 110.0
    ack = role.set_role("drafter-train")
    assert (ack.desired, ack.observed, ack.since, ack.pending) == (
        "drafter-train", "drafter-train", 110.0, False)  # fmt: skip
    again = role.set_role("drafter-train")  # repeated: acknowledged as is
    assert (again.observed, again.since) == ("drafter-train", 110.0) and script.events == ["start"]
    script.now, script.stops = 115.0, False
    ack = role.set_role("rollout")  # the stop does not finish in time: pending, still training
    assert (ack.desired, ack.observed, ack.pending) == ("rollout", "drafter-train", True)
    with pytest.raises(RoleConflictError, match="still stopping"):
        role.set_role("drafter-train")
    assert role.harvested_seconds == 5.0
    script.now, script.stops = 116.0, True
    assert role.set_role("rollout").observed == "rollout"  # the loop sends it again
    assert script.events == ["start", "stop 2", "stop 2", "submit w0 v4 drafter-train"]
    assert role.set_role("rollout").observed == "rollout" and len(script.events) == 4  # once
    assert role.harvested_seconds == 6.0 and role.activity().since == 116.0


def test_reclaim_ends_the_window_without_a_role_request() -> None:
    script, role = scripted()
    assert role.reclaim(1.0) and script.events == []  # in its own activity: nothing to end
    role.set_role("drafter-train")
    script.stops = False
    assert not role.reclaim(0.5)
    assert role.activity().observed == "drafter-train"
    script.stops = True
    assert role.reclaim(0.5)
    state = role.activity()
    assert state.desired == state.observed == "rollout"
    assert script.events == ["start", "stop 0.5", "stop 0.5", "submit w0 v4 drafter-train"]


def test_a_rollout_worker_submits_once_before_reporting_rollout(model, tmp_path: Path) -> None:
    """The loop ends a window and may send ``rollout`` again, and prompts may arrive too: the
    candidate is stored once, before the worker reports ``rollout`` (what the merge waits for)."""
    reg = DrafterRegistry(tmp_path)
    training = DrafterTrainingSpec(learning_rate=1e-3, window_tokens=16, max_steps_per_window=3)
    worker = RolloutWorker(TorchEngine(model), target_id="tiny", registry=reg, training=training)
    reqs = [GenerationRequest([1, 2, i], max_new_tokens=20, seed=i) for i in range(4)]
    worker.generate(reqs)
    worker.role.set_role("drafter-train")
    assert worker.trainer is not None
    worker.trainer.wait_stopped(30.0)  # max_steps_per_window reached: the window ended itself
    reported = []  # the worker's activity while its candidate is being stored
    store = reg.submit_candidate

    def submit(drafter: EagleDrafter, info: CandidateInfo):  # type: ignore[no-untyped-def]
        reported.append(worker.status().role.observed)
        return store(drafter, info)

    reg.submit_candidate = submit  # type: ignore[method-assign]
    assert worker.role.set_role("rollout").observed == "rollout"
    worker.role.set_role("rollout")
    worker.generate(reqs)
    assert reported == ["drafter-train"]
    assert len(list((tmp_path / "candidates" / "base-init").iterdir())) == 1  # stored once
