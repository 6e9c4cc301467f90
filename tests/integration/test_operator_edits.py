"""Edits of a running RLJob against the real v1.20 control plane (issue #32, items 2-4).

The operator runs in-process as the limited identity (``opharness.py``), the fake kubelet plays
the pods. Item 2: changing ``rollout.engine`` on a running job is refused (v1.20 drops the CRD's
CEL transition rules, so the operator's own gate is what acts): status and ``kubectl get``
say so, and a failed rollout pod comes back as the torch pod it was, never a vLLM one next to
torch ones; with ``suspend`` the change applies once the pods are gone, to every pod. Item 3:
an invalid edit leaves the job managed (a failed pod is replaced) and shows in the Spec column.
Item 4: lowering ``backoffLimit`` below the failures so far checkpoints (the loopback
``FakeTrainer`` records it) before the phase turns Failed. Pure-planner versions:
``tests/unit/operator/test_spec_edits.py``.
"""

from __future__ import annotations

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

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]


def vllm(ns: str, **spec: Any) -> dict[str, Any]:
    """The job edited to the vLLM engine (valid: vLLM needs the eagle1 drafter layout)."""
    m = job_manifest(ns, **spec)
    m["spec"]["rollout"]["engine"] = "vllm"
    m["spec"]["drafterTraining"]["layout"] = "eagle1"
    return m


def engine(p: dict[str, Any]) -> str:
    """A rollout pod's engine as built: vLLM pods get a shared-memory volume, torch pods none."""
    return "vllm" if any(v["name"] == "dshm" for v in p["spec"]["volumes"]) else "torch"


def configmap_engine(cp: ControlPlane, ns: str) -> str:
    cm = get(cp, ns, "configmap", "tiny-config")
    return str(yaml.safe_load(cm["data"]["rljob.yaml"])["spec"]["rollout"]["engine"])


def row(cp: ControlPlane, ns: str) -> dict[str, str]:
    """``kubectl get rljobs`` as kubectl v1.20 prints it, column name -> value (cut at the
    headers' offsets: a column without a value prints nothing)."""
    head, line = cp.kubectl("-n", ns, "get", "rljobs").stdout.splitlines()[:2]
    starts = [i for i, c in enumerate(head) if c != " " and (i == 0 or head[i - 1] == " ")]
    ends = [*starts[1:], None]
    return {head[a:b].strip(): line[a:b].strip() for a, b in zip(starts, ends, strict=True)}


def replaced(cp: ControlPlane, ns: str, kubelet: Any, name: str) -> dict[str, Any]:
    """Fail pod ``name`` and wait until a new pod of that name runs; return it."""
    old = pods(cp, ns)[name]["metadata"]["uid"]
    kubelet.fail(ns, name)

    def back() -> dict[str, Any] | None:
        p = pods(cp, ns).get(name)
        fresh = p is not None and p["metadata"]["uid"] != old
        return p if fresh and p["status"].get("phase") == "Running" else None

    return cp.wait_for(back, timeout=60, what=f"{name} replaced")


def spec_reason(cp: ControlPlane, ns: str, want: tuple[str, str]) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        j = job(cp, ns)
        return j if cond(j, "SpecAccepted") == want else None

    return cp.wait_for(check, timeout=60, what=f"SpecAccepted {want}")


def test_running_job_refuses_frozen_edits_keeps_managing_and_applies_them_suspended(
    control_plane: ControlPlane, ns: str, kubelet: Any
) -> None:
    cp = control_plane
    apply(cp, job_manifest(ns))
    wait_phase(cp, ns, "Running")
    assert row(cp, ns)["SPEC"] == "Accepted" and row(cp, ns)["READY"] == "4/4"
    # Item 2: the engine edit is stored (no CEL on v1.20) but refused by the operator.
    apply(cp, vllm(ns))
    j = spec_reason(cp, ns, ("False", "ImmutableFieldChanged"))
    text = next(c["message"] for c in j["status"]["conditions"] if c["type"] == "SpecAccepted")
    assert "spec.rollout.engine: 'torch' -> 'vllm'" in text and "spec.suspend: true" in text
    assert row(cp, ns)["SPEC"] == "ImmutableFieldChanged"
    assert "ImmutableFieldChanged" in events(cp, ns)
    assert engine(replaced(cp, ns, kubelet, "tiny-rollout-1")) == "torch"
    assert {engine(p) for n, p in pods(cp, ns).items() if "rollout" in n} == {"torch"}
    assert configmap_engine(cp, ns) == "torch"
    # Item 3: an invalid edit (a cross-field rule; CEL is dropped on v1.20) keeps the job
    # managed under the accepted spec, and the Spec column says why.
    broken = job_manifest(ns)
    broken["spec"]["rollout"]["engine"] = "vllm"  # with the longtail layout: invalid
    apply(cp, broken)
    spec_reason(cp, ns, ("False", "InvalidSpec"))
    assert cond(job(cp, ns), "ValidationFailed") == ("True", "InvalidSpec")
    assert engine(replaced(cp, ns, kubelet, "tiny-rollout-0")) == "torch"
    j = wait_phase(cp, ns, "Running")
    assert j["status"]["roles"]["rollout"]["failed"] == 2  # both failures seen and counted
    assert row(cp, ns)["SPEC"] == "InvalidSpec"
    # The frozen edit with suspend: the pods go, then the edit applies; resumed, every rollout
    # pod is a vLLM one.
    apply(cp, vllm(ns, suspend=True))
    wait_phase(cp, ns, "Suspended")
    cp.wait_for(lambda: pods(cp, ns) == {}, timeout=60, what="pods deleted on suspend")
    spec_reason(cp, ns, ("True", "Accepted"))
    assert configmap_engine(cp, ns) == "vllm"
    apply(cp, vllm(ns, suspend=False))
    cp.wait_for(lambda: live_pods(cp, ns) == ALL_PODS, timeout=60, what="pods back on resume")
    wait_phase(cp, ns, "Running")
    assert {engine(p) for n, p in pods(cp, ns).items() if "rollout" in n} == {"vllm"}


def test_lowering_backoff_limit_checkpoints_before_the_job_fails(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings
) -> None:
    cp = control_plane
    trainer = trainer_at(kubelet, settings, ns)
    try:
        trainer.status = trainer.status.__class__(
            step=9, total_steps=20, phase="running", policy_version=9, drafter_version=1
        )
        apply(cp, job_manifest(ns, backoffLimit=3))
        wait_phase(cp, ns, "Running")
        replaced(cp, ns, kubelet, "tiny-rollout-0")
        wait_phase(cp, ns, "Running")
        assert trainer.checkpoints == []
        apply(cp, job_manifest(ns, backoffLimit=0))  # below the one failure so far

        def failed() -> list[int] | None:
            if job(cp, ns)["status"].get("phase") != "Failed":
                return None
            return list(trainer.checkpoints) or [-1]  # what was checkpointed by then

        assert cp.wait_for(failed, timeout=60, what="phase Failed") == [9]
        assert cond(job(cp, ns), "Failed") == ("True", "BackoffLimitExceeded")
        cp.wait_for(lambda: pods(cp, ns) == {}, timeout=60, what="pods deleted after Failed")
        assert "CheckpointSaved" in events(cp, ns)
    finally:
        trainer.close()
