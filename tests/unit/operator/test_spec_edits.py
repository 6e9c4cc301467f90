"""Edits of a running RLJob, in the pure planner (issue #32, items 2-4).

Item 2: a frozen field (``longtail_api.mutability``) changed while the job runs is refused with
``SpecAccepted`` False/``ImmutableFieldChanged``; pods are still made (and the ConfigMap kept)
from the last accepted spec, so the job is never mixed; the edit's live fields apply; with
``suspend`` the change waits for the pods to go and then applies to every pod. Item 3: an
invalid edit keeps the job managed under the last accepted spec (a failed pod is replaced) with
a true status. Item 4: failing a job for ``backoffLimit`` asks the running trainer for a
checkpoint first. The same against the real control plane: ``tests/integration/
test_operator_edits.py``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import yaml
from optest import JOB, NOW, all_pods, example, observed, pod, spec_of

from longtail_api.status import RLJobStatus, RoleStatus
from longtail_operator import builders
from longtail_operator.derive import plan
from longtail_operator.model import Plan
from longtail_operator.observe import PodView, rfc3339
from longtail_operator.settings import Settings

SETTINGS = Settings()


def conds(p: Plan) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in p.status.conditions}


def message(p: Plan, ctype: str) -> str:
    return next(c.message for c in p.status.conditions if c.type == ctype)


def configmap(manifest: dict[str, Any]) -> dict[str, Any]:
    """The ConfigMap data the operator wrote for ``manifest``'s spec (the accepted spec)."""
    return builders.job_configmap(JOB, manifest["spec"])["data"]  # type: ignore[no-any-return]


def rendered(p: Plan) -> dict[str, Any]:
    """The spec in the ConfigMap this plan writes (an update)."""
    [cm] = p.update
    return yaml.safe_load(cm["data"]["rljob.yaml"])["spec"]  # type: ignore[no-any-return]


def made(p: Plan) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in p.create if m["kind"] == "Pod"}


def engine_of(pod_manifest: dict[str, Any]) -> str:
    """A rollout pod's engine as built: vLLM pods get a shared-memory volume, torch pods none."""
    volumes = {v["name"] for v in pod_manifest["spec"]["volumes"]}
    return "vllm" if "dshm" in volumes else "torch"


def running(manifest: dict[str, Any], failed: str | None = None) -> list[PodView]:
    """Every pod of ``manifest`` running, the one named ``failed`` (``role-index``) Failed."""
    out = []
    for q in all_pods(spec_of(manifest)):
        if f"{q.role}-{q.index}" == failed:
            q = pod(q.role, q.index, phase="Failed", uid="failed-1")
        out.append(q)
    return out


def to_vllm(**more: Any) -> dict[str, Any]:
    """The example edited to the vLLM engine (valid: vLLM needs the eagle1 drafter layout)."""
    m = example(**more)
    m["spec"]["rollout"]["engine"] = "vllm"
    m["spec"]["drafterTraining"]["layout"] = "eagle1"
    return m


def test_an_engine_edit_while_running_is_refused_and_a_failed_pod_comes_back_as_it_was() -> None:
    accepted = example()
    up = RLJobStatus(phase="Running", start_time=rfc3339(NOW))
    edit = to_vllm()
    edit["spec"]["rollout"]["replicas"] = 3  # plus a live change: one more rollout pod
    p = plan(
        observed(edit, running(accepted, "rollout-1"), configmap=configmap(accepted), previous=up),
        SETTINGS,
    )
    assert p.delete_pods == ["tiny-rollout-1"]
    # The replacement of the failed pod would be made once it is gone; the new replica now:
    # both from the accepted spec's engine, never one vLLM pod among torch pods.
    assert {n: engine_of(m) for n, m in made(p).items()} == {"tiny-rollout-2": "torch"}
    now_cm = configmap({"spec": rendered(p)})  # the ConfigMap after this reconcile
    gone = [q for q in running(accepted) if q.name != "tiny-rollout-1"]
    again = plan(observed(edit, gone, configmap=now_cm, previous=p.status), SETTINGS)
    assert {n: engine_of(m) for n, m in made(again).items()} == {
        "tiny-rollout-1": "torch",
        "tiny-rollout-2": "torch",
    }
    # The ConfigMap the pods read gets the live change only, never the new engine.
    assert rendered(p)["rollout"]["engine"] == "torch" and rendered(p)["rollout"]["replicas"] == 3
    assert conds(p)["SpecAccepted"] == ("False", "ImmutableFieldChanged")
    text = message(p, "SpecAccepted")
    assert "spec.rollout.engine: 'torch' -> 'vllm'" in text
    assert "spec.drafterTraining.layout: 'longtail' -> 'eagle1'" in text
    assert "set spec.suspend: true" in text and "revert" in text
    assert "spec.rollout.replicas" not in text  # live: applied
    assert p.status.roles["rollout"].total == 3
    events = [(e.type, e.reason) for e in p.events]
    assert ("Warning", "ImmutableFieldChanged") in events
    # Reverting the frozen field: accepted again (said once), the live change kept.
    back = example()
    back["spec"]["rollout"]["replicas"] = 3
    fixed = plan(observed(back, gone, configmap=now_cm, previous=p.status), SETTINGS)
    assert conds(fixed)["SpecAccepted"] == ("True", "Accepted")
    assert "Accepted" in [e.reason for e in fixed.events]
    assert fixed.update == []  # it held replicas: 3 already


