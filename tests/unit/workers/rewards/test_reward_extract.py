"""Final-answer extraction (``longtail_workers.rewards.extract``), including hostile output."""

from __future__ import annotations

import time

import pytest

from longtail_workers.rewards.extract import (
    MAX_SCAN_CHARS,
    extract_final_answer,
    find_final_answer,
    last_answer_line,
    last_boxed,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so the result is \boxed{42}.", "42"),
        (r"\boxed{ 7 }", "7"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}"),  # nested braces
        (r"first \boxed{1}, then on reflection \boxed{2}", "2"),  # last box wins
        (r"\boxed{1} and a broken \boxed{2", "1"),  # unbalanced last box is ignored
        (r"\boxed{3} \boxed{}", "3"),  # empty box is not an answer
        (r"\boxed {5}", "5"),  # space between command and brace
        (r"\fbox{9}", "9"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces are literal
        (r"\boxed{a \boxed{b}}", r"a \boxed{b}"),  # the box that closes last wins
        ("} } stray closers \\boxed{8} }", "8"),
        ("reasoning...\nAnswer: 42", "42"),
        ("answer: 17", "17"),  # case-insensitive
        ("ANSWER:   -3  ", "-3"),
        ("Answer: 1\nmore thinking\nAnswer: 2", "2"),  # last line wins
        ("Answer: 5\nAnswer:   \n", "5"),  # a later empty Answer line does not erase it
        ("**Final Answer:** 12", "12"),
        ("## Answer: x = 3", "x = 3"),
        ("Answer: `42`", "42"),
        ("```\nAnswer: 42\n```", "42"),  # answer inside a code fence
        ("```text\nthe work\n\\boxed{6}\n```", "6"),
        ("Answer: 41\nfinally \\boxed{42}", "42"),  # a box beats an Answer: line
        ("Answer:\r\n", None),
        ("", None),
        ("no final answer here", None),
        ("the answer is 42", None),  # prose is not a convention we trust
        (r"\boxed{", None),
        (r"\boxed{{{", None),
        ("Answer 42", None),  # no colon
    ],
)
def test_extract_final_answer(text: str, expected: str | None) -> None:
    assert extract_final_answer(text) == expected


def test_source_is_reported() -> None:
    boxed = find_final_answer(r"\boxed{1}")
    line = find_final_answer("Answer: 1")
    assert boxed is not None and boxed.source == "boxed"
    assert line is not None and line.source == "answer_line"


def test_only_the_tail_is_scanned() -> None:
    # A box far before the last MAX_SCAN_CHARS characters is out of reach by design.
    text = r"\boxed{1}" + "x" * MAX_SCAN_CHARS
    assert extract_final_answer(text) is None
    assert extract_final_answer(text + r"\boxed{2}") == "2"


@pytest.mark.parametrize(
    "text",
    [
        "x" * 5_000_000,
        "\\boxed{" * 200_000,
        "{" * 1_000_000 + "}" * 1_000_000,
        "Answer:" + " " * 1_000_000 + "x",
        ("Answer" + " " * 50 + "\n") * 50_000,
        "\\boxed" + " " * 100_000 + "{1}",
        "a\n" * 1_000_000,
    ],
)
def test_hostile_inputs_are_fast_and_never_raise(text: str) -> None:
    started = time.perf_counter()
    extract_final_answer(text)
    assert time.perf_counter() - started < 0.5


def test_unicode_input_passes_through() -> None:
    assert extract_final_answer("Answer: −٤٢") == "−٤٢"  # normalisation folds it later


@pytest.mark.parametrize("bad", [None, 42, b"Answer: 1", ["Answer: 1"]])
def test_non_str_raises_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match=r"text: must be a str, got"):
        extract_final_answer(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"must be a str"):
        last_boxed(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"must be a str"):
        last_answer_line(bad)  # type: ignore[arg-type]
