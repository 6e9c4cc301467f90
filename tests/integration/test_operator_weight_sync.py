"""``spec.weightSync`` against the real v1.20 control plane (issue #33, deliverable 7).

An RLJob with ``weightSync.transport: broadcast`` gets trainer pods that host the weight-sync
store (``--weight-sync broadcast --weight-sync-port P``), rollout pods that dial it on trainer
pod 0's stable DNS name (``--weight-sync-addr``, their weights URL kept for the HTTP
catch-up), and the NetworkPolicy ``<job>-weight-sync`` that admits port P from the rollout pods
and every TCP port among the trainer and rollout pods (each attempt's gloo/NCCL group). A bad
``spec.weightSync`` is refused by the API server (the CRD's enum and bounds) on create and on
an edit of the running job, naming the field, the value and what is allowed; a valid change of
the running job's transport is refused by the operator's spec gate (frozen field) with the fix,
and applies once the job is suspended (the policy goes with the broadcast transport).
Fixtures (the operator as its limited identity, the fake kubelet): ``opharness.py``; the pure
builders: ``tests/unit/operator/test_weight_sync.py``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from opharness import apply, cond, get, job, job_manifest, pods, trainer_at, wait_phase

from longtail_operator.settings import Settings

if TYPE_CHECKING:
    from conftest import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def args_of(pod: dict[str, Any]) -> list[str]:
    [c] = [c for c in pod["spec"]["containers"] if c["name"] == "worker"]
    return c["args"]  # type: ignore[no-any-return]


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def policy_names(cp: ControlPlane, ns: str) -> set[str]:
    return {p["metadata"]["name"] for p in get(cp, ns, "networkpolicies")["items"]}


def check_broadcast_pods(cp: ControlPlane, ns: str, port: int) -> None:
    host = f"tiny-trainer-0.tiny-trainer.{ns}.svc"
    got = pods(cp, ns)
    trainer = args_of(got["tiny-trainer-0"])
    assert flag(trainer, "--weight-sync") == "broadcast", trainer
    assert flag(trainer, "--weight-sync-port") == str(port), trainer
    [c] = got["tiny-trainer-0"]["spec"]["containers"]
    assert {"name": "weight-sync", "containerPort": port, "protocol": "TCP"} in c["ports"]
    for name in ("tiny-rollout-0", "tiny-rollout-1"):
        rollout = args_of(got[name])
        assert flag(rollout, "--weight-sync") == "broadcast", rollout
        assert flag(rollout, "--weight-sync-addr") == f"{host}:{port}", rollout
        env = {e["name"]: e.get("value") for e in got[name]["spec"]["containers"][0]["env"]}
        assert env["LONGTAIL_WEIGHTS_URL"].startswith(f"http://{host}:")  # the HTTP catch-up
    assert not [a for a in args_of(got["tiny-verifier-0"]) if a.startswith("--weight-sync")]


def check_policy(cp: ControlPlane, ns: str, uid: str, port: int) -> None:
    policy = get(cp, ns, "networkpolicy", "tiny-weight-sync")
    assert [o["uid"] for o in policy["metadata"]["ownerReferences"]] == [uid]
    spec = policy["spec"]
    members = spec["podSelector"]
    assert members["matchLabels"] == {"longtail.dev/rljob": "tiny"}
    assert members["matchExpressions"] == [
        {"key": "longtail.dev/role", "operator": "In", "values": ["trainer", "rollout"]}
    ]
    store, group = spec["ingress"]
    rollouts = {"matchLabels": {"longtail.dev/rljob": "tiny", "longtail.dev/role": "rollout"}}
    assert store == {
        "from": [{"podSelector": rollouts}],
        "ports": [{"protocol": "TCP", "port": port}],
    }
    assert group == {"from": [{"podSelector": members}], "ports": [{"protocol": "TCP"}]}
    # The job-wide policy still admits the worker ports only.
    workers = get(cp, ns, "networkpolicy", "tiny-workers")["spec"]["ingress"][0]["ports"]
    assert port not in {p["port"] for p in workers}


def refused(cp: ControlPlane, *args: str, manifest: dict[str, Any] | None = None) -> str:
    """kubectl's stderr for a call the API server must refuse."""
    text = yaml.safe_dump(manifest) if manifest is not None else None
    proc = cp.kubectl(*args, input=text, check=False)
    assert proc.returncode != 0, proc.stdout
    return str(proc.stderr)


def test_broadcast_job_gets_the_rendezvous_and_its_policy_and_bad_weight_sync_is_refused(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings
) -> None:
    cp = control_plane
    port = settings.weight_sync_port
    trainer = trainer_at(kubelet, settings, ns)
    try:
        # A bad spec.weightSync is refused on create: the field, the value, what is allowed.
        bad = job_manifest(ns, "bad", weightSync={"transport": "nccl", "bucketMB": 0})
        err = refused(cp, "apply", "-f", "-", manifest=bad)
        assert 'spec.weightSync.transport: Unsupported value: "nccl"' in err, err
        assert 'supported values: "auto", "http", "broadcast"' in err, err
        assert "spec.weightSync.bucketMB: Invalid value: 0" in err, err
        assert "greater than or equal to 1" in err, err
        assert cp.kubectl("-n", ns, "get", "rljob", "bad", check=False).returncode != 0

        m = job_manifest(ns, weightSync={"transport": "broadcast"})
        apply(cp, m)
        uid = wait_phase(cp, ns, "Running")["metadata"]["uid"]
        check_broadcast_pods(cp, ns, port)
        cp.wait_for(
            lambda: "tiny-weight-sync" in policy_names(cp, ns), timeout=30, what="the policy"
        )
        check_policy(cp, ns, uid, port)

        # Edits of the running job: a bad value is refused by the API server (stored spec
        # unchanged); a valid transport change is refused by the operator, with the fix.
        patch = json.dumps({"spec": {"weightSync": {"phaseTimeoutSeconds": 1}}})
        err = refused(cp, "-n", ns, "patch", "rljob", "tiny", "--type=merge", "-p", patch)
        assert "spec.weightSync.phaseTimeoutSeconds: Invalid value: 1" in err, err
        assert "greater than or equal to 5" in err, err
        assert job(cp, ns)["spec"]["weightSync"]["phaseTimeoutSeconds"] == 120
        m["spec"]["weightSync"] = {"transport": "http"}
        apply(cp, m)

        def gated() -> dict[str, Any] | None:
            j = job(cp, ns)
            return j if cond(j, "SpecAccepted") == ("False", "ImmutableFieldChanged") else None

        j = cp.wait_for(gated, timeout=30, what="the transport change refused")
        text = next(c["message"] for c in j["status"]["conditions"] if c["type"] == "SpecAccepted")
        assert "spec.weightSync.transport: 'broadcast' -> 'http'" in text, text
        assert "spec.suspend: true" in text, text
        check_broadcast_pods(cp, ns, port)  # the running pods keep the transport
        assert "tiny-weight-sync" in policy_names(cp, ns)

        # Suspended, the change applies: no pod is left to use the policy, and it goes.
        m["spec"]["suspend"] = True
        apply(cp, m)
        wait_phase(cp, ns, "Suspended")
        cp.wait_for(
            lambda: "tiny-weight-sync" not in policy_names(cp, ns),
            timeout=30,
            what="the weight-sync policy removed with the broadcast transport",
        )
        assert {"tiny-workers", "tiny-trainers"} <= policy_names(cp, ns)
    finally:
        trainer.close()
