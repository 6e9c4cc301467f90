"""Dataset loading: jsonl/parquet files, keys, errors, shuffling, batches, splits, builtins."""

from __future__ import annotations

import gzip
import json
import random
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longtail_api.spec import DatasetSpec
from longtail_workers.data import (
    BUILTIN_TASKS,
    DatasetError,
    Example,
    epoch_order,
    holdout_split,
    iterate_batches,
    load_examples,
    resolve_dataset,
    shuffle,
)
from longtail_workers.data.loader import HOLDOUT_FRACTION, HOLDOUT_SEED


def write_jsonl(path: Path, rows: list[Any]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def write_parquet(path: Path, columns: dict[str, list[Any]]) -> str:
    pq.write_table(pa.table(columns), path)
    return str(path)


def numbered(n: int) -> list[dict[str, Any]]:
    return [{"prompt": f"q{i}", "answer": str(i)} for i in range(n)]


# --- reading files -------------------------------------------------------------------------


def test_gsm8k_style_jsonl_with_custom_keys(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=7\n#### 7"},
        {"question": "What is 999+1?", "answer": "999+1=1000\n#### 1,000"},
        {"question": "Pick 42", "answer": 42},
        {"question": "Half of 1", "answer": 0.5},
        {"question": "Float int", "answer": 72.0},
    ]
    # A blank line in the middle is skipped and does not count as a row.
    path = tmp_path / "gsm8k.jsonl"
    lines = [json.dumps(r) for r in rows]
    path.write_text("\n".join([*lines[:2], "", *lines[2:]]) + "\n", encoding="utf-8")

    examples = load_examples(str(path), prompt_key="question", answer_key="answer")

    assert [e.answer for e in examples] == ["7", "1000", "42", "0.5", "72"]
    assert [e.index for e in examples] == [0, 1, 2, 3, 4]
    assert examples[0] == Example(prompt=rows[0]["question"], answer="7", index=0)


def test_jsonl_gz_and_nested_dotted_key(tmp_path: Path) -> None:
    path = tmp_path / "math.jsonl.gz"
    row = {"problem": "1+1?", "reward_model": {"ground_truth": "2", "style": "rule"}}
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")

    (example,) = load_examples(str(path), "problem", "reward_model.ground_truth")

    assert (example.prompt, example.answer, example.index) == ("1+1?", "2", 0)


def test_literal_dotted_key_wins_over_nesting(tmp_path: Path) -> None:
    rows = [{"prompt": "p", "a.b": "flat", "a": {"b": "nested"}}]
    (example,) = load_examples(write_jsonl(tmp_path / "d.jsonl", rows), "prompt", "a.b")
    assert example.answer == "flat"


def test_plain_parquet_reads_only_needed_columns(tmp_path: Path) -> None:
    path = write_parquet(
        tmp_path / "d.parquet",
        {"problem": ["a?", "b?"], "solution": ["11", "12"], "answer_num": [3, 4]},
    )
    examples = load_examples(path, "problem", "answer_num")
    assert [(e.prompt, e.answer, e.index) for e in examples] == [("a?", "3", 0), ("b?", "4", 1)]


def test_verl_style_parquet_with_chat_prompt_and_struct_answer(tmp_path: Path) -> None:
    # The layout veRL, DAPO-Math-17k and Eurus-2-RL ship: chat-message prompts and the answer
    # inside a reward_model struct column.
    path = write_parquet(
        tmp_path / "verl.parquet",
        {
            "data_source": ["gsm8k", "eurus"],
            "prompt": [
                [{"role": "user", "content": "What is 2+2?"}],
                [
                    {"role": "system", "content": "Think step by step."},
                    {"role": "user", "content": "What is 3*3?"},
                ],
            ],
            "reward_model": [
                {"ground_truth": "4", "style": "rule"},
                {"ground_truth": "9", "style": "rule"},
            ],
        },
    )
    examples = load_examples(path, "prompt", "reward_model.ground_truth")
    assert examples == [
        Example(prompt="What is 2+2?", answer="4", index=0, source="gsm8k"),
        Example("What is 3*3?", "9", 1, system="Think step by step.", source="eurus"),
    ]


def test_parquet_float_column_with_null_names_the_row(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "d.parquet", {"prompt": ["a", "b"], "answer": [72.0, None]})
    with pytest.raises(DatasetError, match=r"row 1: answer 'answer' is null"):
        load_examples(path)


# --- errors --------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(DatasetError, match="not found") as info:
        load_examples(missing)
    assert missing in str(info.value)
    assert "dataset.path" in str(info.value)


def test_unsupported_extension_lists_supported(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("prompt,answer\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="unsupported") as info:
        load_examples(str(path))
    for ext in (".jsonl", ".jsonl.gz", ".parquet"):
        assert ext in str(info.value)


def test_invalid_json_names_line_and_row(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b", "answer": \n', "utf-8")
    with pytest.raises(DatasetError, match=r"row 1 \(line 3\): invalid JSON") as info:
        load_examples(str(path))
    assert str(path) in str(info.value)


def test_json_line_that_is_not_an_object(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [["a", "1"]])
    with pytest.raises(DatasetError, match=r"row 0 \(line 1\): is a JSON list"):
        load_examples(path)


def test_row_missing_answer_key_names_row_key_and_present_keys(tmp_path: Path) -> None:
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "solution": "2"}]
    with pytest.raises(DatasetError) as info:
        load_examples(write_jsonl(tmp_path / "d.jsonl", rows))
    message = str(info.value)
    assert "row 1 (line 2)" in message
    assert "missing answer key 'answer'" in message
    assert "'prompt', 'solution'" in message
    assert "dataset.answerKey" in message


def test_row_missing_prompt_key(tmp_path: Path) -> None:
    rows = [{"question": "a", "answer": "1"}]
    with pytest.raises(DatasetError, match=r"row 0 .*missing prompt key 'prompt'.*'question'"):
        load_examples(write_jsonl(tmp_path / "d.jsonl", rows))


def test_nested_key_into_a_non_object(tmp_path: Path) -> None:
    rows = [{"prompt": "a", "reward_model": "4"}]
    with pytest.raises(DatasetError, match=r"'reward_model' is a str, not an object"):
        load_examples(write_jsonl(tmp_path / "d.jsonl", rows), answer_key="reward_model.gt")


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        (42, r"prompt 'prompt' is a int \(42\), expected text"),
        (None, r"prompt 'prompt' is null"),
        ("  ", r"prompt 'prompt' is empty"),
        (
            [{"role": "assistant", "content": "x"}],
            r"prompt 'prompt' is a chat with roles \['assistant'\]",
        ),
    ],
)
def test_bad_prompt_values(tmp_path: Path, prompt: Any, expected: str) -> None:
    rows = [{"prompt": "fine", "answer": "1"}, {"prompt": prompt, "answer": "1"}]
    with pytest.raises(DatasetError, match=r"row 1 \(line 2\): " + expected):
        load_examples(write_jsonl(tmp_path / "d.jsonl", rows))


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (True, r"answer 'answer' is a bool"),
        ("", r"answer 'answer' is empty"),
        (["1", "2"], r"answer 'answer' is a list"),
        (
            {"ground_truth": "4"},
            r"answer 'answer' is an object .* one of its fields: answer\.ground_truth",
        ),
    ],
)
def test_bad_answer_values(tmp_path: Path, answer: Any, expected: str) -> None:
    rows = [{"prompt": "q", "answer": answer}]
    with pytest.raises(DatasetError, match=r"row 0 \(line 1\): " + expected):
        load_examples(write_jsonl(tmp_path / "d.jsonl", rows))


