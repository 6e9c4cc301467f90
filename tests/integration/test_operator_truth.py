"""Issue #48, items 3 and 4, on the real v1.20 control plane: the status tells the truth while
the trainer checkpoints, and about a spec the API server stores but cannot turn into objects.

Item 3: the checkpoint before the pods go runs in the background; the loopback ``FakeTrainer``
holds its ``POST /v1/checkpoint`` (a checkpoint being written) while a rollout pod fails: the
phase (Suspended) and the ``WorkerFailed`` event appear at once, the pods wait for the answer.
Item 4: every object a plan creates is first a server-side dry run; a 422 (an annotation over
256 KiB in a pod template, a ConfigMap over 1 MiB) creates nothing (no pod of any role),
``ValidationFailed`` True/``ChildRejected`` and a Warning event carry the API's message, and a
running job whose edit is refused keeps running under its last accepted spec. The RLJobs with
such fields are made with ``kubectl create`` (``apply`` would copy them into its own
annotation, which the API server refuses for the RLJob itself) and edited through the API
(a 1 MB ``kubectl patch -p`` is over the argument limit). Unit scope of the same:
``tests/unit/operator/test_background_checkpoint.py``, ``test_refused_children.py``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from opharness import (
    ALL_PODS,
    apply,
    cond,
    events,
    get,
    job,
    job_manifest,
    live_pods,
    pods,
    trainer_at,
    wait_phase,
)

from longtail_operator.settings import Settings

if TYPE_CHECKING:
    from conftest import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def settings(settings: Settings) -> Settings:
    """The harness's settings with a long checkpoint timeout (the harness's 5 s would give up
    on the held checkpoint before the test looks)."""
    return dataclasses.replace(settings, checkpoint_timeout_s=120.0)


def create(cp: ControlPlane, manifest: dict[str, Any]) -> None:
    cp.kubectl("create", "-f", "-", input=yaml.safe_dump(manifest))


def merge_patch_spec(cp: ControlPlane, ns: str, patch: dict[str, Any]) -> None:
    from kubernetes import client

    api = client.CustomObjectsApi(cp.api_client())
    api.patch_namespaced_custom_object(
        "longtail.dev", "v1alpha1", ns, "rljobs", "tiny", {"spec": patch}
    )


def warnings(cp: ControlPlane, ns: str, reason: str) -> list[dict[str, Any]]:
    found = get(cp, ns, "events", "--field-selector", f"reason={reason}")["items"]
    return [e for e in found if e["involvedObject"]["kind"] == "RLJob"]


def validation(j: dict[str, Any]) -> tuple[str, str, str] | None:
    for c in j.get("status", {}).get("conditions", []):
        if c["type"] == "ValidationFailed":
            return c["status"], c["reason"], c["message"]
    return None


def test_status_and_events_are_written_while_the_trainer_checkpoints(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings
) -> None:
    cp = control_plane
    trainer = trainer_at(kubelet, settings, ns)
    release = threading.Event()
    try:
        trainer.status = trainer.status.__class__(
            step=7, total_steps=20, phase="running", policy_version=7, drafter_version=1
        )
        apply(cp, job_manifest(ns))
        wait_phase(cp, ns, "Running")
        trainer.checkpoint_release = release  # the checkpoint takes until the test says
        apply(cp, job_manifest(ns, suspend=True))
        cp.wait_for(lambda: trainer.checkpoint_asks >= 1, timeout=30, what="the checkpoint ask")
        kubelet.fail(ns, "tiny-rollout-0", "RuntimeError: CUDA error: an illegal memory access")
        failed_at = time.monotonic()

        def truthful() -> bool:
            phase = job(cp, ns).get("status", {}).get("phase")
            return phase == "Suspended" and "WorkerFailed" in events(cp, ns)

        # Generous bound; the old code wrote nothing until the call returned (here 120 s).
        cp.wait_for(truthful, timeout=45, what="phase Suspended and WorkerFailed mid-checkpoint")
        print(f"phase and WorkerFailed {time.monotonic() - failed_at:.1f} s after the failure")
        assert trainer.checkpoints == [] and trainer.checkpoint_asks == 1  # still writing
        assert set(pods(cp, ns)) == ALL_PODS  # kept until the trainer answers
        assert "CheckpointRequested" in events(cp, ns)
        [failed] = warnings(cp, ns, "WorkerFailed")
        text = failed["message"]
        assert "tiny-rollout-0" in text and "illegal memory access" in text, text
        release.set()
        cp.wait_for(lambda: pods(cp, ns) == {}, timeout=60, what="pods deleted after the answer")
        assert trainer.checkpoints == [7] and trainer.checkpoint_asks == 1
        assert "CheckpointSaved" in events(cp, ns)
        assert cond(job(cp, ns), "Suspended") == ("True", "JobSuspended")
    finally:
        release.set()
        trainer.close()


def test_a_pod_template_the_api_server_refuses_starts_nothing_and_says_why(
    control_plane: ControlPlane, ns: str
) -> None:
    cp = control_plane
    m = job_manifest(ns)
    m["spec"]["rollout"]["template"] = {"metadata": {"annotations": {"big": "a" * 300_000}}}
    create(cp, m)

    def refused() -> dict[str, Any] | None:
        j = job(cp, ns)
        got = validation(j)
        return j if got is not None and got[:2] == ("True", "ChildRejected") else None

    j = cp.wait_for(refused, timeout=60, what="ValidationFailed/ChildRejected")
    message = (validation(j) or ("", "", ""))[2]
    assert f"the API server refuses Pod {ns}/tiny-rollout-0: HTTP 422" in message, message
    assert "metadata.annotations: Too long: must have at most 262144 bytes" in message, message
    assert j["status"]["phase"] == "Pending"
    assert cond(j, "SpecAccepted") == ("False", "ChildRejected")
    [event] = warnings(cp, ns, "ChildRejected")
    assert event["type"] == "Warning" and "Too long" in event["message"]
    time.sleep(3)  # several reconciles: still nothing of it made, and told once
    assert pods(cp, ns) == {}  # no pod of any role (the old code ran trainer and verifier)
    assert get(cp, ns, "configmaps", "-l", "longtail.dev/rljob=tiny")["items"] == []
    assert len(warnings(cp, ns, "ChildRejected")) == 1


def test_a_configmap_the_api_server_refuses_starts_nothing(
    control_plane: ControlPlane, ns: str
) -> None:
    cp = control_plane
    m = job_manifest(ns)
    env = [{"name": "BIG", "value": "v" * (1024 * 1024 + 100)}]
    m["spec"]["trainer"]["template"] = {"spec": {"containers": [{"name": "worker", "env": env}]}}
    create(cp, m)

    def refused() -> tuple[str, str, str] | None:
        got = validation(job(cp, ns))
        return got if got is not None and got[:2] == ("True", "ChildRejected") else None

    got = cp.wait_for(refused, timeout=60, what="ValidationFailed/ChildRejected")
    assert f"the API server refuses ConfigMap {ns}/tiny-config: HTTP 422" in got[2], got
    assert "Too long" in got[2], got
    assert job(cp, ns)["status"]["phase"] == "Pending"
    assert pods(cp, ns) == {}
    assert len(warnings(cp, ns, "ChildRejected")) == 1


def test_a_running_jobs_edit_the_api_server_refuses_keeps_it_running(
    control_plane: ControlPlane, ns: str
) -> None:
    cp = control_plane
    apply(cp, job_manifest(ns))
    wait_phase(cp, ns, "Running")
    uids = {n: p["metadata"]["uid"] for n, p in pods(cp, ns).items()}
    config = get(cp, ns, "configmap", "tiny-config")["data"]
    # A live field, applied at once, too big for the job's ConfigMap (1 MiB).
    merge_patch_spec(cp, ns, {"harvest": {"prometheus": {"query": "q" * (1024 * 1024 + 100)}}})

    def refused() -> tuple[str, str, str] | None:
        got = validation(job(cp, ns))
        return got if got is not None and got[:2] == ("True", "ChildRejected") else None

    got = cp.wait_for(refused, timeout=60, what="ValidationFailed/ChildRejected on the edit")
    assert f"the API server refuses ConfigMap {ns}/tiny-config: HTTP 422" in got[2], got
    j = job(cp, ns)
    assert j["status"]["phase"] == "Running"
    assert cond(j, "SpecAccepted") == ("False", "ChildRejected")
    time.sleep(3)  # several reconciles: nothing deleted, the accepted spec stays
    assert {n: p["metadata"]["uid"] for n, p in pods(cp, ns).items()} == uids
    assert live_pods(cp, ns) == ALL_PODS
    assert get(cp, ns, "configmap", "tiny-config")["data"] == config
    merge_patch_spec(cp, ns, {"harvest": {"prometheus": {"query": "up"}}})  # fixed
    cp.wait_for(
        lambda: (validation(job(cp, ns)) or ("",))[0] == "False",
        timeout=60,
        what="ValidationFailed False once the edit fits",
    )
