"""Elastic rollout (``spec.rollout.minReplicas``, ``elastic.py``): the rollout pods a job runs
with (Kueue's partial admission), which lost pods count against ``backoffLimit``, the status of
a shrink, and a job below its minimum past the grace (checkpoint, quota given back)."""

from __future__ import annotations

import copy
import dataclasses
from datetime import timedelta
from typing import Any

from optest import NOW, all_pods, example, observed, pod, spec_of

from longtail_api.status import RLJobStatus, RolloutCapacityStatus
from longtail_operator import kueue
from longtail_operator.derive import plan
from longtail_operator.model import Plan
from longtail_operator.observe import PodView, rfc3339
from longtail_operator.settings import Settings

SETTINGS = Settings()
ELASTIC = {"rollout__replicas": 3, "rollout__minReplicas": 2}
RUNNING = RLJobStatus(phase="Running", start_time=rfc3339(NOW))


def running(ready: int, since: str | None = None) -> RLJobStatus:
    """A running elastic job's previous status with ``ready`` rollout workers."""
    st = copy.deepcopy(RUNNING)
    st.rollout = RolloutCapacityStatus(
        desired=3, min_replicas=2, ready=ready, below_min_since=since
    )
    return st


def queued(manifest: dict[str, Any], pods: list[PodView], workload: Any = None, **kw: Any) -> Any:
    return observed(manifest, pods, queue="team-a", kueue_served=True, workload=workload, **kw)


def admitted(raw: dict[str, Any], rollouts: int) -> kueue.View:
    """``raw`` as Kueue leaves it after admitting ``rollouts`` of its rollout podSet."""
    obj = copy.deepcopy(raw)
    assign = [
        {"name": ps["name"], "flavors": {}, "count": rollouts if ps["name"] == "rollout" else 1}
        for ps in obj["spec"]["podSets"]
    ]
    obj["status"] = {
        "admission": {"clusterQueue": "cq", "podSetAssignments": assign},
        "conditions": [{"type": "Admitted", "status": "True"}],
    }
    return kueue.view(obj, {})


def made_pods(p: Plan) -> list[str]:
    return sorted(m["metadata"]["name"] for m in p.bodies("create", "Pod"))


def conditions(p: Plan) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in p.status.conditions}


def test_the_workload_asks_for_partial_admission_and_runs_with_what_kueue_admitted() -> None:
    manifest = example(**ELASTIC)
    fixed = next(m for m in plan(queued(example(), []), SETTINGS).create if m["kind"] == "Workload")
    assert all("minCount" not in ps for ps in fixed["spec"]["podSets"])  # unchanged without it
    raw = next(m for m in plan(queued(manifest, []), SETTINGS).create if m["kind"] == "Workload")
    sets = {ps["name"]: ps for ps in raw["spec"]["podSets"]}
    assert (sets["rollout"]["count"], sets["rollout"]["minCount"]) == (3, 2)
    assert all("minCount" not in ps for n, ps in sets.items() if n != "rollout")
    two = plan(queued(manifest, [], admitted(raw, 2)), SETTINGS)
    assert made_pods(two) == [
        "tiny-rollout-0",
        "tiny-rollout-1",
        "tiny-trainer-0",
        "tiny-verifier-0",
    ]
    assert two.status.rollout is not None and two.status.rollout.admitted == 2
    up = [pod("trainer", 0), pod("verifier", 0), pod("rollout", 0), pod("rollout", 1)]
    ran = plan(queued(manifest, up, admitted(raw, 2), previous=running(2)), SETTINGS)
    assert ran.status.phase == "Running"  # two of three is enough: minReplicas 2
    assert conditions(ran)["RolloutCapacity"] == ("True", "MinReplicasReady")
    assert ran.status.roles["rollout"].total == 3 and ran.status.rollout.ready == 2  # type: ignore[union-attr]
    more = plan(queued(manifest, up, admitted(raw, 3), previous=ran.status), SETTINGS)
    assert made_pods(more) == ["tiny-rollout-2"]  # Kueue admitted more: the new pod joins
    assert more.status.phase == "Running"