def test_empty_dataset(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="empty") as info:
        load_examples(str(path))
    assert str(path) in str(info.value)


def test_parquet_missing_column_lists_columns(tmp_path: Path) -> None:
    path = write_parquet(
        tmp_path / "d.parquet",
        {"prompt": ["a"], "reward_model": [{"ground_truth": "1", "style": "rule"}]},
    )
    with pytest.raises(DatasetError) as info:
        load_examples(path, answer_key="reward_model.answer")
    message = str(info.value)
    assert "no column 'reward_model.answer'" in message
    assert "prompt, reward_model, reward_model.ground_truth, reward_model.style" in message
    assert "dataset.answerKey" in message


def test_not_a_parquet_file(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    path.write_bytes(b"this is not parquet")
    with pytest.raises(DatasetError, match="not a readable parquet file"):
        load_examples(str(path))


def test_jsonl_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"prompt": "a", "answer": "1"}\n{"prompt": "\xff\xfe"}\n')
    with pytest.raises(DatasetError, match="UTF-8"):
        load_examples(str(path))


# --- order ---------------------------------------------------------------------------------


def examples_of(n: int) -> list[Example]:
    return [Example(prompt=f"q{i}", answer=str(i), index=i) for i in range(n)]


def test_shuffle_is_deterministic_and_independent_of_global_random() -> None:
    examples = examples_of(50)
    random.seed(1)
    first = shuffle(examples, seed=7)
    random.seed(2)
    random.random()
    assert shuffle(examples, seed=7) == first
    assert shuffle(examples, seed=8) != first
    assert sorted(first, key=lambda e: e.index) == examples
    assert examples == examples_of(50)  # input untouched


