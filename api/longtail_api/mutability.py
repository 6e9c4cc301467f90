"""Which RLJob spec fields may change while the job runs, and which only while it is suspended.

A running job's pods are built from one spec and read that spec (the job's ConfigMap) when they
start. A field that changes what a pod computes (the model, the rollout engine, an image, the
algorithm, ...) therefore must not change while pods exist: the pods made later would compute
something else than the ones still running (issue #32: one vLLM and one torch rollout pod).
Such fields are *frozen*: they change while the job is suspended (``spec.suspend: true``, in the
same edit or before), and the operator applies the change once the job's last pod is gone, so
every pod of the resumed job is built from the new spec. The other fields, :data:`LIVE_FIELDS`,
are read by the operator alone (or, for ``replicas``, made safe by it) and apply at once.

Every spec field is frozen unless it is listed here, so a new field is safe by default.
Readers: the operator's spec gate (``longtail_operator.specgate``: :func:`frozen_changes`,
:func:`overlay_live`), the CRD generator (:func:`cel_rules`: the same rules as CEL transition
rules, for API servers that enforce them, >= 1.25), the reference (``docgen.py``: :func:`kind`)
and docs/operator.md (the table).
Pure module: standard library and ``longtail_api`` only.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from longtail_api.fields import constraints, json_name
from longtail_api.spec import RLJobSpec
from longtail_api.validation import show_value

LIVE_FIELDS: dict[str, str] = {
    "suspend": "suspending checkpoints and deletes every pod; resuming recreates them",
    "activeDeadlineSeconds": "the operator's clock",
    "backoffLimit": "the operator's count of failed pods (lowering it below the failures so far "
    "fails the job, after a last checkpoint)",
    "ttlSecondsAfterFinished": "the operator's clean-up",
    "rollout.replicas": "rollout pods are added or removed; the others keep running",
    "verifier.replicas": "verifier pods are added or removed; the others keep running",
    "trainer.replicas": "the trainer group checkpoints and restarts with the new world",
    "drafter": "adding or removing the dedicated drafter role (all its pods are made from one "
    "spec)",
    "drafter.replicas": "drafter pods are added or removed; the others keep running",
    "harvest.source": "read by the operator's harvest loop",
    "harvest.prometheus": "read by the operator's harvest loop",
    "harvest.idleUtilizationThreshold": "read by the operator's harvest loop",
    "harvest.idleSeconds": "read by the operator's harvest loop",
    "harvest.pollPeriodSeconds": "read by the operator's harvest loop",
}
"""Spec fields (paths under ``spec.``) that apply to a running job at once, and why that is
safe. ``drafter`` itself: the role may be added or removed; its other fields are frozen."""

OPTIONAL_BLOCKS = ("drafter",)
"""Live paths whose value is a whole optional block: its presence is live, its fields are not."""

SUSPEND_FIX = (
    "set spec.suspend: true (in the same edit or before; the change applies once the job's pods "
    "are gone, and resuming makes every pod from the new spec), or revert the change"
)


@dataclass(frozen=True)
class FrozenChange:
    """One frozen field whose value differs between two specs."""

    path: str
    """The field, e.g. ``spec.rollout.engine``."""
    old: Any
    """Its value in the spec the job runs under."""
    new: Any
    """Its value in the edited spec."""

    def __str__(self) -> str:
        return f"{self.path}: {show_value(self.old)} -> {show_value(self.new)}"


def _plain(value: Any) -> Any:
    """A spec value as JSON-like data (dataclasses as camelCase dicts, None fields dropped)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            json_name(f): _plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if getattr(value, f.name) is not None
        }
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _has_live_below(path: str) -> bool:
    return any(p.startswith(path + ".") for p in LIVE_FIELDS)


def kind(path: str) -> str:
    """``live``, ``frozen`` or ``per field`` (a block holding both) for a field path under
    ``spec.`` (list items as ``name[]``), as the reference (``docgen.py``) shows it."""
    if path in OPTIONAL_BLOCKS:
        return "live to add or remove (its fields: below)"
    if path in LIVE_FIELDS or any(path.startswith(p + ".") for p in LIVE_FIELDS):
        return "live"
    return "per field" if _has_live_below(path) else "frozen"


def frozen_changes(old: RLJobSpec, new: RLJobSpec) -> list[FrozenChange]:
    """Every frozen field that differs from ``old`` to ``new`` (leaves; lists as a whole)."""
    out: list[FrozenChange] = []
    _diff(old, new, "", out)
    return out


def _diff(old: Any, new: Any, prefix: str, out: list[FrozenChange]) -> None:
    for f in dataclasses.fields(old):
        path = prefix + json_name(f)
        a, b = getattr(old, f.name), getattr(new, f.name)
        if path in LIVE_FIELDS and path not in OPTIONAL_BLOCKS:
            continue
        if path in OPTIONAL_BLOCKS and (a is None or b is None):
            continue  # the role is added or removed: live
        if dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b):
            _diff(a, b, path + ".", out)
        elif _plain(a) != _plain(b):
            out.append(FrozenChange(f"spec.{path}", _plain(a), _plain(b)))


def overlay_live(applied: dict[str, Any], edited: dict[str, Any]) -> dict[str, Any]:
    """``applied`` (a raw spec) with every live field taken from ``edited``: the edit minus its
    frozen changes. A live field absent from ``edited`` is removed."""
    out = copy.deepcopy(applied)
    for path in sorted(LIVE_FIELDS, key=lambda p: p.count(".")):
        *parents, leaf = path.split(".")
        src: Any = edited
        dst: Any = out
        for part in parents:
            src = src.get(part) if isinstance(src, dict) else None
            dst = dst.get(part) if isinstance(dst, dict) else None
        if not isinstance(dst, dict):
            continue  # the block is absent in the result (a removed optional role)
        has = isinstance(src, dict) and leaf in src
        if path in OPTIONAL_BLOCKS and has and leaf in dst:
            continue  # present on both sides: its live fields are overlaid one by one
        if has:
            dst[leaf] = copy.deepcopy(src[leaf])
        else:
            dst.pop(leaf, None)
    return out


def cel_rules() -> list[dict[str, str]]:
    """The frozen fields as CEL transition rules on ``spec`` (one per field or block): a change
    is admitted only with ``suspend`` true in the new or the old object. Free-form pod
    templates are left out (CEL cannot see inside them); the operator refuses those edits."""
    rules: list[dict[str, str]] = []
    _cel(RLJobSpec, "", [], rules)
    return rules


def _cel(cls: type, prefix: str, guards: list[str], rules: list[dict[str, str]]) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = prefix + json_name(f)
        tp = hints[f.name]
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        block = tp if dataclasses.is_dataclass(tp) else (members[0] if members else None)
        if path in OPTIONAL_BLOCKS and isinstance(block, type):
            guard = f"!has(self.{path}) || !has(oldSelf.{path})"
            _cel(block, path + ".", [*guards, guard], rules)
            continue
        if path in LIVE_FIELDS or constraints(f).free_form:
            continue
        if isinstance(block, type) and dataclasses.is_dataclass(block) and _has_live_below(path):
            _cel(block, path + ".", guards, rules)
            continue
        same = f"self.{path} == oldSelf.{path}"
        if f.default is None:  # no default: the field may be absent on either side
            same = f"has(self.{path}) == has(oldSelf.{path}) && (!has(self.{path}) || {same})"
        rule = " || ".join(["self.suspend", "oldSelf.suspend", *guards, f"({same})"])
        message = f"spec.{path} cannot change while the job runs: {SUSPEND_FIX}"
        rules.append({"rule": rule, "message": message})
