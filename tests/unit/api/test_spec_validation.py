"""RLJob validation: every error reported at once, with path, value and fix."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from longtail_api.manifest import (
    ManifestError,
    load_yaml_documents,
    validate_file,
    validate_manifest,
)
from longtail_api.spec import RLJobSpec

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
BENCH_JOBS = sorted((REPO / "bench" / "jobs").glob("*.yaml"))  # jobs the benchmarks simulate

MINIMAL: dict[str, Any] = {
    "apiVersion": "longtail.dev/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "job"},
    "spec": {"model": {"path": "builtin:tiny"}, "dataset": {"path": "builtin:arith"}},
}


def job(**spec_overrides: Any) -> dict[str, Any]:
    obj = copy.deepcopy(MINIMAL)
    obj["spec"].update(spec_overrides)
    return obj


def messages(obj: Any) -> list[str]:
    return [str(e) for e in validate_manifest(obj).errors]


def test_examples_exist_and_are_numbered() -> None:
    names = [p.name for p in EXAMPLES]
    assert "01-tiny-arith.yaml" in names and "02-qwen2.5-7b-gpu.yaml" in names
    assert all(n[:2].isdigit() and n[2] == "-" for n in names)


@pytest.mark.parametrize("path", EXAMPLES + BENCH_JOBS, ids=lambda p: p.name)
def test_examples_validate(path: Path) -> None:
    (result,) = validate_file(path)
    assert result.errors == []
    assert isinstance(result.spec, RLJobSpec)


def test_minimal_spec_gets_defaults() -> None:
    res = validate_manifest(MINIMAL)
    assert res.ok, res.errors
    s = res.spec
    assert s is not None
    assert s.rollout.replicas == 2 and s.rollout.engine == "torch"
    assert s.speculative.batch_threshold == 32
    assert [st.draft_depth for st in s.speculative.strategies] == [2, 4, 6, 4, 8, 4]
    assert s.drafter_training.window_tokens == 512
    assert s.drafter_training.loss_weights.smooth_l1 == 1.0
    assert s.drafter_training.loss_weights.cross_entropy == 0.1
    assert s.harvest.source == "workers" and s.drafter is None
    assert s.backoff_limit == 3 and s.suspend is False


def test_three_distinct_mistakes_all_reported() -> None:
    obj = job(algorithm={"groupSize": "eight"}, rollout={"replicas": -1, "enigne": "torch"})
    msgs = messages(obj)
    assert len(msgs) == 3, msgs
    assert "spec.algorithm.groupSize: must be an integer, got 'eight'" in msgs
    assert "spec.rollout.replicas: must be >= 1, got -1" in msgs
    unknown = [m for m in msgs if m.startswith("spec.rollout.enigne: unknown field")]
    assert unknown and "did you mean 'engine'?" in unknown[0]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"algorithm": {"groupSize": 1}}, "spec.algorithm.groupSize: must be >= 2, got 1"),
        ({"algorithm": {"learningRate": 0}}, "spec.algorithm.learningRate: must be > 0, got 0.0"),
        ({"algorithm": {"clipRatio": 1.0}}, "spec.algorithm.clipRatio: must be < 1, got 1.0"),
        ({"algorithm": {"topP": 1.5}}, "spec.algorithm.topP: must be <= 1, got 1.5"),
        ({"algorithm": {"seed": True}}, "spec.algorithm.seed: must be an integer, got true"),
        ({"algorithm": {"totalSteps": 2.0}}, "spec.algorithm.totalSteps: must be an integer"),
        ({"algorithm": {"temperature": "hot"}}, "spec.algorithm.temperature: must be a number"),
        ({"rollout": {"engine": "vlm"}}, "did you mean 'vllm'?"),
        ({"rollout": {"resources": {"memory": "4 GB"}}}, "must be a Kubernetes quantity"),
        ({"rollout": {"resources": {"cpu": [1]}}}, "must be an integer or a string"),
        ({"rollout": {"template": "x"}}, "spec.rollout.template: must be a mapping"),
        ({"rollout": 3}, "spec.rollout: must be a mapping, got 3"),
        ({"trainer": {"replicas": 0}}, "spec.trainer.replicas: must be >= 1"),
        ({"trainer": {"microBatchTokens": -1}}, "spec.trainer.microBatchTokens: must be >= 0"),
        ({"speculative": {"strategies": []}}, "must have at least 1 item(s)"),
        ({"speculative": {"strategies": [{"draftDepth": 0}]}}, "strategies[0].draftDepth"),
        ({"harvest": {"eligibleRoles": ["gpu"]}}, "spec.harvest.eligibleRoles[0]: must be one of"),
        ({"suspend": "yes"}, "spec.suspend: must be true or false, got 'yes'"),
        ({"checkpoint": {"persistentVolumeClaim": "Bad_Name"}}, "PersistentVolumeClaim name"),
        ({"model": {}}, "spec.model.path: is required"),
        ({"model": {"path": ""}}, "spec.model.path: must not be empty"),
    ],
)
def test_field_errors(spec: dict[str, Any], expected: str) -> None:
    msgs = messages(job(**spec))
    assert any(expected in m for m in msgs), msgs


def test_missing_required_blocks() -> None:
    obj = copy.deepcopy(MINIMAL)
    del obj["spec"]["dataset"]
    res = validate_manifest(obj)
    assert [str(e) for e in res.errors] == ["spec.dataset: is required"]
    assert res.spec is None


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {
                "drafterTraining": {"enabled": False},
                "harvest": {"enabled": False},
                "speculative": {"strategies": [{"draftDepth": 4}]},
            },
            "spec.speculative.enabled: speculative decoding needs a drafter",
        ),
        (
            {"speculative": {"strategies": [{"draftDepth": 4, "verifyTokens": 2}]}},
            "spec.speculative.strategies[0].verifyTokens: must be >= draftDepth (4), got 2",
        ),
        (
            {"speculative": {"selector": {"type": "fixed", "fixedIndex": 6}}},
            "spec.speculative.selector.fixedIndex: must be < the number of strategies (6)",
        ),
        (
            {"speculative": {"selector": {"buckets": [4, 2]}}},
            "spec.speculative.selector.buckets: must be positive and strictly increasing",
        ),
        ({"harvest": {"source": "prometheus"}}, "spec.harvest.prometheus.url: is required"),
        (
            {"speculative": {"enabled": False}, "drafterTraining": {"enabled": False}},
            "spec.harvest.enabled: harvesting idle GPUs trains the drafter",
        ),
        (
            {"harvest": {"eligibleRoles": ["rollout", "rollout"]}},
            "spec.harvest.eligibleRoles: must not repeat",
        ),
        ({"rollout": {"engine": "vllm"}}, "spec.drafterTraining.layout: must be 'eagle1' when"),
        (
            {"trainer": {"replicas": 2}, "harvest": {"eligibleRoles": ["rollout", "trainer"]}},
            "spec.harvest.eligibleRoles: the trainer is sharded over 2 ranks",
        ),
        (
            {"trainer": {"resources": {"gpus": 4}}, "harvest": {"eligibleRoles": ["trainer"]}},
            "spec.harvest.eligibleRoles: the trainer is sharded over 4 ranks",
        ),
        (
            {
                "rollout": {"engine": "vllm"},
                "drafterTraining": {"layout": "eagle1"},
                "speculative": {"strategies": [{"draftDepth": 3, "verifyTokens": 8}]},
            },
            "spec.speculative.strategies[0].verifyTokens: vLLM drafts chains only",
        ),
        (
            {
                "drafter": {},
                "drafterTraining": {"enabled": False},
                "speculative": {"enabled": False},
                "harvest": {"enabled": False},
            },
            "spec.drafter: a dedicated drafter role needs drafterTraining.enabled",
        ),
    ],
)
def test_cross_field_rules(spec: dict[str, Any], expected: str) -> None:
    msgs = messages(job(**spec))
    assert any(m.startswith(expected) for m in msgs), msgs


def test_cross_field_rule_is_fine_with_an_initial_drafter() -> None:
    obj = job(
        drafterTraining={"enabled": False, "initialDrafter": "/d"}, harvest={"enabled": False}
    )
    assert messages(obj) == []


def test_builtin_drafter_is_accepted_for_its_own_model() -> None:
    assert messages(job(drafterTraining={"initialDrafter": "builtin:tiny"})) == []


def test_builtin_drafter_for_another_model_names_the_field_value_and_fix() -> None:
    obj = job(model={"path": "/models/qwen"}, drafterTraining={"initialDrafter": "builtin:tiny"})
    (msg,) = messages(obj)
    assert msg.startswith("spec.drafterTraining.initialDrafter: the built-in drafter builtin:tiny")
    assert "'/models/qwen'" in msg and "longtail drafter fit" in msg


def test_unknown_builtin_drafter_lists_the_known_ones() -> None:
    (msg,) = messages(job(drafterTraining={"initialDrafter": "builtin:huge"}))
    assert "unknown built-in drafter; built-in drafters: builtin:tiny" in msg
    assert "'builtin:huge'" in msg


def test_cross_field_rule_skipped_when_its_input_is_invalid() -> None:
    # drafterTraining.enabled is invalid: the drafter-source rule must not pile on.
    msgs = messages(job(drafterTraining={"enabled": "no"}))
    assert msgs == ["spec.drafterTraining.enabled: must be true or false, got 'no'"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda o: o.update(apiVersion="v1"), "apiVersion: must be 'longtail.dev/v1alpha1'"),
        (lambda o: o.update(kind="Job"), "kind: must be 'RLJob'"),
        (lambda o: o["metadata"].update(name="Bad_Name"), "metadata.name: must be a lowercase"),
        (lambda o: o["metadata"].update(name="x" * 41), "metadata.name: must be a lowercase DNS"),
        (lambda o: o.update(extra=1), "extra: unknown top-level field"),
        (lambda o: o.pop("spec"), "spec: is required"),
    ],
)
def test_envelope_errors(mutate: Any, expected: str) -> None:
    obj = copy.deepcopy(MINIMAL)
    mutate(obj)
    assert any(m.startswith(expected) for m in messages(obj)), messages(obj)


def test_non_mapping_document() -> None:
    assert messages(["a"]) == ['(document): must be a mapping, got ["a"]']


def test_yaml_reads_exponent_floats_like_kubectl(tmp_path: Path) -> None:
    f = tmp_path / "j.yaml"
    obj = job(algorithm={"learningRate": "PLACEHOLDER"})
    f.write_text(yaml.safe_dump(obj).replace("PLACEHOLDER", "1e-6"))
    (res,) = validate_file(f)
    assert res.ok, res.errors
    assert res.spec is not None and res.spec.algorithm.learning_rate == pytest.approx(1e-6)


def test_duplicate_keys_are_an_error(tmp_path: Path) -> None:
    f = tmp_path / "dup.yaml"
    f.write_text("kind: RLJob\nkind: RLJob\n")
    with pytest.raises(ManifestError, match="duplicate key 'kind'"):
        load_yaml_documents(f)


def test_multi_document_file_and_empty_file(tmp_path: Path) -> None:
    f = tmp_path / "two.yaml"
    bad = job(rollout={"replicas": 0})
    f.write_text(yaml.safe_dump(MINIMAL) + "---\n" + yaml.safe_dump(bad))
    first, second = validate_file(f)
    assert first.ok and not second.ok
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    with pytest.raises(ManifestError, match="no YAML documents"):
        validate_file(empty)
    with pytest.raises(ManifestError, match="cannot read file"):
        validate_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("weight_sync", "expected"),
    [
        (
            {"transport": "nccl"},
            "spec.weightSync.transport: must be one of 'auto', 'http', 'broadcast', got 'nccl' "
            "(broadcast uses NCCL on GPUs and gloo on CPU by itself: write broadcast, http or "
            "auto)",
        ),
        ({"transport": "broadcst"}, "got 'broadcst' (did you mean 'broadcast'?)"),
        (
            {"bucketMB": 0},
            "spec.weightSync.bucketMB: must be >= 1, got 0 (MiB per bucket, e.g. 1024, the "
            "default; the trainer holds at most two at a time)",
        ),
        ({"bucketMB": 16385}, "spec.weightSync.bucketMB: must be <= 16384, got 16385 (MiB"),
        ({"bucketMb": 64}, "spec.weightSync.bucketMb: unknown field (did you mean 'bucketMB'?"),
        (
            {"phaseTimeoutSeconds": 1},
            "spec.weightSync.phaseTimeoutSeconds: must be >= 5, got 1 (seconds, e.g. 120",
        ),
        (
            {"hostCopy": "disk"},
            "spec.weightSync.hostCopy: must be one of 'spool', 'memory', got 'disk' (memory "
            "(the trainer's own memory) or spool (files on the trainer's local disk))",
        ),
    ],
)
def test_weight_sync_errors_name_the_field_the_value_and_the_fix(
    weight_sync: dict[str, Any], expected: str
) -> None:
    msgs = messages(job(weightSync=weight_sync))
    assert len(msgs) == 1 and expected in msgs[0], msgs


@pytest.mark.parametrize(
    ("trainer_gpus", "rollout_gpus", "transport", "resolved"),
    [
        (0, 0, "auto", "http"),
        (1, 0, "auto", "http"),
        (0, 1, "auto", "http"),
        (4, 1, "auto", "broadcast"),
        (0, 0, "broadcast", "broadcast"),  # gloo on CPU
        (4, 1, "http", "http"),
    ],
)
def test_weight_sync_transport_resolves_auto_by_gpus(
    trainer_gpus: int, rollout_gpus: int, transport: str, resolved: str
) -> None:
    obj = job(
        trainer={"resources": {"gpus": trainer_gpus}},
        rollout={"resources": {"gpus": rollout_gpus}, "engine": "vllm"},
        drafterTraining={"layout": "eagle1"},
        weightSync={"transport": transport, "bucketMB": 256},
    )
    res = validate_manifest(obj)
    assert res.ok and res.spec is not None, res.errors
    assert res.spec.weight_sync.bucket_mb == 256
    assert res.spec.weight_sync_transport() == resolved
