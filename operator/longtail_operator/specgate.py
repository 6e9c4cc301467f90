"""The spec a job runs under: the user's edit, or the last accepted spec (issue #32, items 2-3).

``reconcile.py`` calls :func:`decide` with the RLJob's spec as written (parsed, or its validation
errors), the job's ConfigMap and its pods, before it plans anything; the planner (``derive.py``)
then builds every pod from :attr:`SpecGate.spec` and writes :attr:`SpecGate.raw_spec` into the
ConfigMap. The ConfigMap holds the spec the job's pods were made from (they read it when they
start), so it is the durable "last accepted spec": it survives an operator restart, and while
pods exist it changes only in live fields (``longtail_api.mutability``). Hence never a mixed
job: all pods of a job are made from one set of frozen fields.

- A valid edit that changes no frozen field is accepted (live fields apply at once).
- An invalid edit is not applied: the job keeps running (pods managed, failed ones recreated)
  under the last accepted spec, with ``SpecAccepted`` False/``InvalidSpec``. A job that never
  had a valid spec runs nothing.
- A spec the API server refuses to turn into objects (``reconcile.py`` asks it with a dry run
  of every object a plan creates: a pod's annotations too long, a ConfigMap over 1 MiB) is
  handled as an invalid edit, with reason ``ChildRejected`` and the API's message.
- A frozen change while the job runs is refused (``ImmutableFieldChanged``, naming each field,
  its value and the fix); the edit's live fields still apply. With ``suspend`` true (in the
  edit, or in the accepted spec) it is applied once no pod of the job is left
  (``WaitingForPodsToStop`` until then, the job held suspended), so a resumed job's pods are all
  made from the new spec. A finished job takes any edit (it runs nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from longtail_api import API_VERSION, KIND
from longtail_api.manifest import validate_manifest
from longtail_api.mutability import SUSPEND_FIX, frozen_changes, overlay_live
from longtail_api.spec import RLJobSpec
from longtail_operator.builders import CONFIG_FILE
from longtail_operator.observe import PodView

ACCEPTED = "Accepted"
INVALID = "InvalidSpec"
FROZEN = "ImmutableFieldChanged"
WAITING = "WaitingForPodsToStop"
REJECTED = "ChildRejected"


@dataclass(frozen=True)
class SpecGate:
    """What :func:`decide` found."""

    spec: RLJobSpec | None
    """The spec to run the job under now; None when the job never had a valid spec."""
    raw_spec: dict[str, Any]
    """The same as the API server stores a spec (defaults filled in): the ConfigMap's content."""
    reason: str
    """``Accepted``, ``InvalidSpec``, ``ChildRejected``, ``ImmutableFieldChanged`` or
    ``WaitingForPodsToStop``."""
    message: str
    """For people: what was not applied and how to fix it."""

    @property
    def accepted(self) -> bool:
        return self.reason == ACCEPTED


def applied_spec(configmap: dict[str, Any] | None) -> tuple[RLJobSpec, dict[str, Any]] | None:
    """The spec in the job's ConfigMap data (parsed, raw); None when there is no ConfigMap or
    it holds no valid RLJob (hand-edited, or valid under an older operator's rules only)."""
    text = (configmap or {}).get(CONFIG_FILE)
    if not isinstance(text, str):
        return None
    try:
        manifest = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    checked = validate_manifest(manifest)
    if checked.spec is None or not checked.ok or not isinstance(manifest.get("spec"), dict):
        return None
    return checked.spec, manifest["spec"]


def decide(
    edited: RLJobSpec | None,
    edited_raw: dict[str, Any],
    errors: Sequence[str],
    configmap: dict[str, Any] | None,
    pods: Sequence[PodView],
    *,
    finished: bool = False,
    rejected: Sequence[str] = (),
) -> SpecGate:
    """The spec to run under (see the module text). ``edited``: the RLJob's spec as written,
    None when it fails validation (``errors``); ``finished``: the job succeeded or failed;
    ``rejected``: the API server's refusals of objects made from it (``Kube.refusal``)."""
    applied = applied_spec(configmap)
    if edited is None or errors or rejected:
        reason = INVALID if edited is None or errors else REJECTED
        shown = "; ".join((*errors, *rejected)) or "the spec could not be parsed"
        if applied is None:
            text = f"nothing runs until it is fixed: {shown}"
            if reason == INVALID:
                text = f"nothing runs until it is valid: {shown}"
            return SpecGate(None, edited_raw, reason, text[:32000])
        text = f"still running the last accepted spec; fix the edit: {shown}"
        return SpecGate(applied[0], applied[1], reason, text[:32000])
    if applied is None or finished:
        return SpecGate(edited, edited_raw, ACCEPTED, "the job runs the spec as written")
    changes = frozen_changes(applied[0], edited)
    if not changes:
        return SpecGate(edited, edited_raw, ACCEPTED, "the job runs the spec as written")
    suspended = edited.suspend or applied[0].suspend
    if suspended and not pods:
        return SpecGate(edited, edited_raw, ACCEPTED, "the job runs the spec as written")
    spec, raw = _merged(applied, edited_raw, hold_suspended=suspended)
    shown = "; ".join(str(c) for c in changes)
    if suspended:
        left = len(pods)
        text = f"applied once the job's {left} pod(s) are gone (held suspended until then): {shown}"
        return SpecGate(spec, raw, WAITING, text[:32000])
    text = (
        f"these fields change what the pods compute and cannot change while the job runs "
        f"(still running the last accepted values): {shown}. Fix: {SUSPEND_FIX}"
    )
    return SpecGate(spec, raw, FROZEN, text[:32000])


def _merged(
    applied: tuple[RLJobSpec, dict[str, Any]], edited_raw: dict[str, Any], *, hold_suspended: bool
) -> tuple[RLJobSpec, dict[str, Any]]:
    """The accepted spec with the edit's live fields (and ``suspend`` true while a frozen
    change waits for the pods to go). When that mix breaks a cross-field rule (a live field
    checked against a frozen one), only ``suspend`` is taken from the edit."""
    raw = overlay_live(applied[1], edited_raw)
    for candidate in (raw, {**applied[1], "suspend": edited_raw.get("suspend", False)}):
        if hold_suspended:
            candidate["suspend"] = True
        checked = validate_manifest(_manifest(candidate))
        if checked.ok and checked.spec is not None:
            return checked.spec, candidate
    return applied  # unreachable in practice: the accepted spec itself was valid


def _manifest(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "x"}, "spec": spec}
