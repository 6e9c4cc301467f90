"""The generated CRD: drift check, structural-schema shape, docs, and examples vs schema."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from longtail_api import policies, spec, status
from longtail_api.crdgen import main as crdgen_main
from longtail_api.fields import field_docs
from longtail_api.manifest import load_yaml_documents
from longtail_api.schema import build_crd, render_crd, rljob_json_schema

REPO = Path(__file__).resolve().parents[3]
CRD = REPO / "crds" / "rljob.yaml"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
BENCH_JOBS = sorted((REPO / "bench" / "jobs").glob("*.yaml"))  # jobs the benchmarks simulate


def _api_dataclasses() -> list[type]:
    mods = (spec, policies, status)
    return [
        obj
        for m in mods
        for obj in vars(m).values()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == m.__name__
    ]


def test_committed_crd_matches_generator() -> None:
    assert CRD.read_text() == render_crd(), "crds/rljob.yaml drifted: run `make crds`"


def test_hand_edit_is_detected_by_crdgen(tmp_path: Path) -> None:
    edited = tmp_path / "rljob.yaml"
    edited.write_text(CRD.read_text().replace("minimum: 2", "minimum: 1", 1))
    assert crdgen_main(["--check", str(edited)]) == 1
    assert crdgen_main(["--check", str(CRD)]) == 0


def test_hand_edit_fails_make_verify(tmp_path: Path) -> None:
    edited = tmp_path / "rljob.yaml"
    edited.write_text(CRD.read_text() + "# hand edit\n")
    cmd = ["make", "-s", "verify", f"CRD_FILES={edited}", f"PY={sys.executable}"]
    bad = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    assert bad.returncode != 0
    assert "DRIFT" in bad.stdout
    good = subprocess.run(cmd[:3] + cmd[4:], cwd=REPO, capture_output=True, text=True, check=False)
    assert good.returncode == 0, good.stdout + good.stderr


@pytest.mark.parametrize("cls", _api_dataclasses(), ids=lambda c: c.__name__)
def test_every_api_field_has_a_docstring(cls: type) -> None:
    docs = field_docs(cls)
    missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
    assert not missing, f"{cls.__name__}: fields without a docstring: {missing}"


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for key, sub in node.get("properties", {}).items():
        out += _walk(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        out += _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        out += _walk(node["additionalProperties"], f"{path}{{}}")
    return out


def test_schema_is_structural() -> None:
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(root):
        typed = "type" in node or node.get("x-kubernetes-int-or-string")
        assert typed, f"{path} has no type (a structural schema needs one everywhere)"
        if node.get("type") == "object" and path not in ("", ".metadata"):
            assert (
                "properties" in node
                or "additionalProperties" in node
                or node.get("x-kubernetes-preserve-unknown-fields")
            ), f"{path}: object without properties"


def test_crd_metadata_and_printer_columns() -> None:
    crd = build_crd()
    names = crd["spec"]["names"]
    assert crd["metadata"]["name"] == "rljobs.longtail.dev"
    assert (names["kind"], names["plural"], names["shortNames"]) == ("RLJob", "rljobs", ["rlj"])
    assert names["categories"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    cols = [c["name"] for c in version["additionalPrinterColumns"]]
    want = ["Phase", "Step", "Reward", "Accept", "GPUs", "Idle", "Harvested", "Drafter"]
    assert cols == [*want, "Ready", "Spec", "Age"]
    spec_col = version["additionalPrinterColumns"][-2]["jsonPath"]
    assert spec_col == '.status.conditions[?(@.type=="SpecAccepted")].reason'
    spec_schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec_schema["required"] == ["model", "dataset"]
    replicas = spec_schema["properties"]["rollout"]["properties"]["replicas"]
    assert (replicas["default"], replicas["minimum"]) == (2, 1)
    assert spec_schema["properties"]["rollout"]["properties"]["template"][
        "x-kubernetes-preserve-unknown-fields"
    ]


def test_defaults_in_schema_match_dataclass_defaults() -> None:
    props = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    speculative = props["spec"]["properties"]["speculative"]
    assert speculative["properties"]["batchThreshold"]["default"] == 32
    # Defaulted by engine after parsing (defaulting.py): no default here or in its parent's.
    assert "default" not in speculative["properties"]["strategies"]
    assert "strategies" not in speculative["default"]
    assert speculative["default"]["selector"]["buckets"] == [1, 2, 4, 8, 16, 32]


@pytest.mark.parametrize("path", EXAMPLES + BENCH_JOBS, ids=lambda p: p.name)
def test_examples_validate_against_crd_schema(path: Path) -> None:
    schema = rljob_json_schema()
    for doc in load_yaml_documents(path):
        jsonschema.Draft4Validator(schema).validate(doc)


def test_crd_schema_rejects_bad_values() -> None:
    doc = yaml.safe_load((REPO / "examples" / "01-tiny-arith.yaml").read_text())
    doc["spec"]["rollout"]["replicas"] = 0
    doc["spec"]["algorithm"]["groupSize"] = "eight"
    errors = list(jsonschema.Draft4Validator(rljob_json_schema()).iter_errors(doc))
    paths = sorted(".".join(str(p) for p in e.absolute_path) for e in errors)
    assert paths == ["spec.algorithm.groupSize", "spec.rollout.replicas"]
