"""Pure reconcile planning: phases, conditions, failures/backoff, suspend, deadline, TTL, events."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from optest import NOW, all_pods, example, observed, pod, spec_of

from longtail_api.status import Condition, RLJobStatus, RoleStatus
from longtail_api.workerapi import TrainerStatus
from longtail_operator.derive import plan
from longtail_operator.model import HarvestSnapshot, Plan
from longtail_operator.observe import PodView, rfc3339
from longtail_operator.settings import Settings

SETTINGS = Settings(network_policy=False)
"""The job's NetworkPolicies are test_access.py's: here the operator manages none."""


def conds(p: Plan) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in p.status.conditions}


def reasons(p: Plan) -> list[str]:
    return [e.reason for e in p.events]


def created_pods(p: Plan) -> list[str]:
    return sorted(m["metadata"]["name"] for m in p.create if m["kind"] == "Pod")


def test_new_job_creates_everything_and_is_initializing() -> None:
    p = plan(observed(example(), []), SETTINGS)
    assert created_pods(p) == [
        "tiny-rollout-0",
        "tiny-rollout-1",
        "tiny-trainer-0",
        "tiny-verifier-0",
    ]
    kinds = sorted(m["kind"] for m in p.create if m["kind"] != "Pod")
    # Services exist already in the helper's observation; the ConfigMap does not.
    assert kinds == ["ConfigMap"]
    assert p.status.phase == "Initializing" and p.status.observed_generation == 2
    assert p.status.start_time == rfc3339(NOW) and p.status.total_steps == 20
    assert conds(p)["RolloutReady"] == ("False", "ReplicasNotReady")
    assert "CreatedPods" in reasons(p) and "JobInitializing" in reasons(p)
    assert not p.delete_pods


def test_all_ready_is_running_and_nothing_to_do() -> None:
    manifest = example()
    spec = spec_of(manifest)
    cm = plan(observed(manifest, []), SETTINGS).create
    data = next(m for m in cm if m["kind"] == "ConfigMap")["data"]
    first = plan(observed(manifest, all_pods(spec), configmap=data), SETTINGS)
    assert first.status.phase == "Running" and not first.create and not first.delete_pods
    assert conds(first)["TrainerReady"] == ("True", "AllReplicasReady")
    assert first.status.roles["rollout"] == RoleStatus(ready=2, total=2, failed=0)
    # Level-triggered: the same observation again plans the same status and no events.
    again = plan(
        observed(manifest, all_pods(spec), configmap=data, previous=first.status), SETTINGS
    )
    assert again.status == first.status and again.events == [] and not again.create


def test_invalid_spec_sets_condition_and_touches_nothing() -> None:
    manifest = example(rollout={"replicas": 0})
    running = all_pods(spec_of(example()))
    previous = RLJobStatus(phase="Running")
    p = plan(observed(manifest, running, previous=previous), SETTINGS)
    assert p.create == [] and p.delete_pods == [] and p.delete_objects == []
    assert p.status.phase == "Running"
    [cond] = [c for c in p.status.conditions if c.type == "ValidationFailed"]
    assert cond.status == "True" and cond.reason == "InvalidSpec"
    assert "spec.rollout.replicas: must be >= 1, got 0" in cond.message
    assert [e.type for e in p.events] == ["Warning"] and reasons(p) == ["InvalidSpec"]
    # Fixing the spec flips the condition to False (and says so once).
    fixed = plan(observed(example(), running, previous=p.status), SETTINGS)
    assert conds(fixed)["ValidationFailed"] == ("False", "SpecValid")


def test_scale_up_and_down() -> None:
    spec = spec_of(example())
    pods = all_pods(spec)
    up = plan(observed(example(rollout={"replicas": 4}), pods), SETTINGS)
    assert created_pods(up) == ["tiny-rollout-2", "tiny-rollout-3"] and not up.delete_pods
    down = plan(observed(example(rollout={"replicas": 1}), pods), SETTINGS)
    assert down.delete_pods == ["tiny-rollout-1"] and not created_pods(down)
    assert down.status.roles["rollout"].total == 1


def test_failed_pod_recreated_until_backoff_limit_then_failed() -> None:
    manifest = example(backoffLimit=1)
    spec = spec_of(manifest)
    pods = [p for p in all_pods(spec) if p.name != "tiny-rollout-1"]
    failed = pod("rollout", 1, phase="Failed", uid="a")
    first = plan(observed(manifest, [*pods, failed]), SETTINGS)
    assert first.delete_pods == ["tiny-rollout-1"] and first.counted == ["a"]
    assert first.status.roles["rollout"].failed == 1 and first.status.phase != "Failed"
    assert "WorkerFailed" in reasons(first)
    # Same failed pod seen again before its deletion shows: not counted twice.
    again = plan(
        observed(manifest, [*pods, failed], previous=first.status, counted=frozenset({"a"})),
        SETTINGS,
    )
    assert again.status.roles["rollout"].failed == 1 and again.counted == []
    # Gone: recreated.
    gone = plan(observed(manifest, pods, previous=first.status), SETTINGS)
    assert created_pods(gone) == ["tiny-rollout-1"]
    # A second failure exceeds backoffLimit=1: Failed, every pod deleted, nothing created.
    second = plan(
        observed(
            manifest, [*pods, pod("rollout", 1, phase="Failed", uid="b")], previous=gone.status
        ),
        SETTINGS,
    )
    assert second.status.phase == "Failed" and not second.create
    assert conds(second)["Failed"] == ("True", "BackoffLimitExceeded")
    assert sorted(second.delete_pods) == sorted(p.name for p in [*pods, pod("rollout", 1)])
    assert second.status.completion_time == rfc3339(NOW)
    assert "JobFailed" in reasons(second)
    # Finished is sticky: a later reconcile creates nothing.
    later = plan(observed(manifest, [], previous=second.status), SETTINGS)
    assert later.status.phase == "Failed" and not later.create


def test_suspend_checkpoints_then_deletes_and_resume_recreates() -> None:
    spec = spec_of(example())
    pods = all_pods(spec)
    running = RLJobStatus(phase="Running", start_time=rfc3339(NOW))
    p = plan(observed(example(suspend=True), pods, previous=running), SETTINGS)
    assert p.checkpoint and sorted(p.delete_pods) == sorted(q.name for q in pods)
    assert p.status.phase == "Suspended" and p.status.start_time is None
    assert conds(p)["Suspended"] == ("True", "JobSuspended")
    assert conds(p)["RolloutReady"] == ("False", "JobSuspended")
    assert p.status.gpus.total == 0
    idle = plan(observed(example(suspend=True), [], previous=p.status), SETTINGS)
    assert not created_pods(idle) and not idle.checkpoint and idle.status.phase == "Suspended"
    resumed = plan(observed(example(suspend=False), [], previous=idle.status), SETTINGS)
    assert len(created_pods(resumed)) == 4 and resumed.status.phase == "Initializing"
    assert conds(resumed)["Suspended"] == ("False", "JobResumed")
    assert "JobResumed" in reasons(resumed)


def test_deadline_and_trainer_outcomes() -> None:
    manifest = example(activeDeadlineSeconds=60)
    pods = all_pods(spec_of(manifest))
    started = RLJobStatus(phase="Running", start_time=rfc3339(NOW - timedelta(seconds=61)))
    p = plan(observed(manifest, pods, previous=started), SETTINGS)
    assert p.status.phase == "Failed" and conds(p)["Failed"] == ("True", "DeadlineExceeded")
    t = TrainerStatus(20, 20, "complete", 20, 5, reward_mean=0.5, accepted_length=3.5)
    done = plan(observed(example(), pods, trainer=t), SETTINGS)
    assert done.status.phase == "Succeeded" and conds(done)["Complete"][0] == "True"
    assert done.status.step == 20 and done.status.reward_mean == 0.5
    assert done.status.drafter.version == 5 and done.status.drafter.acceptance_length == 3.5
    bad = dataclasses.replace(t, phase="failed", message="NaN loss")
    failed = plan(observed(example(), pods, trainer=bad), SETTINGS)
    assert conds(failed)["Failed"] == ("True", "TrainerFailed")
    assert "NaN loss" in next(c.message for c in failed.status.conditions if c.type == "Failed")


def test_ttl_after_finished_cleans_children() -> None:
    manifest = example(ttlSecondsAfterFinished=30)
    finished = RLJobStatus(
        phase="Succeeded",
        completion_time=rfc3339(NOW - timedelta(seconds=31)),
        conditions=[Condition("Complete", "True", "TrainingComplete", rfc3339(NOW))],
    )
    p = plan(observed(manifest, [], previous=finished, configmap={"x": "y"}), SETTINGS)
    kinds = sorted(k.kind for k in p.delete_objects)
    assert kinds == ["ConfigMap", "Service", "Service", "Service"]
    assert "CleanedUp" in reasons(p)
    early = dataclasses.replace(finished, completion_time=rfc3339(NOW - timedelta(seconds=5)))
    assert plan(observed(manifest, [], previous=early), SETTINGS).delete_objects == []


def test_harvest_snapshot_lands_in_status() -> None:
    manifest = example(rollout={"replicas": 2, "resources": {"gpus": 1}})
    spec = spec_of(manifest)
    from longtail_api.status import WorkerStatus

    snap = HarvestSnapshot(
        workers=(
            WorkerStatus("tiny-rollout-0", "rollout", "drafter-train", "drafter-train"),
            WorkerStatus("tiny-rollout-1", "rollout", "rollout", "rollout"),
        ),
        idle_gpus=0,
        harvested_gpus=1,
        harvested_gpu_seconds=12.5,
        training_workers=1,
    )
    p = plan(observed(manifest, all_pods(spec), harvest=snap), SETTINGS)
    assert p.status.gpus.total == 2 and p.status.gpus.harvested == 1
    assert p.status.gpus.harvested_gpu_seconds == 12.5
    assert p.status.workers[0].observed_role == "drafter-train"
    assert conds(p)["DrafterTraining"] == ("True", "IdleGpusHarvested")
    pending = dataclasses.replace(snap, unacknowledged=("tiny-rollout-1",))
    p2 = plan(observed(manifest, all_pods(spec), harvest=pending), SETTINGS)
    assert conds(p2)["DrafterTraining"] == ("False", "RoleSwitchUnacknowledged")


def test_a_failed_pods_last_log_lines_go_into_the_worker_failed_event() -> None:
    manifest = example()
    spec = spec_of(manifest)
    traceback = "\n".join(f"  line {i}" for i in range(200)) + "\nRuntimeError: CUDA out of memory"
    raw = {
        "metadata": {
            "name": "tiny-rollout-1",
            "uid": "f1",
            "labels": {"longtail.dev/role": "rollout", "longtail.dev/replica-index": "1"},
        },
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "worker",
                    "state": {
                        "terminated": {"exitCode": 1, "reason": "Error", "message": traceback}
                    },
                }
            ],
        },
    }
    failed = PodView.from_pod(raw)
    assert failed is not None
    pods = [p for p in all_pods(spec) if p.name != "tiny-rollout-1"]
    p = plan(observed(manifest, [*pods, failed]), SETTINGS)
    [event] = [e for e in p.events if e.reason == "WorkerFailed"]
    assert event.type == "Warning" and p.delete_pods == ["tiny-rollout-1"]
    assert event.message.startswith("pod tiny-rollout-1 failed: container worker exited 1 Error")
    assert event.message.endswith("RuntimeError: CUDA out of memory")  # the tail is kept
    assert len(event.message) < 1700 and "line 0\n" not in event.message


def test_unreachable_workers_condition_follows_the_harvest_snapshot() -> None:
    manifest = example()
    spec = spec_of(manifest)
    lost = HarvestSnapshot(unreachable=("tiny-rollout-1: ConnectionRefusedError: refused",))
    p = plan(observed(manifest, all_pods(spec), harvest=lost), SETTINGS)
    [c] = [c for c in p.status.conditions if c.type == "WorkersUnreachable"]
    assert (c.status, c.reason) == ("True", "WorkersUnreachable")
    assert c.message == (
        "1 worker(s) fail their status polls: tiny-rollout-1: ConnectionRefusedError: refused"
    )
    [event] = [e for e in p.events if e.reason == "WorkersUnreachable"]
    assert event.type == "Warning" and "tiny-rollout-1" in event.message
    back = plan(
        observed(manifest, all_pods(spec), harvest=HarvestSnapshot(), previous=p.status),
        SETTINGS,
    )
    assert conds(back)["WorkersUnreachable"] == ("False", "WorkersAnswer")
    done = dataclasses.replace(back.status, phase="Succeeded")
    finished = plan(observed(manifest, [], previous=done), SETTINGS)
    assert conds(finished)["WorkersUnreachable"] == ("False", "JobNotRunning")
    # No harvest loop (harvest disabled) and never shown: no condition at all.
    quiet = plan(observed(manifest, all_pods(spec)), SETTINGS)
    assert "WorkersUnreachable" not in conds(quiet)


def test_idleness_unavailable_condition_follows_the_prometheus_source() -> None:
    manifest = example()
    spec = spec_of(manifest)
    down = HarvestSnapshot(
        source="prometheus", source_error="Prometheus query failed: <urlopen error refused>"
    )
    p = plan(observed(manifest, all_pods(spec), harvest=down), SETTINGS)
    [c] = [c for c in p.status.conditions if c.type == "IdlenessUnavailable"]
    assert (c.status, c.reason) == ("True", "IdlenessSourceFailing")
    assert "refused" in c.message and "no GPU is harvested" in c.message
    [event] = [e for e in p.events if e.reason == "IdlenessSourceFailing"]
    assert event.type == "Warning"
    back = HarvestSnapshot(source="prometheus")
    again = plan(observed(manifest, all_pods(spec), harvest=back, previous=p.status), SETTINGS)
    assert conds(again)["IdlenessUnavailable"] == ("False", "IdlenessRead")
    # The workers' own reports: no such condition (they fail one by one: WorkersUnreachable).
    workers = plan(observed(manifest, all_pods(spec), harvest=HarvestSnapshot()), SETTINGS)
    assert "IdlenessUnavailable" not in conds(workers)


def test_a_restarted_operator_changes_nothing_and_loses_nothing() -> None:
    """Operator killed and restarted: its memory (counted failures, the harvester) is gone; the
    plan from the stored status and the live pods creates and deletes nothing, keeps the failure
    count and the harvested GPU-seconds (runtime.py seeds a new harvester from the status)."""
    manifest = example(rollout={"replicas": 2, "resources": {"gpus": 1}})
    spec = spec_of(manifest)
    data = next(
        m for m in plan(observed(manifest, []), SETTINGS).create if m["kind"] == "ConfigMap"
    )
    pods = [p for p in all_pods(spec) if p.name != "tiny-rollout-1"]
    kw = {"configmap": data["data"]}
    failed = plan(
        observed(manifest, [*pods, pod("rollout", 1, phase="Failed", uid="a")], **kw), SETTINGS
    )
    snap = HarvestSnapshot(harvested_gpu_seconds=12.5)
    ran = plan(
        observed(manifest, all_pods(spec), previous=failed.status, harvest=snap, **kw), SETTINGS
    )
    assert ran.status.phase == "Running" and ran.status.roles["rollout"].failed == 1
    fresh = HarvestSnapshot(harvested_gpu_seconds=ran.status.gpus.harvested_gpu_seconds)
    after = plan(
        observed(manifest, all_pods(spec), previous=ran.status, harvest=fresh, **kw), SETTINGS
    )
    assert not after.create and not after.delete_pods and not after.delete_objects
    assert after.status.phase == "Running" and after.status.roles["rollout"].failed == 1
    assert after.status.gpus.harvested_gpu_seconds == 12.5
    assert [e for e in after.events if e.type == "Warning"] == []


def test_a_collapsed_acceptance_is_a_condition_until_speculation_works_again() -> None:
    manifest = example()
    pods = all_pods(spec_of(manifest))
    t = TrainerStatus(7, 20, "running", 7, 3, accepted_length=1.0, acceptance_collapsed=True)
    p = plan(observed(manifest, pods, trainer=t), SETTINGS)
    assert conds(p)["AcceptanceCollapsed"] == ("True", "DrafterStale")
    [event] = [e for e in p.events if e.reason == "DrafterStale"]
    assert event.type == "Warning" and "no longer matches the policy" in event.message
    silent = plan(observed(manifest, pods, trainer=None, previous=p.status), SETTINGS)
    assert conds(silent)["AcceptanceCollapsed"] == ("True", "DrafterStale")  # kept, not dropped
    healthy = dataclasses.replace(t, accepted_length=2.5, acceptance_collapsed=False)
    back = plan(observed(manifest, pods, trainer=healthy, previous=p.status), SETTINGS)
    assert conds(back)["AcceptanceCollapsed"] == ("False", "DrafterAccepted")
    never = plan(observed(manifest, pods, trainer=healthy), SETTINGS)
    assert "AcceptanceCollapsed" not in conds(never)
