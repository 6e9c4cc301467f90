"""Kueue by watch, and a true ``Queued`` reason (issue #48, item 5).

The operator watches Kueue's Workloads (``handlers.workload_event``, registered at start-up by
``handlers.watch_workloads`` where the install does Kueue admission): a Workload's change wakes
its RLJob's loop as a pod's does, instead of waiting for the periodic reconcile. Once a job that
waited is admitted, ``Queued`` turns False with reason ``Admitted`` naming the Workload and its
ClusterQueue (it used to say ``NotQueued``: "no kueue.x-k8s.io/queue-name label", label or
not). The same against the real control plane: ``tests/integration/test_operator_kueue.py``.
"""

from __future__ import annotations

import threading
from typing import Any

import kopf
import pytest
import yaml
from optest import NOW, REPO, all_pods, example, observed, spec_of
from test_scheduling import admitted, queued

from longtail_api.status import RLJobStatus
from longtail_operator import handlers, kueue
from longtail_operator.builders import LABEL_JOB
from longtail_operator.derive import plan
from longtail_operator.model import Plan
from longtail_operator.observe import rfc3339
from longtail_operator.settings import Settings

SETTINGS = Settings()


def queued_cond(p: Plan) -> tuple[str, str, str]:
    c = next(c for c in p.status.conditions if c.type == "Queued")
    return c.status, c.reason, c.message


def the_workload() -> dict[str, Any]:
    first = plan(queued(example(), []), SETTINGS)
    return next(m for m in first.create if m["kind"] == "Workload")


def test_an_admitted_job_says_admitted_naming_its_workload_and_cluster_queue() -> None:
    manifest = example()
    waiting = plan(queued(manifest, []), SETTINGS)
    assert queued_cond(waiting)[:2] == ("True", "WaitingForAdmission")
    w = admitted(the_workload())
    go = plan(queued(manifest, [], w, previous=waiting.status), SETTINGS)
    status, reason, message = queued_cond(go)
    assert (status, reason) == ("False", "Admitted")
    assert message == f"Workload {w.name} admitted by Kueue to ClusterQueue cq"
    assert "label" not in message
    told = [e.message for e in go.events if e.message.startswith("Queued ")]
    assert told == [f"Queued is False: {message}"]  # the event says the same, once
    assert not [e for e in go.events if e.reason == "NotQueued"]
    # Running on: no new transition, no new event.
    spec = spec_of(manifest)
    again = plan(queued(manifest, all_pods(spec), w, previous=go.status), SETTINGS)
    assert queued_cond(again)[:2] == ("False", "Admitted")
    assert not [e for e in again.events if e.message.startswith("Queued ")]


def test_queued_false_says_why_when_suspended_finished_or_unlabelled() -> None:
    waiting = plan(queued(example(), []), SETTINGS).status
    w = admitted(the_workload())
    suspended = plan(queued(example(suspend=True), [], w, previous=waiting), SETTINGS)
    assert queued_cond(suspended)[:2] == ("False", "JobSuspended")
    assert w.name in queued_cond(suspended)[2]
    done = RLJobStatus(phase="Succeeded", conditions=waiting.conditions)
    finished = plan(queued(example(), [], w, previous=done), SETTINGS)
    assert queued_cond(finished)[:2] == ("False", "JobFinished")
    free = plan(observed(example(), [], previous=waiting), SETTINGS)
    assert queued_cond(free) == (
        "False",
        "NotQueued",
        "no kueue.x-k8s.io/queue-name label: no admission asked",
    )


def test_an_evicted_job_is_queued_again_and_then_admitted_again() -> None:
    manifest = example()
    spec = spec_of(manifest)
    raw = the_workload()
    running = RLJobStatus(phase="Running", start_time=rfc3339(NOW))
    stop = queued(manifest, all_pods(spec), admitted(raw, evicted=True), previous=running)
    evicted = plan(stop, SETTINGS)
    assert queued_cond(evicted)[:2] == ("True", "Evicted")
    back = plan(queued(manifest, [], admitted(raw), previous=evicted.status), SETTINGS)
    assert queued_cond(back)[:2] == ("False", "Admitted")


class Woken:
    def __init__(self) -> None:
        self.woken: list[tuple[str, str]] = []

    def wake(self, namespace: str, name: str) -> None:
        self.woken.append((namespace, name))


def test_a_workload_event_wakes_its_job(monkeypatch: pytest.MonkeyPatch) -> None:
    op = Woken()
    monkeypatch.setitem(handlers._state, "operator", op)
    handlers.workload_event(namespace="team", labels={LABEL_JOB: "tiny"}, body={}, type="MODIFIED")
    assert op.woken == [("team", "tiny")]


@pytest.mark.parametrize("enabled", [True, False])
def test_workloads_are_watched_where_the_install_does_kueue_admission(
    monkeypatch: pytest.MonkeyPatch, enabled: bool
) -> None:
    """Only with ``Settings.kueue`` (the chart's ``scheduling.kueue``, which grants the watch):
    without it the operator may not list Workloads, and a watch would fail on RBAC."""
    asked: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    registered: list[Any] = []

    def on_event(*args: Any, **kw: Any) -> Any:
        asked.append((args, kw))
        return registered.append

    monkeypatch.setattr(kopf.on, "event", on_event)
    monkeypatch.setattr(handlers, "_watching_workloads", threading.Event())
    monkeypatch.setitem(handlers._state, "settings", Settings(kueue=enabled))
    handlers.watch_workloads()
    handlers.watch_workloads()  # kopf retries or restarts in-process: registered once
    if not enabled:
        assert not asked and not registered
        return
    [(args, kw)] = asked
    assert args == (kueue.GROUP, kueue.VERSION, kueue.WORKLOADS)
    assert kw["labels"] == {LABEL_JOB: kopf.PRESENT}
    assert registered == [handlers.workload_event]


def test_the_operators_rbac_lets_it_watch_workloads() -> None:
    docs = yaml.safe_load_all((REPO / "operator" / "rbac" / "clusterrole.yaml").read_text())
    role = next(d for d in docs if d["metadata"]["name"] == "longtail-operator-kueue")
    verbs = {
        v
        for rule in role["rules"]
        if "workloads" in rule["resources"] and "kueue.x-k8s.io" in rule["apiGroups"]
        for v in rule["verbs"]
    }
    assert {"list", "watch"} <= verbs
