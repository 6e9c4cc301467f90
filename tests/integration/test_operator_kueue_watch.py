"""Kueue admission and eviction acted on at once, by watch, on the real v1.20 control plane
(issue #48, item 5).

The operator of this module reconciles each job only every :data:`PERIOD_S` on its own, far
beyond the acceptance bound: whatever it does within seconds of an admission or an eviction,
a watch event made it do. Kueue's API is installed only after the operator started, as on a
cluster where Kueue comes later: kopf watches CRDs and starts watching the Workloads then. The
fake Kueue (``test_operator_kueue.FakeKueue``) admits and evicts through the Workload status.
Also: after the admission ``Queued`` says ``Admitted`` (it said "no queue label"), and the
operator's Events name the instance that posted them (item 6c).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client
from opharness import ALL_PODS, apply, cond, get, job, live_pods, trainer_at, wait_phase
from test_operator_kueue import FakeKueue, install_kueue, queued_job, remove_kueue

from longtail_operator.settings import Settings

if TYPE_CHECKING:
    from conftest import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PERIOD_S = 60.0
"""The operator's periodic reconcile here (the default is 10 s)."""
BOUND_S = 2.0
"""The acceptance: admission and eviction acted on within this."""
MARGIN_S = 3.0
"""Allowance on a loaded 2-CPU test machine (the tests' own polling, a busy API server); still
far below :data:`PERIOD_S`, so only a watch passes."""


@pytest.fixture(scope="module")
def settings(settings: Settings) -> Settings:
    return dataclasses.replace(settings, reconcile_period_s=PERIOD_S)


@pytest.fixture(scope="module")
def kueue_later(control_plane: ControlPlane, operator: Any) -> Iterator[None]:
    """Kueue's API installed while the operator already runs (and removed at the end)."""
    assert "kueue.x-k8s.io" not in control_plane.kubectl("api-versions").stdout
    install_kueue(control_plane)
    yield
    remove_kueue(control_plane)


@pytest.fixture
def kueue(control_plane: ControlPlane, ns: str, kueue_later: None) -> Iterator[FakeKueue]:
    k = FakeKueue(control_plane, ns)
    yield k
    k.close()


def seconds_until(check: Callable[[], bool], since: float, timeout: float, what: str) -> float:
    """Seconds from ``since`` (``time.monotonic()``) until ``check()`` holds, polled fast."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic() - since
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


def test_admission_and_eviction_are_acted_on_within_seconds(
    control_plane: ControlPlane, ns: str, kueue: FakeKueue, kubelet: Any, settings: Settings
) -> None:
    cp = control_plane
    core = client.CoreV1Api(cp.api_client())
    custom = client.CustomObjectsApi(cp.api_client())

    def pod_names() -> set[str]:
        found = core.list_namespaced_pod(ns, label_selector="longtail.dev/rljob=tiny").items
        return {p.metadata.name for p in found if p.metadata.deletion_timestamp is None}

    def status() -> dict[str, Any]:
        raw = custom.get_namespaced_custom_object("longtail.dev", "v1alpha1", ns, "rljobs", "tiny")
        return raw.get("status") or {}  # type: ignore[no-any-return]

    trainer = trainer_at(kubelet, settings, ns)
    try:
        kueue.hold = True  # a full queue
        apply(cp, queued_job(ns))
        wait_phase(cp, ns, "Queued", timeout=60)
        # Its Workload: the operator reads Kueue's presence at most every 30 s, and a job of an
        # earlier module (its namespace still terminating) may have read it before this
        # module installed Kueue; then the next periodic reconcile makes it.
        cp.wait_for(kueue.workloads, timeout=PERIOD_S + 40, what="the job's Workload")
        time.sleep(1.0)  # the job's loop is idle now, until its next period or an event
        kueue.hold = False
        cp.wait_for(lambda: kueue.admissions >= 1, timeout=30, what="the admission")
        admitted_s = seconds_until(
            lambda: bool(pod_names()), kueue.admitted_at, PERIOD_S / 2, "a pod after admission"
        )
        cp.wait_for(lambda: live_pods(cp, ns) == ALL_PODS, timeout=60, what="every pod")
        running = wait_phase(cp, ns, "Running", timeout=90)
        # The condition says it was admitted (it said "no queue label: no admission asked").
        assert cond(running, "Queued") == ("False", "Admitted")
        queued_now = next(c for c in running["status"]["conditions"] if c["type"] == "Queued")
        assert queued_now["message"].endswith("admitted by Kueue to ClusterQueue cq")

        time.sleep(1.0)
        [w] = kueue.workloads()
        kueue.hold = True  # nothing re-admitted until the test says so
        evicted_at = kueue.evict(w["metadata"]["name"])

        def acted_on_eviction() -> bool:
            conds = {c["type"]: c["status"] for c in status().get("conditions") or []}
            return conds.get("KueueEvicted") == "True" or len(pod_names()) < len(ALL_PODS)

        evicted_s = seconds_until(acted_on_eviction, evicted_at, PERIOD_S / 2, "the eviction")
        cp.wait_for(lambda: not pod_names(), timeout=60, what="the pods gone after eviction")
        cp.wait_for(
            lambda: not (kueue.workloads()[0].get("status") or {}).get("admission"),
            timeout=30, what="the admission released",
        )  # fmt: skip
        time.sleep(1.0)
        readmissions = kueue.admissions
        kueue.hold = False  # re-admitted: the job that waited starts again
        cp.wait_for(lambda: kueue.admissions > readmissions, timeout=30, what="a re-admission")
        readmitted_s = seconds_until(
            lambda: bool(pod_names()), kueue.admitted_at, PERIOD_S / 2, "pods after re-admission"
        )
    finally:
        trainer.close()
    figures = f"admission {admitted_s:.2f} s, eviction {evicted_s:.2f} s, re-admission "
    print(f"acted on: {figures}{readmitted_s:.2f} s (reconcile period {PERIOD_S:.0f} s)")
    for seconds in (admitted_s, evicted_s, readmitted_s):
        assert seconds < BOUND_S + MARGIN_S, figures

    # Every event of the job names the operator instance that posted it.
    items = get(cp, ns, "events", "--field-selector", "involvedObject.kind=RLJob")["items"]
    reasons = [e["reason"] for e in items]
    assert "NotQueued" not in reasons, reasons
    me = (os.environ.get("POD_NAME", "").strip() or socket.gethostname())[:128]
    assert items and {e.get("reportingInstance") for e in items} == {me}, json.dumps(items[0])
    assert {e["source"].get("host") for e in items} == {me}
    assert job(cp, ns)["status"]["phase"] in ("Initializing", "Running")