def test_batches_cover_each_epoch_once_and_resume_exactly() -> None:
    examples = examples_of(10)
    stream = iterate_batches(examples, batch_size=4, seed=3)
    batches = [next(stream) for _ in range(5)]  # 20 prompts = 2 epochs
    flat = [e.index for batch in batches for e in batch]
    assert all(len(batch) == 4 for batch in batches)
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert flat[:10] == [e.index for e in shuffle(examples, 3)]
    assert flat[:10] != flat[10:]  # reshuffled each epoch
    assert flat[10:] == [e.index for e in epoch_order(examples, 3, 1)]

    resumed = iterate_batches(examples, batch_size=4, seed=3, start_batch=3)
    assert [next(resumed) for _ in range(2)] == batches[3:]


def test_batches_reject_bad_arguments() -> None:
    with pytest.raises(DatasetError, match="empty"):
        next(iterate_batches([], batch_size=2, seed=0))
    with pytest.raises(ValueError, match="batch_size"):
        next(iterate_batches(examples_of(3), batch_size=0, seed=0))


# --- splits --------------------------------------------------------------------------------


def test_holdout_is_last_five_percent_of_fixed_shuffle() -> None:
    examples = examples_of(100)
    train, held = holdout_split(examples)
    assert len(held) == int(100 * HOLDOUT_FRACTION) == 5
    assert {e.index for e in train} | {e.index for e in held} == set(range(100))
    assert not {e.index for e in train} & {e.index for e in held}
    assert [e.index for e in train] == sorted(e.index for e in train)
    assert holdout_split(examples) == (train, held)
    with pytest.raises(DatasetError, match="evalPath"):
        holdout_split(examples_of(1))


