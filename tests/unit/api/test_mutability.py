"""Frozen and live RLJob fields (``longtail_api.mutability``, issue #32 item 2): the diff the
operator refuses, the overlay it applies, the CEL transition rules in the CRD, and the table in
docs/operator.md, all from one list."""

from __future__ import annotations

import copy
import dataclasses
import typing
from pathlib import Path
from typing import Any

import yaml

from longtail_api.fields import constraints, json_name
from longtail_api.manifest import validate_manifest
from longtail_api.mutability import LIVE_FIELDS, cel_rules, frozen_changes, kind, overlay_live
from longtail_api.schema import build_crd
from longtail_api.spec import RLJobSpec

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "01-tiny-arith.yaml"


def manifest() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())  # type: ignore[no-any-return]


def spec(m: dict[str, Any]) -> RLJobSpec:
    checked = validate_manifest(m)
    assert checked.ok and checked.spec is not None, checked.errors
    return checked.spec


def paths(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return [c.path for c in frozen_changes(spec(old), spec(new))]


def test_pod_computing_fields_are_frozen_and_operator_fields_live() -> None:
    base = manifest()
    edit = copy.deepcopy(base)
    edit["spec"]["rollout"]["engine"] = "vllm"
    edit["spec"]["drafterTraining"]["layout"] = "eagle1"
    edit["spec"]["trainer"]["image"] = "other:1"
    edit["spec"]["algorithm"]["totalSteps"] = 40
    for live in ("suspend", "backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished"):
        edit["spec"][live] = 1 if live != "suspend" else True
    edit["spec"]["rollout"]["replicas"] = 5
    edit["spec"]["trainer"]["replicas"] = 2
    edit["spec"]["harvest"]["idleSeconds"] = 9.0
    edit["spec"]["drafter"] = {"replicas": 1}  # a new role: live
    got = [str(c) for c in frozen_changes(spec(base), spec(edit))]
    # Example 01 lists no strategies: the engine's set changes with the engine (defaulting.py),
    # and the refusal says so too (history and hybrid dropped for vLLM).
    strategies = next(c for c in got if c.startswith("spec.speculative.strategies: [{"))
    old_set, new_set = (len(s.strategies) for s in (spec(base).speculative, spec(edit).speculative))
    assert (old_set, new_set) == (6, 3)
    assert [c for c in got if c != strategies] == [
        "spec.algorithm.totalSteps: 20 -> 40",
        "spec.rollout.engine: 'torch' -> 'vllm'",
        "spec.trainer.image: null -> 'other:1'",
        "spec.drafterTraining.layout: 'longtail' -> 'eagle1'",
    ]
    with_drafter = copy.deepcopy(edit)
    with_drafter["spec"]["drafter"] = {"replicas": 3, "image": "d:2"}
    assert paths(edit, with_drafter) == ["spec.drafter.image"]  # replicas live, image frozen
    assert paths(with_drafter, base) == paths(edit, base)  # removing the role: live
    edit["spec"]["model"]["path"] = "/models/x"
    edit["spec"]["drafterTraining"]["initialDrafter"] = "/drafters/x"
    assert "spec.model.path" in paths(base, edit)


def test_every_frozen_leaf_has_a_cel_rule() -> None:
    """Each frozen leaf has a CEL transition rule (its own, or its block's), except free-form
    pod templates; a new spec field is frozen unless it is added to LIVE_FIELDS."""
    hints_of = typing.get_type_hints
    seen = 0

    def walk(cls: type, prefix: str) -> None:
        nonlocal seen
        for f in dataclasses.fields(cls):
            path = prefix + json_name(f)
            tp = hints_of(cls)[f.name]
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            inner = tp if dataclasses.is_dataclass(tp) else (args[0] if args else None)
            if path in LIVE_FIELDS and path != "drafter":
                continue
            if isinstance(inner, type) and dataclasses.is_dataclass(inner):
                walk(inner, path + ".")
            elif not constraints(f).free_form:
                seen += 1
                assert any(
                    r["message"].startswith(f"spec.{p}")
                    for r in cel_rules()
                    for p in (path, path.rsplit(".", 1)[0], path.split(".", 1)[0])
                ), f"spec.{path} has no CEL transition rule"

    walk(RLJobSpec, "")
    assert seen > 40


def test_overlay_takes_live_fields_only() -> None:
    base = manifest()["spec"]
    edit = copy.deepcopy(base)
    edit["rollout"].update(replicas=4, engine="vllm")
    edit["backoffLimit"] = 0
    edit["model"]["path"] = "/elsewhere"
    edit["drafter"] = {"replicas": 2}
    out = overlay_live(base, edit)
    assert out["rollout"]["replicas"] == 4 and out["rollout"]["engine"] == "torch"
    assert out["backoffLimit"] == 0 and out["model"]["path"] == "builtin:tiny"
    assert out["drafter"] == {"replicas": 2}  # a new role comes whole
    base_d = {**base, "drafter": {"replicas": 1, "image": "old:1"}}
    edit_d = {**base, "drafter": {"replicas": 3, "image": "new:2"}}
    assert overlay_live(base_d, edit_d)["drafter"] == {"replicas": 3, "image": "old:1"}
    assert "drafter" not in overlay_live(base_d, base)  # removed with the edit
    assert "suspend" not in overlay_live({**base, "suspend": True}, base)


def test_crd_carries_the_transition_rules_guarded_by_suspend() -> None:
    spec_schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]
    rules = {r["rule"] for r in spec_schema["x-kubernetes-validations"]}
    model = "self.suspend || oldSelf.suspend || (self.model == oldSelf.model)"
    engine = "self.suspend || oldSelf.suspend || (self.rollout.engine == oldSelf.rollout.engine)"
    assert {model, engine} <= rules
    assert not any("replicas" in r or "backoffLimit" in r for r in rules)
    drafter = [r for r in rules if "self.drafter." in r]
    assert drafter and all("!has(self.drafter) || !has(oldSelf.drafter)" in r for r in drafter)


def test_operator_docs_list_every_live_field() -> None:
    text = (REPO / "docs" / "operator.md").read_text()
    for path in LIVE_FIELDS:
        assert f"`{path}`" in text, f"docs/operator.md does not list the live field {path}"


def test_weight_sync_is_frozen_while_pods_exist() -> None:
    """The transport decides the pods' flags and the NetworkPolicy; bucket size and timeout
    are read by every receiver of one broadcast group, which must agree: all frozen."""
    base = manifest()
    edit = copy.deepcopy(base)
    edit["spec"]["weightSync"] = {"transport": "broadcast", "bucketMB": 64}
    assert [str(c) for c in frozen_changes(spec(base), spec(edit))] == [
        "spec.weightSync.transport: 'auto' -> 'broadcast'",
        "spec.weightSync.bucketMB: 1024 -> 64",
    ]
    assert kind("weightSync") == kind("weightSync.transport") == "frozen"
    assert overlay_live(edit["spec"], base["spec"])["weightSync"] == edit["spec"]["weightSync"]
    messages = {r["message"] for r in cel_rules()}
    assert any(m.startswith("spec.weightSync cannot change while the job runs") for m in messages)
