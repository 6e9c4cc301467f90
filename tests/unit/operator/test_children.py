"""The desired set (``children.py``) and its diff against what was observed (``diff.py``): one
rule for every kind, and stopping as a smaller set (suspend, finish, TTL)."""

from __future__ import annotations

from datetime import timedelta

from optest import JOB, NOW, all_pods, example, observed, pod, spec_of

from longtail_api.status import RLJobStatus
from longtail_operator import builders, children, diff
from longtail_operator.children import Stage
from longtail_operator.derive import plan
from longtail_operator.model import ObjectKey
from longtail_operator.observe import rfc3339
from longtail_operator.settings import Settings

SETTINGS = Settings()
VOLCANO = {"scheduling": {"gang": {"backend": "volcano"}}}


def kinds(keys: object) -> set[str]:
    return {k.kind for k in keys}  # type: ignore[attr-defined]


def test_diff_creates_the_missing_deletes_the_unwanted_and_replaces_a_changed_configmap() -> None:
    cm = builders.job_configmap(JOB, {"a": 1})
    want = {ObjectKey.of(cm): cm, ObjectKey("v1", "Pod", "tiny-rollout-0"): {"kind": "Pod"}}
    found = {
        ObjectKey.of(cm): {"data": {"rljob.yaml": "old"}},
        ObjectKey("v1", "Pod", "tiny-rollout-1"): pod("rollout", 1),
        ObjectKey("v1", "Pod", "tiny-rollout-2"): pod("rollout", 2, deleting=True),
    }
    rows = [(c.op, c.key.name) for c in diff.diff(want, found)]
    assert rows == [
        ("create", "tiny-rollout-0"),
        ("update", "tiny-config"),
        ("delete", "tiny-rollout-1"),  # the one being deleted goes by itself
    ]
    assert diff.diff(want, {**found, ObjectKey.of(cm): {"data": cm["data"]}})[1].op == "delete"


def test_every_kind_is_keyed_by_its_own_key_and_a_stop_is_a_smaller_set() -> None:
    manifest = example(**VOLCANO)
    obs = observed(manifest, [], services=frozenset())  # a new job: nothing found
    spec = spec_of(manifest)
    running = plan(obs, SETTINGS)
    made = {ObjectKey.of(m) for m in running.create}
    assert kinds(made) == {"Pod", "PodGroup", "Service", "NetworkPolicy", "ConfigMap"}
    suspended = children.desired(obs, spec, SETTINGS, Stage("Suspended", None, None))
    assert kinds(suspended) == {"Service", "NetworkPolicy", "ConfigMap"}
    assert set(suspended) < made


def test_a_finished_job_keeps_what_is_left_until_its_ttl_and_then_nothing() -> None:
    manifest = example(ttlSecondsAfterFinished=60)
    spec = spec_of(manifest)
    done = rfc3339(NOW - timedelta(seconds=30))
    obs = observed(manifest, all_pods(spec), previous=RLJobStatus(phase="Succeeded"))
    kept = children.desired(obs, spec, SETTINGS, Stage("Succeeded", None, None, done))
    assert set(kept) == set(obs.owned)  # the Services as found; nothing made (no ConfigMap)
    gone = rfc3339(NOW - timedelta(seconds=61))
    assert children.desired(obs, spec, SETTINGS, Stage("Succeeded", None, None, gone)) == {}
    rows = diff.diff(kept, diff.observed(obs))
    assert {c.op for c in rows} == {"delete"} and kinds(c.key for c in rows) == {"Pod"}
