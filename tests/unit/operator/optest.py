"""Shared builders of specs, pods and observations for the operator unit tests (optest: not
"operator", which would shadow the standard library module of that name)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from longtail_api.manifest import validate_manifest
from longtail_api.scheduling import GROUP_APIS
from longtail_api.spec import RLJobSpec
from longtail_api.status import RLJobStatus
from longtail_operator import access, specgate
from longtail_operator.builders import JobRef
from longtail_operator.model import ObjectKey, Observed
from longtail_operator.observe import PodView

REPO = Path(__file__).resolve().parents[3]
JOB = JobRef(name="tiny", namespace="ns", uid="uid-1", generation=2)
NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def example(**spec_changes: Any) -> dict[str, Any]:
    manifest = yaml.safe_load((REPO / "examples" / "01-tiny-arith.yaml").read_text())
    manifest["metadata"]["name"] = JOB.name
    for dotted, value in spec_changes.items():
        cur = manifest["spec"]
        *parents, last = dotted.split("__")
        for part in parents:
            cur = cur.setdefault(part, {})
        cur[last] = value
    return manifest  # type: ignore[no-any-return]


def spec_of(manifest: dict[str, Any]) -> RLJobSpec:
    result = validate_manifest(manifest)
    assert result.ok, result.errors
    assert result.spec is not None
    return result.spec


def pod(
    role: str,
    index: int,
    phase: str = "Running",
    ready: bool = True,
    *,
    uid: str | None = None,
    deleting: bool = False,
    ip: str | None = "10.0.0.1",
) -> PodView:
    return PodView(
        name=f"{JOB.name}-{role}-{index}",
        role=role,
        index=index,
        uid=uid or f"uid-{role}-{index}",
        phase=phase,
        ready=ready and phase == "Running",
        ip=ip,
        deleting=deleting,
    )


def all_pods(spec: RLJobSpec, **kw: Any) -> list[PodView]:
    from longtail_operator.builders import desired_pods

    return [pod(role, i, **kw) for role, i in desired_pods(spec).values()]


POLICIES = {
    "network_policy": access.network_policy_name,
    "trainer_policy": access.trainer_policy_name,
    "weight_sync_policy": access.weight_sync_policy_name,
}
"""The flags :func:`observed` takes for the job's NetworkPolicies (True: found)."""


def policy_key(name: str) -> ObjectKey:
    """The key of one of the job's NetworkPolicies."""
    return ObjectKey(access.POLICY_API, "NetworkPolicy", name)


def owned(
    spec: RLJobSpec | None,
    services: frozenset[str],
    configmap: dict[str, Any] | None,
    gang_group: bool | None = None,
    **policies: bool | None,
) -> dict[ObjectKey, dict[str, Any]]:
    """``Observed.owned`` from the names and flags the tests speak in: the Services by name,
    the ConfigMap's ``data``, and which policies and gang group were found (True)."""
    out: dict[ObjectKey, dict[str, Any]] = {
        ObjectKey("v1", "Service", name): {"metadata": {"name": name}} for name in services
    }
    if configmap is not None:
        out[ObjectKey("v1", "ConfigMap", f"{JOB.name}-config")] = {"data": configmap}
    for flag, found in policies.items():
        if found:
            name = POLICIES[flag](JOB.name)
            out[ObjectKey(access.POLICY_API, "NetworkPolicy", name)] = {}
    gang = spec.scheduling.gang if spec is not None else None
    if gang_group and gang is not None:
        api_version = "/".join(GROUP_APIS[gang.backend])
        out[ObjectKey(api_version, "PodGroup", JOB.name)] = {}
    return out


def observed(manifest: dict[str, Any], pods: list[PodView], **kw: Any) -> Observed:
    """What ``reconcile.py`` observes: the spec to run under is the spec gate's choice
    (``specgate.decide``) from the manifest as written, the ConfigMap and the pods. The owned
    objects come as ``services`` (names; by default the three roles' Services), ``configmap``
    (its ``data``), and flags for the policies and the gang group (:func:`owned`)."""
    result = validate_manifest(manifest)
    services = frozenset(f"{JOB.name}-{r}" for r in ("trainer", "verifier", "rollout"))
    errors = tuple(str(e) for e in result.errors)
    previous = kw.get("previous", RLJobStatus())
    gate = specgate.decide(
        result.spec,
        copy.deepcopy(manifest["spec"]),
        errors,
        kw.get("configmap"),
        pods,
        finished=previous.phase in ("Succeeded", "Failed"),
    )
    defaults: dict[str, Any] = {
        "job": JOB,
        "spec": gate.spec,
        "raw_spec": gate.raw_spec,
        "errors": errors,
        "gate": gate,
        "previous": previous,
        "pods": tuple(pods),
        "now": NOW,
    }
    flags = {k: kw.pop(k) for k in (*POLICIES, "gang_group") if k in kw}
    found = owned(gate.spec, kw.pop("services", services), kw.pop("configmap", None), **flags)
    defaults.update(kw)
    return Observed(owned=found, **defaults)