def test_an_evicted_or_deleted_rollout_pod_shrinks_the_job_uncharged_a_crash_is_charged() -> None:
    manifest = example(**ELASTIC)
    spec = spec_of(manifest)
    pods = all_pods(spec)
    known = frozenset((q.name, q.uid) for q in pods if q.role == "rollout")
    evicted = dataclasses.replace(pods[-1], phase="Failed", ready=False, disruption="Evicted")
    gone = [q for q in pods if q.name != "tiny-rollout-1"]
    shrink = plan(observed(manifest, gone, previous=running(3), known=known), SETTINGS)
    assert made_pods(shrink) == ["tiny-rollout-1"]  # made again: Pending until there is room
    assert shrink.status.roles["rollout"].failed == 0 and shrink.status.phase == "Running"
    last = shrink.status.rollout.last_shrink  # type: ignore[union-attr]
    assert last is not None and (last.reason, last.pods) == ("PodDeleted", ["tiny-rollout-1"])
    assert [e.reason for e in shrink.events if e.reason == "RolloutShrunk"] == ["RolloutShrunk"]
    kicked = plan(observed(manifest, [*pods[:-1], evicted], previous=running(3)), SETTINGS)
    assert kicked.status.roles["rollout"].failed == 0 and evicted.uid in kicked.counted
    assert evicted.name in kicked.delete_pods
    crashed = dataclasses.replace(evicted, disruption=None)
    crash = plan(observed(manifest, [*pods[:-1], crashed], previous=running(3)), SETTINGS)
    assert crash.status.roles["rollout"].failed == 1  # crashed by itself: charged
    fixed = example()
    fixed_pods = [*all_pods(spec_of(fixed))[:-1], evicted]
    unchanged = plan(observed(fixed, fixed_pods, previous=RUNNING), SETTINGS)
    assert unchanged.status.roles["rollout"].failed == 1  # no minReplicas: as before
    assert unchanged.status.rollout is None and "RolloutCapacity" not in conditions(unchanged)


def test_below_the_minimum_past_the_grace_checkpoints_and_with_kueue_gives_the_quota_back() -> None:
    manifest = example(**ELASTIC, rollout__belowMinGraceSeconds=60)
    spec = spec_of(manifest)
    one = [q for q in all_pods(spec) if q.name not in ("tiny-rollout-1", "tiny-rollout-2")]
    drop = plan(observed(manifest, one, previous=running(3)), SETTINGS)
    assert drop.status.rollout is not None
    assert drop.status.rollout.below_min_since == rfc3339(NOW) and not drop.checkpoint
    assert conditions(drop)["RolloutCapacity"] == ("False", "BelowMinReplicas")
    late = running(1, rfc3339(NOW - timedelta(seconds=61)))
    waits = plan(observed(manifest, one, previous=late), SETTINGS)
    assert waits.checkpoint and waits.checkpoint_reason == "below-min"
    assert not waits.delete_pods and waits.status.phase != "Queued"  # no Kueue: waits for room
    raw = next(m for m in plan(queued(manifest, []), SETTINGS).create if m["kind"] == "Workload")
    w = admitted(raw, 3)
    stop = plan(queued(manifest, one, w, previous=late), SETTINGS)
    assert stop.status.phase == "Queued" and conditions(stop)["Queued"][1] == "BelowMinReplicas"
    assert stop.checkpoint and stop.checkpoint_reason == "below-min"
    assert sorted(stop.delete_pods) == sorted(q.name for q in one) and not stop.patches
    assert stop.status.rollout is not None and stop.status.rollout.below_min_since is not None
    released = plan(queued(manifest, [], w, previous=stop.status), SETTINGS)
    [(_, plural, patch, status)] = released.patches
    assert (plural, status) == ("workloads", True) and patch["status"]["admission"] is None
    requeued = admitted(raw, 0)
    requeued.raw["status"] = {}
    again = plan(
        queued(manifest, [], kueue.view(requeued.raw, {}), previous=released.status), SETTINGS
    )
    assert (
        again.status.phase == "Queued" and conditions(again)["Queued"][1] == "WaitingForAdmission"
    )
    assert again.status.rollout is not None and again.status.rollout.below_min_since is None
    back = plan(queued(manifest, [], w, previous=again.status), SETTINGS)
    assert len(made_pods(back)) == 5  # admitted again: every pod made, the clock not running
