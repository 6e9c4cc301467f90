"""builtin:arith: determinism, held-out eval split, correct worked solutions, long tail."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from longtail_workers.models.tokenizer import build_char_tokenizer
from longtail_workers.tasks.arith import (
    DEFAULT_CONFIG,
    ArithConfig,
    TaskItem,
    generate,
    make_item,
    parse_operands,
    size_distribution,
    split_of,
)


def test_same_seed_same_items_and_prefix_stable() -> None:
    assert generate(300, seed=7) == generate(300, seed=7)
    # A longer request with the same seed extends the list instead of reshuffling it.
    assert generate(500, seed=7)[:300] == generate(300, seed=7)


def test_different_seeds_give_different_items() -> None:
    a, b = generate(200, seed=1), generate(200, seed=2)
    assert [it.prompt for it in a] != [it.prompt for it in b]
    assert len({it.prompt for it in a} & {it.prompt for it in b}) < 100


def test_eval_split_is_disjoint_from_train() -> None:
    train = {it.prompt for it in generate(5000, seed=0, split="train")}
    evals = generate(1000, seed=0, split="eval")
    assert not train & {it.prompt for it in evals}
    # Disjoint by construction for every seed: each prompt text belongs to exactly one split.
    assert all(split_of(it.prompt) == "eval" for it in evals)
    assert all(split_of(p) == "train" for p in train)
    other_seed = {it.prompt for it in generate(2000, seed=123, split="train")}
    assert not other_seed & {it.prompt for it in evals}


def test_eval_prompts_are_distinct() -> None:
    evals = generate(400, seed=0, split="eval")
    assert len({it.prompt for it in evals}) == 400
    assert generate(200, seed=0, split="eval") == evals[:200]  # a larger n extends the list
    assert any(it.size == 2 for it in evals)  # the few two-operand eval prompts are in it


def test_eval_split_differs_from_train_stream() -> None:
    train, evals = generate(50, seed=0), generate(50, seed=0, split="eval")
    assert [it.size for it in train] != [it.size for it in evals]


def _check_item(item: TaskItem) -> None:
    operands = parse_operands(item.prompt)
    assert item.size == len(operands)
    assert item.prompt.endswith("\n") and item.prompt.startswith("Add: ")
    lines = item.solution.split("\n")
    assert lines[-1] == f"Answer: {item.answer}"
    assert len(lines) == len(operands)  # one line per addition, plus the answer line
    total = operands[0]
    for k, (line, x) in enumerate(zip(lines[:-1], operands[1:], strict=True)):
        head, sum_text = line.split(": ")
        # The line names the operand it adds: its label and value, as written in the prompt.
        assert head == f"{'abcdefghijklmnopqrstuvwxyz'[k + 1]}{x}"
        assert f" {head}" in item.prompt
        lhs, rhs = sum_text.split("=")
        a, b = (int(v) for v in lhs.split("+"))
        assert (a, b) == (total, x)  # running total plus the next operand, in order
        assert int(rhs) == a + b  # arithmetic recomputed
        total = int(rhs)
    assert int(item.answer) == sum(operands)
    # Fixed width: every step line has the same length, so digits stay aligned.
    assert len({len(line) for line in lines[:-1]}) == 1


def test_every_solution_is_correct_and_ends_with_answer() -> None:
    items = generate(3000, seed=3) + generate(500, seed=3, split="eval")
    for item in items:
        _check_item(item)
    cfg = DEFAULT_CONFIG
    assert all(cfg.min_operands <= it.size <= cfg.max_operands for it in items)
    assert all(1 <= x <= cfg.max_operand for it in items[:500] for x in parse_operands(it.prompt))


def test_solution_lengths_have_a_long_tail() -> None:
    tok = build_char_tokenizer()
    items = generate(5000, seed=0)
    lengths = np.array([len(tok.encode(it.solution)) + 1 for it in items])  # +1: EOS
    p50, p99 = np.percentile(lengths, [50, 99])
    assert p99 / p50 >= 4, (p50, p99)
    # Length grows with size: the tail is made of large problems, not noise.
    sizes = np.array([it.size for it in items])
    assert np.corrcoef(sizes, lengths)[0, 1] > 0.95


def test_size_distribution_is_heavy_tailed_zipf() -> None:
    sizes, probs = size_distribution()
    assert sizes[0] == DEFAULT_CONFIG.min_operands and sizes[-1] == DEFAULT_CONFIG.max_operands
    assert probs.sum() == pytest.approx(1.0)
    assert np.all(np.diff(probs) < 0)  # monotone decreasing
    alpha = DEFAULT_CONFIG.zipf_alpha
    assert probs[0] / probs[1] == pytest.approx(2.0**alpha)


def test_make_item_example() -> None:
    item = make_item([7, 2, 5])
    assert item == TaskItem(
        prompt="Add: a7 b2 c5\n",
        answer="14",
        solution="b2: 007+2=009\nc5: 009+5=014\nAnswer: 14",
        size=3,
    )
    assert parse_operands(item.prompt) == [7, 2, 5]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"min_operands": 1}, "min_operands"),
        ({"max_operands": 1}, "max_operands"),
        ({"max_operands": 27}, "max_operands"),
        ({"zipf_alpha": 0.0}, "zipf_alpha"),
        ({"max_operand": 1}, "max_operand"),
        ({"eval_fraction": 1.0}, "eval_fraction"),
    ],
)
def test_bad_config_is_rejected(change: dict[str, float], message: str) -> None:
    cfg = dataclasses.replace(ArithConfig(), **change)
    with pytest.raises(ValueError, match=message):
        generate(1, seed=0, config=cfg)


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="split"):
        generate(1, seed=0, split="test")
    with pytest.raises(ValueError, match="n must be"):
        generate(-1, seed=0)
    with pytest.raises(ValueError, match="not an arith prompt"):
        parse_operands("Sum: a1 b2\n")
    with pytest.raises(ValueError, match="labels"):
        parse_operands("Add: b1 a2\n")
    with pytest.raises(ValueError, match="operands"):
        make_item([1] * 27)
    with pytest.raises(ValueError, match="max_operand"):
        make_item([1, DEFAULT_CONFIG.max_operand + 1])
