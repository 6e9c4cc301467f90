"""veRL-format parquet files run unchanged: dotted answer keys, chat-message prompts, and
``data_source`` routed to a reward by ``dataset.rewardBySource`` (validated in the spec and
against the file); example 08's checked-in file matches its generator."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from longtail_api.manifest import validate_manifest
from longtail_api.spec import DatasetSpec
from longtail_workers.data import DatasetError, Example, resolve_dataset, reward_name

REPO = Path(__file__).resolve().parents[4]
EXAMPLE = REPO / "examples" / "08-verl-parquet.yaml"
GENERATOR = REPO / "examples" / "data" / "verl_arith.py"

# The columns and types veRL's examples/data_preprocess/gsm8k.py and math_dataset.py write.
VERL_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        (
            "extra_info",
            pa.struct(
                [
                    ("split", pa.string()),
                    ("index", pa.int64()),
                    ("answer", pa.string()),
                    ("question", pa.string()),
                ]
            ),
        ),
    ]
)
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def verl_row(i: int, source: str, question: str, gold: str) -> dict[str, Any]:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": gold},
        "extra_info": {
            "split": "train",
            "index": i,
            "answer": f"... #### {gold}",
            "question": question,
        },
    }


def write_verl(path: Path, rows: list[dict[str, Any]]) -> str:
    pq.write_table(pa.Table.from_pylist(rows, schema=VERL_SCHEMA), path)
    return str(path)


SOURCES = ["openai/gsm8k", "lighteval/MATH", "openai/gsm8k", "openai/gsm8k"] * 10


@pytest.fixture
def verl_file(tmp_path: Path) -> str:
    rows = [verl_row(i, s, f"What is {i} + {i}?", str(2 * i)) for i, s in enumerate(SOURCES)]
    return write_verl(tmp_path / "train.parquet", rows)


def verl_spec(path: str, **fields: Any) -> DatasetSpec:
    return DatasetSpec(
        path=path, prompt_key="prompt", answer_key="reward_model.ground_truth", **fields
    )


def test_a_file_in_verls_schema_loads_as_is(verl_file: str) -> None:
    spec = verl_spec(verl_file, eval_size=0)
    examples = resolve_dataset(spec, "train")
    assert len(examples) == len(SOURCES)
    assert examples[3] == Example(
        prompt=f"What is 3 + 3? {INSTRUCTION}", answer="6", index=3, source="openai/gsm8k"
    )
    assert examples[1].source == "lighteval/MATH"


def test_data_source_is_routed_to_a_reward_by_name(verl_file: str) -> None:
    spec = verl_spec(verl_file, reward="math", reward_by_source={"lighteval/MATH": "math.strict"})
    train = resolve_dataset(spec, "train")
    evals = resolve_dataset(spec, "eval")
    by_source = {(e.source, reward_name(e, spec)) for e in train + evals}
    assert by_source == {("openai/gsm8k", "math"), ("lighteval/MATH", "math.strict")}
    assert reward_name(Example("p", "1", 0), spec) == "math"  # a row without a source


def test_a_mapped_source_no_row_has_is_an_error(verl_file: str) -> None:
    spec = verl_spec(verl_file, reward_by_source={"openai/gsm8K": "math"})
    with pytest.raises(DatasetError) as info:
        resolve_dataset(spec, "train")
    message = str(info.value)
    assert message.startswith(f"{verl_file}: dataset.rewardBySource names data_source ")
    assert "'openai/gsm8K', which no row has" in message
    assert "'openai/gsm8k' (30 rows), 'lighteval/MATH' (10 rows)" in message


def test_rewardbysource_on_a_file_without_data_source(tmp_path: Path) -> None:
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": ["1", "2"]}), path)
    spec = DatasetSpec(path=str(path), reward_by_source={"x": "math"}, eval_size=0)
    with pytest.raises(DatasetError, match=r"none \(no row has a 'data_source' text value\)"):
        resolve_dataset(spec, "train")


MINIMAL: dict[str, Any] = {
    "apiVersion": "longtail.dev/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "job"},
    "spec": {"model": {"path": "builtin:tiny"}, "dataset": {"path": "/data/train.parquet"}},
}


@pytest.mark.parametrize(
    ("dataset", "expected"),
    [
        (
            {"rewardBySource": {"openai/gsm8k": "Math"}},
            "spec.dataset.rewardBySource.openai/gsm8k: must be a lowercase reward name such as "
            "math, got 'Math' (name a registered reward, e.g. math)",
        ),
        (
            {"rewardBySource": {" ": "math"}},
            "spec.dataset.rewardBySource: has an empty data_source key",
        ),
        (
            {"path": "builtin:arith", "rewardBySource": {"openai/gsm8k": "math"}},
            "spec.dataset.rewardBySource: routes rows by their data_source column, and "
            "builtin:arith is a built-in task whose items have none",
        ),
        ({"rewardBySource": {"a": 3}}, "spec.dataset.rewardBySource.a: must be a string, got 3"),
        ({"rewardBySource": ["a"]}, "spec.dataset.rewardBySource: must be a mapping"),
    ],
)
def test_spec_refuses_bad_reward_by_source(dataset: dict[str, Any], expected: str) -> None:
    doc = copy.deepcopy(MINIMAL)
    doc["spec"]["dataset"].update(dataset)
    messages = [str(e) for e in validate_manifest(doc).errors]
    assert any(m.startswith(expected) for m in messages), messages


def test_spec_takes_a_good_mapping() -> None:
    doc = copy.deepcopy(MINIMAL)
    doc["spec"]["dataset"]["rewardBySource"] = {"openai/gsm8k": "math", "x": "my_task.exact"}
    result = validate_manifest(doc)
    assert result.errors == [] and result.spec is not None
    assert result.spec.dataset.reward_by_source == {"openai/gsm8k": "math", "x": "my_task.exact"}


def test_example_08_file_matches_its_generator_and_loads_with_its_spec() -> None:
    module_spec = importlib.util.spec_from_file_location("verl_arith", GENERATOR)
    assert module_spec is not None and module_spec.loader is not None
    generator = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(generator)
    shipped = pq.read_table(generator.OUT)
    assert shipped.schema.equals(VERL_SCHEMA)  # exactly veRL's columns and types
    assert shipped.to_pylist() == generator.table().to_pylist()

    job = validate_manifest(yaml.safe_load(EXAMPLE.read_text()))
    assert job.errors == [] and job.spec is not None
    dataset = job.spec.dataset
    dataset.path = str(REPO / dataset.path)  # local mode reads it from the repository root
    train, evals = resolve_dataset(dataset, "train"), resolve_dataset(dataset, "eval")
    assert (len(train), len(evals)) == (190, 10)
    assert {reward_name(e, dataset) for e in train} == {"math"}
    first = train[0]
    assert first.prompt.startswith("Add: ") and first.system == ""