def test_a_model_edit_while_running_keeps_the_accepted_model_in_the_configmap() -> None:
    accepted = example()
    edit = example(model={"path": "/models/other", "dtype": "float32"})
    edit["spec"]["drafterTraining"]["initialDrafter"] = "/drafters/other"
    p = plan(observed(edit, running(accepted), configmap=configmap(accepted)), SETTINGS)
    assert conds(p)["SpecAccepted"] == ("False", "ImmutableFieldChanged")
    assert "spec.model.path: 'builtin:tiny' -> '/models/other'" in message(p, "SpecAccepted")
    assert p.update == [] and not made(p) and not p.delete_pods


def test_a_frozen_edit_with_suspend_applies_once_the_pods_are_gone_to_every_pod() -> None:
    accepted = example()
    pods = running(accepted)
    up = RLJobStatus(phase="Running", start_time=rfc3339(NOW))
    edit = to_vllm(suspend=True)
    p = plan(observed(edit, pods, configmap=configmap(accepted), previous=up), SETTINGS)
    # Suspended at once (checkpoint, then every pod goes); the ConfigMap still says torch.
    assert p.status.phase == "Suspended" and p.checkpoint
    assert sorted(p.delete_pods) == sorted(q.name for q in pods)
    assert rendered(p)["suspend"] and rendered(p)["rollout"]["engine"] == "torch"
    assert conds(p)["SpecAccepted"] == ("False", "WaitingForPodsToStop")
    # Resumed in the next edit while the old pods are still terminating: held suspended.
    edit_held = {"spec": rendered(p)}  # what the ConfigMap holds now
    resumed = to_vllm()
    leaving = [pod(q.role, q.index, deleting=True) for q in pods]
    held = plan(
        observed(resumed, leaving, configmap=configmap(edit_held), previous=p.status), SETTINGS
    )
    assert held.status.phase == "Suspended" and not made(held) and not held.update
    assert conds(held)["SpecAccepted"] == ("False", "WaitingForPodsToStop")
    # The last pod gone: the new spec is accepted, and every pod is made from it.
    fresh = plan(
        observed(resumed, [], configmap=configmap(edit_held), previous=held.status), SETTINGS
    )
    assert conds(fresh)["SpecAccepted"] == ("True", "Accepted")
    rollout = {n: engine_of(m) for n, m in made(fresh).items() if "rollout" in n}
    assert rollout == {"tiny-rollout-0": "vllm", "tiny-rollout-1": "vllm"}
    assert rendered(fresh)["rollout"]["engine"] == "vllm" and not rendered(fresh).get("suspend")


def test_an_invalid_edit_keeps_the_job_managed_under_the_accepted_spec() -> None:
    accepted = example()
    up = RLJobStatus(
        phase="Running",
        start_time=rfc3339(NOW),
        roles={r: RoleStatus(t, t) for r, t in (("trainer", 1), ("verifier", 1), ("rollout", 2))},
    )
    bad = example(rollout={"replicas": 0})
    pods = running(accepted, "rollout-0")
    p = plan(observed(bad, pods, configmap=configmap(accepted), previous=up), SETTINGS)
    assert p.delete_pods == ["tiny-rollout-0"] and p.counted == ["failed-1"]
    assert p.status.roles["rollout"] == RoleStatus(ready=1, total=2, failed=1)
    assert p.status.phase == "Initializing" and p.status.ready == "3/4"
    assert conds(p)["RolloutReady"] == ("False", "ReplicasNotReady")
    assert conds(p)["ValidationFailed"] == ("True", "InvalidSpec")
    assert conds(p)["SpecAccepted"] == ("False", "InvalidSpec")
    assert "spec.rollout.replicas: must be >= 1, got 0" in message(p, "SpecAccepted")
    assert [e.reason for e in p.events].count("InvalidSpec") == 1  # told once
    assert p.update == []
    gone = [q for q in pods if q.name != "tiny-rollout-0"]
    back = plan(observed(bad, gone, configmap=configmap(accepted), previous=p.status), SETTINGS)
    assert list(made(back)) == ["tiny-rollout-0"]  # replaced, from the accepted spec


def test_lowering_backoff_limit_below_the_failures_checkpoints_before_failing() -> None:
    accepted = example()
    up = RLJobStatus(
        phase="Running",
        start_time=rfc3339(NOW),
        roles={"rollout": RoleStatus(2, 2, failed=1)},
    )
    edit = example(backoffLimit=0)  # live: applies at once
    pods = running(accepted)
    p = plan(observed(edit, pods, configmap=configmap(accepted), previous=up), SETTINGS)
    assert p.status.phase == "Failed" and conds(p)["Failed"] == ("True", "BackoffLimitExceeded")
    assert p.checkpoint and p.checkpoint_reason == "backoff-limit"
    assert "tiny-trainer-0" in p.delete_pods
    # While the Failed job's pods wait for the checkpoint, each reconcile asks again.
    later = plan(observed(edit, pods, configmap=configmap(accepted), previous=p.status), SETTINGS)
    assert later.checkpoint and later.status.phase == "Failed"
    # The deadline, the other failure the operator decides, does the same.
    late = RLJobStatus(phase="Running", start_time=rfc3339(NOW - timedelta(seconds=61)))
    timed = example(activeDeadlineSeconds=60)
    d = plan(observed(timed, pods, configmap=configmap(accepted), previous=late), SETTINGS)
    assert conds(d)["Failed"] == ("True", "DeadlineExceeded")
    assert d.checkpoint and d.checkpoint_reason == "deadline"
    # No running trainer: nothing to ask.
    no_trainer = [q for q in pods if q.role != "trainer"]
    bare = plan(observed(edit, no_trainer, configmap=configmap(accepted), previous=up), SETTINGS)
    assert bare.status.phase == "Failed" and not bare.checkpoint
