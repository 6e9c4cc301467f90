"""Shared builders of specs, pods and observations for the operator unit tests (optest: not
"operator", which would shadow the standard library module of that name)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from longtail_api.manifest import validate_manifest
from longtail_api.spec import RLJobSpec
from longtail_api.status import RLJobStatus
from longtail_operator import specgate
from longtail_operator.builders import JobRef
from longtail_operator.model import Observed
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


def observed(manifest: dict[str, Any], pods: list[PodView], **kw: Any) -> Observed:
    """What ``reconcile.py`` observes: the spec to run under is the spec gate's choice
    (``specgate.decide``) from the manifest as written, the ConfigMap and the pods."""
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
        "services": services,
        "configmap": None,
        "now": NOW,
    }
    defaults.update(kw)
    return Observed(**defaults)
