"""builtin:arith-long: two-letter labels, answers up to the 2,048-token budget, a real tail; and
builtin:arith itself unchanged by the knob that makes it (label_letters)."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest

from longtail_api.spec import DatasetSpec
from longtail_workers.data.loader import resolve_dataset
from longtail_workers.models.tokenizer import build_char_tokenizer
from longtail_workers.tasks import arith_long
from longtail_workers.tasks.arith import (
    ArithConfig,
    TaskItem,
    generate,
    make_item,
    operand_labels,
    parse_operands,
    split_of,
)

LONG = arith_long.CONFIG


def _digest(items: list[TaskItem]) -> str:
    text = "\n\x00".join(f"{i.prompt}\x01{i.solution}\x01{i.answer}\x01{i.size}" for i in items)
    return hashlib.sha256(text.encode()).hexdigest()


def test_builtin_arith_is_byte_for_byte_what_it_was() -> None:
    # Digests of the first 50 items of each split, taken before label_letters existed.
    assert _digest(generate(50, seed=0)) == (
        "3b0651b6ca2fec0e8ca0887dcc2549268ea8f042292ce638bfbc6df31a0f9cf3"
    )
    assert _digest(generate(50, seed=0, split="eval")) == (
        "301b6df5428cb71f13f764e3f639b2e12548c25c9d19195fb518a3ae119ff540"
    )
    assert generate(20, seed=4) == generate(20, seed=4, config=ArithConfig(label_letters=1))


def test_labels_are_two_letters_in_order_and_round_trip() -> None:
    assert operand_labels(3) == ["a", "b", "c"]
    labels = operand_labels(120, letters=2)
    assert labels[:3] == ["aa", "ab", "ac"] and labels[25:28] == ["az", "ba", "bb"]
    assert labels[-1] == "ep" and len(set(labels)) == 120
    operands = [(7 * i) % 9 + 1 for i in range(120)]
    item = make_item(operands, LONG)
    assert item.prompt.startswith("Add: aa1 ab8 ac6 ") and parse_operands(item.prompt) == operands
    with pytest.raises(ValueError, match="do not fit"):
        operand_labels(27)


def _check_long_item(item: TaskItem) -> None:
    """Each step line: label + value copied from the prompt, 4-digit totals, one line length."""
    operands = parse_operands(item.prompt)
    labels = operand_labels(len(operands), letters=2)
    lines = item.solution.split("\n")
    assert item.size == len(operands) == len(lines) and lines[-1] == f"Answer: {item.answer}"
    total = operands[0]
    for label, x, line in zip(labels[1:], operands[1:], lines[:-1], strict=True):
        assert line == f"{label}{x}: {total:04d}+{x}={total + x:04d}"
        assert f" {label}{x}" in item.prompt
        total += x
    assert int(item.answer) == total == sum(operands)
    assert {len(line) for line in lines[:-1]} <= {16}


def test_every_long_solution_is_correct() -> None:
    items = generate(400, seed=3, config=LONG) + generate(100, seed=3, split="eval", config=LONG)
    for item in items:
        _check_long_item(item)
    assert all(split_of(it.prompt, LONG) == "eval" for it in items[400:])
    assert arith_long.generate(30, seed=3) == items[:30]


def test_the_longest_answer_fits_the_budget_and_reaches_it() -> None:
    tok = build_char_tokenizer()
    longest = make_item([LONG.max_operand] * LONG.max_operands, LONG)
    tokens = len(tok.encode(longest.solution, add_special_tokens=False)) + 1  # + EOS
    assert tokens == len(longest.solution) + 1 == 2036  # one token a character
    assert arith_long.MAX_NEW_TOKENS - 16 <= tokens <= arith_long.MAX_NEW_TOKENS
    assert len(longest.prompt) == 485


def test_length_distribution_has_a_real_tail() -> None:
    # 20,000 training items; answer tokens = characters + EOS (char tokenizer, checked above).
    items = generate(20_000, seed=0, config=LONG)
    lengths = np.array([len(it.solution) + 1 for it in items])
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
    # Figures in docs/tasks-and-rewards.md: 147 / 1,185 / 1,933, max 2,035, mean 385.
    assert (p50, p90, p99) == (147, 1185, 1933)
    assert p99 / p50 >= 5 and lengths.max() <= arith_long.MAX_NEW_TOKENS
    assert 380 < lengths.mean() < 390


def test_the_loader_serves_it_with_a_disjoint_eval_split() -> None:
    spec = DatasetSpec(path="builtin:arith-long", eval_size=20)
    train = resolve_dataset(spec, "train", seed=1, builtin_train_size=50)
    evals = resolve_dataset(spec, "eval")
    assert len(train) == 50 and len(evals) == 20
    assert not {e.prompt for e in train} & {e.prompt for e in evals}
    assert train[0].prompt == arith_long.generate(1, seed=1)[0].prompt


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"label_letters": 0}, "label_letters"),
        ({"label_letters": 3}, "label_letters"),
        ({"max_operands": 677}, "676"),
    ],
)
def test_bad_long_config_is_rejected(change: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate(1, seed=0, config=dataclasses.replace(LONG, **change))


def test_mixed_or_unordered_labels_are_rejected() -> None:
    for prompt in ("Add: a1 ab2\n", "Add: aa1 ac2\n", "Add: aaa1 aab2\n"):
        with pytest.raises(ValueError, match="labels"):
            parse_operands(prompt)
    with pytest.raises(ValueError, match="label_letters=2"):
        make_item([1] * 677, LONG)