def test_file_dataset_without_eval_path_holds_out(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", numbered(40))
    spec = DatasetSpec(path=path, eval_size=200)
    train = resolve_dataset(spec, "train", seed=1)
    held = resolve_dataset(spec, "eval", seed=2)  # the run seed does not move the hold-out
    assert len(held) == 2 and len(train) == 38
    assert not {e.index for e in train} & {e.index for e in held}
    # evalSize caps eval without changing which rows train sees.
    capped = DatasetSpec(path=path, eval_size=1)
    assert resolve_dataset(capped, "train") == train
    (one,) = resolve_dataset(capped, "eval")
    assert one in held
    # evalSize 0 disables eval and trains on everything.
    off = DatasetSpec(path=path, eval_size=0)
    assert resolve_dataset(off, "eval") == []
    assert len(resolve_dataset(off, "train")) == 40


def test_eval_path_is_used_and_capped_by_eval_size(tmp_path: Path) -> None:
    train_path = write_jsonl(tmp_path / "train.jsonl", numbered(5))
    eval_path = write_parquet(
        tmp_path / "eval.parquet",
        {"prompt": [f"e{i}" for i in range(30)], "answer": list(range(30))},
    )
    spec = DatasetSpec(path=train_path, eval_path=eval_path, eval_size=10)
    assert len(resolve_dataset(spec, "train")) == 5
    evaluated = resolve_dataset(spec, "eval")
    assert len(evaluated) == 10
    assert [e.index for e in evaluated] == sorted(e.index for e in evaluated)
    assert [e.index for e in evaluated] != list(range(10))  # a spread subset, not the head
    assert resolve_dataset(spec, "eval") == evaluated


def test_relative_paths_resolve_against_base_dir(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", numbered(3))
    spec = DatasetSpec(path="d.jsonl", eval_size=0)
    assert len(resolve_dataset(spec, "train", base_dir=str(tmp_path))) == 3


def test_tiny_file_without_eval_path_explains_fix(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", numbered(1))
    with pytest.raises(DatasetError, match=r"d\.jsonl: only 1 example.*evalPath.*evalSize: 0"):
        resolve_dataset(DatasetSpec(path=path), "eval")


def test_unknown_split_and_unknown_builtin() -> None:
    with pytest.raises(DatasetError, match="unknown dataset split 'test'; use one of train, eval"):
        resolve_dataset(DatasetSpec(path="builtin:arith"), "test")
    with pytest.raises(DatasetError, match=r"'builtin:gsm8k'; known: builtin:arith"):
        resolve_dataset(DatasetSpec(path="builtin:gsm8k"), "train")


def test_builtin_arith_dispatch() -> None:
    arith = pytest.importorskip("longtail_workers.tasks.arith")
    spec = DatasetSpec(path="builtin:arith", eval_size=7)
    train = resolve_dataset(spec, "train", seed=5, builtin_train_size=12)
    items = arith.generate(n=12, seed=5, split="train")
    assert [(e.prompt, e.answer, e.index) for e in train] == [
        (item.prompt, str(item.answer), i) for i, item in enumerate(items)
    ]
    evaluated = resolve_dataset(spec, "eval", seed=5)
    assert len(evaluated) == 7
    # The eval set is the task's eval split with the fixed hold-out seed, whatever the run seed.
    assert resolve_dataset(spec, "eval", seed=6) == evaluated
    expected = arith.generate(n=7, seed=HOLDOUT_SEED, split="eval")
    assert [e.prompt for e in evaluated] == [item.prompt for item in expected]
    assert not {e.prompt for e in evaluated} & {e.prompt for e in train}


def test_builtin_with_eval_path_uses_the_file(tmp_path: Path) -> None:
    eval_path = write_jsonl(tmp_path / "e.jsonl", numbered(3))
    spec = DatasetSpec(path="builtin:arith", eval_path=eval_path)
    assert [e.prompt for e in resolve_dataset(spec, "eval")] == ["q0", "q1", "q2"]


def test_builtin_registry_imports_lazily_and_checks_items(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclass
    class Item:
        prompt: str
        answer: Any

    def generate(n: int, seed: int, split: str = "train") -> list[Item]:
        answers: list[Any] = [seed, 2.0, None]
        return [Item(prompt=f"{split} {i}\n", answer=answers[i]) for i in range(n)]

    fake = types.ModuleType("fake_task_module")
    fake.generate = generate  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_task_module", fake)
    monkeypatch.setitem(BUILTIN_TASKS, "fake", "fake_task_module")
    spec = DatasetSpec(path="builtin:fake", eval_size=2)

    train = resolve_dataset(spec, "train", seed=9, builtin_train_size=2)
    assert train == [Example("train 0\n", "9", 0), Example("train 1\n", "2", 1)]
    assert resolve_dataset(spec, "eval", seed=9)[0].answer == str(HOLDOUT_SEED)
    with pytest.raises(DatasetError, match=r"builtin:fake \(train\) item 2: answer .* is null"):
        resolve_dataset(spec, "train", builtin_train_size=3)


def test_builtin_whose_module_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BUILTIN_TASKS, "ghost", "longtail_workers.tasks.no_such_task")
    with pytest.raises(DatasetError, match=r"'builtin:ghost' is not available.*no_such_task"):
        resolve_dataset(DatasetSpec(path="builtin:ghost"), "train")


def test_nested_key_missing_inside_object_names_its_keys(tmp_path: Path) -> None:
    rows = [{"prompt": "a", "extra": {"reward_model": {"style": "rule"}}}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(
        DatasetError, match=r"'extra.reward_model' has no key 'gt' \(its keys: 'style'\)"
    ):
        load_examples(path, answer_key="extra.reward_model.gt")
