"""Placement on shared clusters: gang placement (``spec.scheduling.gang``, gang.py: the group
object of each backend, what every pod carries, when the plan makes and deletes the group) and
a job labelled for Kueue (it waits, ``Queued``, never starting around the queue)."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
from optest import JOB, NOW, all_pods, example, observed, spec_of

from longtail_api.manifest import validate_manifest
from longtail_api.status import RLJobStatus, TrainerGroupStatus
from longtail_operator import builders
from longtail_operator.derive import plan
from longtail_operator.observe import rfc3339
from longtail_operator.placement import refusals
from longtail_operator.settings import Settings, SettingsError, from_env

SETTINGS = Settings()


def gang_job(**gang: Any) -> dict[str, Any]:
    """examples/01 with 2 trainer pods (a group of 2) and ``gang``."""
    return example(scheduling={"gang": gang}, trainer__replicas=2)


def pods_of(manifest: dict[str, Any], settings: Settings = SETTINGS) -> dict[str, dict[str, Any]]:
    spec = spec_of(manifest)
    return {
        f"{role}-{i}": builders.worker_pod(JOB, spec, settings, role, i)
        for role, i in builders.desired_pods(spec).values()
    }


def test_volcano_group_counts_every_pod_and_each_pod_names_its_group_and_task() -> None:
    manifest = gang_job(backend="volcano", queue="research")
    group = builders.gang_group(JOB, spec_of(manifest), SETTINGS)
    assert (group["apiVersion"], group["kind"]) == ("scheduling.volcano.sh/v1beta1", "PodGroup")
    assert group["metadata"]["name"] == JOB.name and group["metadata"]["namespace"] == "ns"
    [owner] = group["metadata"]["ownerReferences"]
    assert owner["uid"] == JOB.uid and owner["controller"]
    # examples/01: 2 rollout, 1 verifier; the trainer group of 2 counts whole.
    assert group["spec"] == {
        "minMember": 5,
        "minTaskMember": {"trainer": 2, "rollout": 2, "verifier": 1},
        "queue": "research",
    }
    for key, p in pods_of(manifest).items():
        assert p["spec"]["schedulerName"] == "volcano", key
        notes = p["metadata"]["annotations"]
        assert notes["scheduling.k8s.io/group-name"] == JOB.name
        assert notes["volcano.sh/task-spec"] == key.split("-")[0]
    default_queue = builders.gang_group(JOB, spec_of(gang_job(backend="volcano")), SETTINGS)
    assert default_queue["spec"]["queue"] == "default"


def test_coscheduling_group_and_pod_label() -> None:
    manifest = gang_job(backend="coscheduling", scheduleTimeoutSeconds=120)
    group = builders.gang_group(JOB, spec_of(manifest), SETTINGS)
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["spec"] == {"minMember": 5, "scheduleTimeoutSeconds": 120}
    for p in pods_of(manifest).values():
        assert p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == JOB.name
        assert p["spec"]["schedulerName"] == "scheduler-plugins-scheduler"


def test_kai_group_has_a_subgroup_per_role_and_pods_skip_the_podgrouper() -> None:
    manifest = gang_job(backend="kai", queue="team-a", schedulerName="my-kai")
    group = builders.gang_group(JOB, spec_of(manifest), SETTINGS)
    assert group["apiVersion"] == "scheduling.run.ai/v2alpha2"
    assert group["spec"]["minMember"] == 5 and group["spec"]["queue"] == "team-a"
    assert {g["name"]: g["minMember"] for g in group["spec"]["subGroups"]} == {
        "trainer": 2,
        "rollout": 2,
        "verifier": 1,
    }
    for key, p in pods_of(manifest).items():
        meta = p["metadata"]
        assert meta["annotations"]["pod-group-name"] == JOB.name
        assert meta["annotations"]["kai.scheduler/skip-podgrouper"] == "true"
        assert meta["labels"]["kai.scheduler/subgroup-name"] == key.split("-")[0]
        assert meta["labels"]["kai.scheduler/queue"] == "team-a"
        assert p["spec"]["schedulerName"] == "my-kai"


def test_kubernetes_group_and_pods_are_valid_for_kubernetes_1_36() -> None:
    """Core gang scheduling (``scheduling.k8s.io/v1alpha2``) is not servable by the tests'
    v1.20 control plane: the group and every pod are checked against the 1.36 schema
    (kubernetes-validate, strict: an unknown or misplaced field fails)."""
    manifest = gang_job(backend="kubernetes")
    group = builders.gang_group(JOB, spec_of(manifest), SETTINGS)
    assert (group["apiVersion"], group["kind"]) == ("scheduling.k8s.io/v1alpha2", "PodGroup")
    assert group["spec"] == {"schedulingPolicy": {"gang": {"minCount": 5}}}
    kubernetes_validate.validate(group, "1.36.0", strict=True)
    for key, p in pods_of(manifest).items():
        assert p["spec"]["schedulingGroup"] == {"podGroupName": JOB.name}, key
        assert p["spec"]["schedulerName"] == "default-scheduler"
        kubernetes_validate.validate(p, "1.36.0", strict=True)
    # The check has teeth: 1.35's shape of the same link (spec.workloadRef) is refused.
    old = pods_of(manifest)["rollout-0"]
    old["spec"]["workloadRef"] = old["spec"].pop("schedulingGroup")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(old, "1.36.0", strict=True)


def test_the_installs_default_gang_applies_unless_a_job_names_its_own_or_none() -> None:
    settings = Settings(default_gang_backend="volcano", default_gang_queue="shared")
    plain = example(trainer__replicas=2)
    group = builders.gang_group(JOB, spec_of(plain), settings)
    assert group["apiVersion"].startswith("scheduling.volcano.sh/")
    assert group["spec"]["queue"] == "shared"
    assert all(p["spec"]["schedulerName"] == "volcano" for p in pods_of(plain, settings).values())
    new = plan(observed(plain, [], gang_group=False), settings)
    assert _group_actions(new) == (["PodGroup"], [])
    own = gang_job(backend="coscheduling")
    assert builders.gang_group(JOB, spec_of(own), settings)["apiVersion"].startswith(
        "scheduling.x-k8s.io/"
    )
    opted_out = gang_job(backend="none")
    assert builders.job_gang(spec_of(opted_out), settings) is None
    assert all("schedulerName" not in p["spec"] for p in pods_of(opted_out, settings).values())


def test_the_operators_gang_settings_are_checked_at_start() -> None:
    env = {"LONGTAIL_OPERATOR_GANG_BACKENDS": "volcano,kai"}
    assert from_env(env).gang_backends == ("volcano", "kai")
    bad = {
        "LONGTAIL_OPERATOR_GANG_BACKENDS": "volcano,yarn",
        "LONGTAIL_OPERATOR_DEFAULT_GANG_BACKEND": "kai",  # without a queue
    }
    for var, value in bad.items():
        with pytest.raises(SettingsError, match=var.removeprefix("LONGTAIL_OPERATOR_")):
            from_env({var: value})
    not_granted = {**env, "LONGTAIL_OPERATOR_DEFAULT_GANG_BACKEND": "coscheduling"}
    with pytest.raises(SettingsError, match="not among"):
        from_env(not_granted)


def test_a_gang_backend_the_install_does_not_grant_is_refused_naming_them() -> None:
    settings = Settings(gang_backends=("volcano",))
    manifest = gang_job(backend="kai", queue="q")
    [err] = refusals(spec_of(manifest), settings, {})
    text = str(err)
    assert err.path == "spec.scheduling.gang.backend" and "'kai'" in text
    assert "volcano" in text and "scheduling.gangBackends" in text
    assert refusals(spec_of(gang_job(backend="volcano")), settings, {}) == []
    assert refusals(spec_of(gang_job(backend="none")), settings, {}) == []


def test_a_pod_template_cannot_take_a_pod_out_of_its_gang() -> None:
    manifest = gang_job(backend="volcano")
    manifest["spec"]["rollout"]["template"] = {
        "metadata": {"annotations": {"scheduling.k8s.io/group-name": "other", "team": "x"}},
        "spec": {"schedulerName": "default-scheduler"},
    }
    p = pods_of(manifest)["rollout-0"]
    assert p["spec"]["schedulerName"] == "volcano"
    assert p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == JOB.name
    assert p["metadata"]["annotations"]["team"] == "x"


def test_no_gang_changes_nothing() -> None:
    for p in pods_of(example()).values():
        assert "schedulerName" not in p["spec"]
        assert not any("scheduling" in k for k in p["metadata"]["annotations"])


def _group_actions(p: Any) -> tuple[list[str], list[tuple[str, str]]]:
    made = [m["kind"] for m in p.create if m["kind"] == "PodGroup"]
    gone = [(o.kube_kind, o.name) for o in p.delete_objects if o.kind == "PodGroup"]
    return made, gone


def test_the_group_is_made_with_the_pods_deleted_on_suspend_and_made_again_on_resume() -> None:
    manifest = gang_job(backend="volcano")
    spec = spec_of(manifest)
    new = plan(observed(manifest, [], gang_group=False), SETTINGS)
    assert _group_actions(new) == (["PodGroup"], [])
    assert sum(1 for m in new.create if m["kind"] == "Pod") == 5
    running = RLJobStatus(phase="Running", start_time=rfc3339(NOW))
    steady = plan(observed(manifest, all_pods(spec), previous=running, gang_group=True), SETTINGS)
    assert _group_actions(steady) == ([], [])
    suspended = gang_job(backend="volcano")
    suspended["spec"]["suspend"] = True
    down = plan(observed(suspended, all_pods(spec), previous=running, gang_group=True), SETTINGS)
    assert _group_actions(down) == ([], [("scheduling.volcano.sh/v1beta1/PodGroup", JOB.name)])
    resumed = plan(observed(manifest, [], previous=down.status, gang_group=False), SETTINGS)
    assert _group_actions(resumed) == (["PodGroup"], [])


def test_a_trainer_group_restart_keeps_the_one_group() -> None:
    manifest = gang_job(backend="coscheduling")
    spec = spec_of(manifest)
    pods = [q for q in all_pods(spec) if q.name != "tiny-trainer-1"]  # one trainer pod lost
    running = RLJobStatus(
        phase="Running", start_time=rfc3339(NOW), trainer=TrainerGroupStatus(formed=True)
    )
    p = plan(observed(manifest, pods, previous=running, gang_group=True), SETTINGS)
    assert "tiny-trainer-0" in p.delete_pods  # the whole group is replaced ...
    assert _group_actions(p) == ([], [])  # ... under the same gang


@pytest.mark.parametrize(
    ("gang", "path", "words"),
    [
        ({"backend": "slurm"}, "spec.scheduling.gang.backend", "coscheduling, kai, kubernetes"),
        ({"backend": "kubernetes", "queue": "q"}, "spec.scheduling.gang.queue", "no queues"),
        ({"backend": "kai"}, "spec.scheduling.gang.queue", "KAI queues"),
        ({"backend": "coscheduling", "queue": "q"}, "spec.scheduling.gang.queue", "no queues"),
        ({"backend": "volcano", "queue": "Q_1"}, "spec.scheduling.gang.queue", "'Q_1'"),
        ({"queue": "q"}, "spec.scheduling.gang.backend", "volcano"),
    ],
)
def test_a_bad_gang_names_the_field_the_value_and_the_fix(
    gang: dict[str, Any], path: str, words: str
) -> None:
    result = validate_manifest(example(scheduling={"gang": gang}))
    assert not result.ok
    [err] = [e for e in result.errors if e.path == path]
    assert words in str(err), str(err)


@pytest.mark.parametrize(
    ("served", "reason"),
    [
        (False, "KueueNotInstalled"),
        (None, "KueueUnknown"),
        (True, "KueueDisabled"),  # the install does not do admission (scheduling.kueue: false)
    ],
)
def test_a_job_labelled_for_kueue_never_starts_around_the_queue(
    served: bool | None, reason: str
) -> None:
    manifest = example()
    off = {"kueue_enabled": False} if reason == "KueueDisabled" else {}
    p = plan(observed(manifest, [], queue="team-a", kueue_served=served, **off), SETTINGS)
    assert p.status.phase == "Queued"
    assert not [m for m in p.create if m["kind"] == "Pod"]
    queued = next(c for c in p.status.conditions if c.type == "Queued")
    assert (queued.status, queued.reason) == ("True", reason)
    assert "kueue.x-k8s.io/queue-name=team-a" in queued.message
    if reason != "KueueUnknown":
        assert "remove the label" in queued.message
    if reason == "KueueDisabled":
        assert "scheduling.kueue: false" in queued.message
        assert not [m for m in p.create if m["kind"] == "Workload"]
    # A queue label put on a running job stops it the safe way: checkpoint, then pods go.
    spec = spec_of(manifest)
    running = RLJobStatus(phase="Running", start_time=rfc3339(NOW))
    stopped = plan(
        observed(manifest, all_pods(spec), previous=running, queue="q", kueue_served=served, **off),
        SETTINGS,
    )
    assert stopped.checkpoint and len(stopped.delete_pods) == 4
    # The label removed: the job starts, and Queued says why it no longer waits.
    free = plan(observed(manifest, [], previous=p.status), SETTINGS)
    assert sum(1 for m in free.create if m["kind"] == "Pod") == 4
    assert {c.type: c.reason for c in free.status.conditions}["Queued"] == "NotQueued"


# --- Kueue installed: the Workload, admission, eviction ---------------------------------------

FLAVOR = {
    "spec": {"nodeLabels": {"gpu": "h100"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]}
}


def queued(manifest: dict[str, Any], pods: list[Any], workload: Any = None, **kw: Any) -> Any:
    return observed(manifest, pods, queue="team-a", kueue_served=True, workload=workload, **kw)


def admitted(raw: dict[str, Any], *, evicted: bool = False) -> Any:
    """``raw`` as Kueue leaves it once it admitted (or then evicted) it."""
    from longtail_operator import kueue

    obj = copy.deepcopy(raw)
    obj["status"] = {
        "admission": {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {"name": ps["name"], "flavors": {"cpu": "h100"}, "count": ps["count"]}
                for ps in obj["spec"]["podSets"]
            ],
        },
        "conditions": [
            {"type": "QuotaReserved", "status": "True"},
            {"type": "Admitted", "status": "True"},
            *([{"type": "Evicted", "status": "True", "reason": "Preempted"}] if evicted else []),
        ],
    }
    return kueue.view(obj, {"h100": FLAVOR})


def test_kueue_gets_one_workload_and_no_pod_runs_before_admission() -> None:
    manifest = example()
    p = plan(queued(manifest, []), SETTINGS)
    [w] = [m for m in p.create if m["kind"] == "Workload"]
    assert not [m for m in p.create if m["kind"] == "Pod"]
    assert p.status.phase == "Queued"
    assert (
        next(c for c in p.status.conditions if c.type == "Queued").reason == "WaitingForAdmission"
    )
    assert w["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert w["metadata"]["name"].startswith("rljob-tiny-") and len(w["metadata"]["name"]) == 16
    assert w["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == JOB.uid
    assert w["metadata"]["finalizers"] == ["kueue.x-k8s.io/resource-in-use"]
    assert w["metadata"]["ownerReferences"][0]["uid"] == JOB.uid
    assert w["spec"]["queueName"] == "team-a" and w["spec"]["active"] is True
    sets = {ps["name"]: ps for ps in w["spec"]["podSets"]}
    assert {n: ps["count"] for n, ps in sets.items()} == {"trainer": 1, "rollout": 2, "verifier": 1}
    assert sets["rollout"]["template"]["spec"]["containers"][0]["resources"]["limits"]


def test_admitted_pods_go_where_kueue_put_them_and_eviction_stops_then_releases() -> None:
    manifest = example()
    spec = spec_of(manifest)
    raw = next(m for m in plan(queued(manifest, []), SETTINGS).create if m["kind"] == "Workload")
    go = plan(queued(manifest, [], admitted(raw)), SETTINGS)
    made = [m for m in go.create if m["kind"] == "Pod"]
    assert len(made) == 4 and go.status.phase == "Initializing"
    mirrored = {c.type: (c.status, c.reason) for c in go.status.conditions}
    assert mirrored["KueueAdmitted"] == ("True", "Admitted")  # Kueue's conditions, mirrored
    assert mirrored["KueueQuotaReserved"] == ("True", "QuotaReserved")
    assert "KueueEvicted" not in mirrored
    for m in made:
        assert m["spec"]["nodeSelector"]["gpu"] == "h100"
        assert {"key": "gpu", "operator": "Exists"} in m["spec"]["tolerations"]
        assert (
            m["metadata"]["labels"]["kueue.x-k8s.io/podset"]
            == m["metadata"]["labels"]["longtail.dev/role"]
        )
    running = RLJobStatus(phase="Running", start_time=rfc3339(NOW))
    evicted = admitted(raw, evicted=True)
    stop = plan(queued(manifest, all_pods(spec), evicted, previous=running), SETTINGS)
    assert stop.status.phase == "Queued" and stop.checkpoint and len(stop.delete_pods) == 4
    mirrored = {c.type: (c.status, c.reason) for c in stop.status.conditions}
    assert mirrored["KueueEvicted"] == ("True", "Preempted")
    assert not stop.patches  # quota held while the trainer checkpoints and the pods go
    gone = plan(queued(manifest, [], evicted, previous=stop.status), SETTINGS)
    [(_, plural, patch, status)] = gone.patches
    assert (plural, status) == ("workloads", True) and patch["status"]["admission"] is None
    kinds = {c["type"]: c["status"] for c in patch["status"]["conditions"]}
    assert kinds["QuotaReserved"] == "False" and kinds["Evicted"] == "True"


def test_the_users_suspend_maps_to_active_and_a_new_shape_replaces_the_workload() -> None:
    manifest = example(suspend=True)
    raw = next(m for m in plan(queued(example(), []), SETTINGS).create if m["kind"] == "Workload")
    w = admitted(raw)
    p = plan(queued(manifest, [], w), SETTINGS)
    assert (p.patches[0].patch, p.status.phase) == ({"spec": {"active": False}}, "Suspended")
    bigger = example(rollout__replicas=3)
    q = plan(queued(bigger, [], w), SETTINGS)
    assert q.status.phase == "Queued"
    assert next(c for c in q.status.conditions if c.type == "Queued").reason == "WorkloadReplaced"
    assert ("kueue.x-k8s.io/v1beta2/Workload", w.name) in [
        (k.kube_kind, k.name) for k in q.delete_objects
    ]
    assert any(patch == {"metadata": {"finalizers": None}} for *_, patch, _ in q.patches)


def test_a_finished_job_finishes_its_workload_and_lets_it_go() -> None:
    manifest = example()
    raw = next(m for m in plan(queued(manifest, []), SETTINGS).create if m["kind"] == "Workload")
    done = RLJobStatus(phase="Succeeded")
    p = plan(queued(manifest, [], admitted(raw), previous=done), SETTINGS)
    patches = [patch for *_, patch, _ in p.patches]
    finished = next(x for x in patches if "status" in x)["status"]["conditions"]
    assert {"type": "Finished", "status": "True", "reason": "Succeeded"}.items() <= finished[
        -1
    ].items()
    assert {"metadata": {"finalizers": None}} in patches
