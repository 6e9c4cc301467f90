"""Normalisation, the ``math`` reward, the format component and the reward registry."""

from __future__ import annotations

import time
from collections.abc import Iterator
from fractions import Fraction

import pytest

from longtail_workers.rewards import (
    MAX_NORMALIZE_CHARS,
    RewardResult,
    UnknownRewardError,
    answers_match,
    combine,
    get_reward,
    known_rewards,
    math_reward,
    normalize_answer,
    register_reward,
    unregister_reward,
)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("42", "42"),
        ("+42", "42"),
        ("0042", "42"),
        ("1,234", "1234"),
        ("1,234,567", "1234567"),
        ("-1,234.5", "-1234.5"),
        ("0.50", "0.5"),
        (".5", "0.5"),
        ("5.", "5"),
        ("-0.0", "0"),
        ("1/2", "0.5"),
        ("3/4", "0.75"),
        (r"\frac{1}{2}", "0.5"),
        (r"\dfrac{3}{4}", "3/4"),
        (r"\tfrac{3}{4}", "0.75"),
        (r"\frac12", "1/2"),
        (r"-\frac{1}{2}", "-0.5"),
        (r"\frac{-1}{2}", "-1/2"),
        (r"\left( 3 \right)", "3"),
        ("(5)", "5"),
        ("$42$", "42"),
        (r"\(42\)", "42"),
        (r"\$5", "5"),
        ("42.", "42"),
        (r"12 \text{ cm}", "12"),
        (r"12\text{cm}", "12"),
        (r"\text{yes}", "yes"),
        (r"\mathrm{Yes}", "Yes"),
        ("42 apples", "42"),
        ("x = 5", "5"),
        ("x_1 = 5", "5"),
        (r"90^\circ", "90"),
        (r"90^{\circ}", "90"),
        ("90°", "90"),
        (r"50\%", "50"),
        ("\u22125", "-5"),  # U+2212 MINUS SIGN
        ("٤٢", "42"),  # Arabic-Indic digits
        ("４２", "42"),  # full-width digits
        ("½", "0.5"),
        ("x²", "x^2"),
        ("x^{2}", "x^2"),
        ("x + 1", "x+1"),
        ("x  +\n1", "x + 1"),
        (r"2 \pi", r"2\pi"),
        (r"\sqrt3", r"\sqrt{3}"),
        (r"\frac{\sqrt3}{2}", r"\frac{\sqrt{3}}{2}"),
        ("{42}", "42"),
        (r"1\,234", "1234"),
        ("1{,}234", "1234"),
        ("1e3", "1000"),
        ("`42`", "42"),
        ("```\n42\n```", "42"),
        ("New  York", "New York"),
        (r"\left[ 1, 2 \right]", "[1,2]"),
    ],
)
def test_equivalent_answers_match(answer: str, gold: str) -> None:
    assert answers_match(answer, gold), (normalize_answer(answer), normalize_answer(gold))


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("0.3333", "1/3"),  # exact comparison: no float rounding
        ("42", "43"),
        ("-5", "5"),
        ("1, 234", "1234"),  # a list, not a thousands separator
        ("(1,234)", "1234"),  # a tuple
        ("1,23", "123"),  # not groups of three
        ("x", "X"),  # case-sensitive: different variables
        (r"2 \pi", "2"),  # pi is not a unit
        ("2 x", "2"),  # nor is a single letter
        (r"\text{no}", "yes"),
        ("1/0", "0"),  # no division by zero, compared as text
        ("...", "..."),  # empty after normalisation never matches
        ("", ""),
        ("1e99999999", "1"),  # giant exponents are text, never a giant integer
        ("NewYork", "New York"),
    ],
)
def test_different_answers_do_not_match(answer: str, gold: str) -> None:
    assert not answers_match(answer, gold)


def test_numbers_are_exact_fractions() -> None:
    assert normalize_answer(r"\frac{2}{4}").value == Fraction(1, 2)
    assert normalize_answer("007.50").text == "15/2"
    assert normalize_answer("pi").value is None


def test_long_inputs_skip_rewriting_but_still_compare() -> None:
    long = "word " * (MAX_NORMALIZE_CHARS // 5 + 10)
    normalized = normalize_answer(long)
    assert normalized.value is None and normalized.text == long.strip()
    assert answers_match(long, long.replace(" ", "  "))


@pytest.mark.parametrize(
    "text",
    [
        r"\frac{" * 300,
        r"\frac{1}{" * 100 + "}" * 100,
        "1" * MAX_NORMALIZE_CHARS,
        "(" * MAX_NORMALIZE_CHARS,
        r"\text{" * 150,
        "9" * 1000 + "/" + "7" * 20,
        "$" * MAX_NORMALIZE_CHARS,
        "\u2212" * MAX_NORMALIZE_CHARS,
    ],
)
def test_normalisation_of_hostile_inputs_is_fast(text: str) -> None:
    started = time.perf_counter()
    normalize_answer(text)
    assert time.perf_counter() - started < 0.5


# --- the math reward -----------------------------------------------------------------------


def test_math_reward_correct_boxed() -> None:
    result = math_reward(r"... so \boxed{\frac{1}{2}}", "0.5")
    assert result == RewardResult(
        reward=1.0, correct=True, extracted=r"\frac{1}{2}", formatted=True
    )


def test_math_reward_wrong_but_formatted() -> None:
    result = math_reward("Answer: 41", "42")
    assert result == RewardResult(reward=0.0, correct=False, extracted="41", formatted=True)


def test_math_reward_no_answer() -> None:
    result = math_reward("I think it's 42", "42")
    assert result == RewardResult(reward=0.0, correct=False, extracted=None, formatted=False)


def test_math_reward_unwraps_boxed_gold() -> None:
    assert math_reward("Answer: 7", r"\boxed{7}").correct


@pytest.mark.parametrize(
    ("answer", "weight", "expected"),
    [
        (r"\boxed{42}", 0.1, 1.0),  # correct: (1-w)*1 + w*1
        (r"\boxed{41}", 0.1, 0.1),  # formatted only: w
        ("42", 0.1, 0.0),  # neither
        (r"\boxed{41}", 0.0, 0.0),
        (r"\boxed{41}", 1.0, 1.0),
        (r"\boxed{42}", 0.5, 1.0),
    ],
)
def test_format_weight(answer: str, weight: float, expected: float) -> None:
    assert math_reward(answer, "42", format_weight=weight).reward == pytest.approx(expected)


@pytest.mark.parametrize("weight", [-0.1, 1.5, float("nan")])
def test_format_weight_out_of_range(weight: float) -> None:
    with pytest.raises(ValueError, match=r"format_weight: must be in \[0, 1\]"):
        math_reward("Answer: 1", "1", format_weight=weight)


@pytest.mark.parametrize("weight", [True, "0.1", None])
def test_format_weight_wrong_type(weight: object) -> None:
    with pytest.raises(TypeError, match=r"format_weight: must be a number"):
        math_reward("Answer: 1", "1", format_weight=weight)  # type: ignore[arg-type]


def test_combine_formula() -> None:
    assert combine(correct=False, formatted=True, format_weight=0.25) == 0.25
    assert combine(correct=True, formatted=True, format_weight=0.25) == 1.0


@pytest.mark.parametrize(
    ("answer", "gold", "name"),
    [(None, "1", "answer"), ("1", 1, "gold"), (b"1", "1", "answer")],
)
def test_math_reward_rejects_non_str(answer: object, gold: object, name: str) -> None:
    with pytest.raises(TypeError, match=rf"{name}: must be a str"):
        math_reward(answer, gold)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "answer",
    [
        "",
        "x" * 3_000_000,
        "\\boxed{" * 100_000,
        r"\boxed{" + "9" * 4000 + "}",
        r"\boxed{\frac{" + "{" * 2000 + "}",
        "Answer: " + "\u2212" * 4000,
        "```\n\n```",
        "\x00\x01\ud800",  # control characters and a lone surrogate
    ],
)
def test_math_reward_never_raises_on_str(answer: str) -> None:
    started = time.perf_counter()
    result = math_reward(answer, "42", format_weight=0.1)
    assert 0.0 <= result.reward <= 1.0 and not result.correct
    assert time.perf_counter() - started < 0.5


# --- registry ------------------------------------------------------------------------------


@pytest.fixture
def scratch_reward() -> Iterator[str]:
    name = "test.scratch"
    yield name
    if name in known_rewards():
        unregister_reward(name)


def test_builtin_math_is_registered() -> None:
    assert "math" in known_rewards()
    assert get_reward("math") is math_reward


def test_register_and_get(scratch_reward: str) -> None:
    @register_reward(scratch_reward)
    def exact(answer: str, gold: str, *, format_weight: float = 0.0) -> RewardResult:
        ok = answer == gold
        return RewardResult(reward=float(ok), correct=ok, extracted=answer, formatted=True)

    assert get_reward(scratch_reward) is exact
    assert scratch_reward in known_rewards()
    assert get_reward(scratch_reward)("a", "a").correct


def test_duplicate_registration_needs_replace(scratch_reward: str) -> None:
    def other(answer: str, gold: str, *, format_weight: float = 0.0) -> RewardResult:
        raise AssertionError("never called")

    register_reward(scratch_reward)(math_reward)
    register_reward(scratch_reward)(math_reward)  # the same function again is harmless
    with pytest.raises(ValueError, match=r"already registered .*math_reward.*replace=True"):
        register_reward(scratch_reward)(other)
    assert get_reward(scratch_reward) is math_reward
    register_reward(scratch_reward, replace=True)(other)
    assert get_reward(scratch_reward) is other


def test_unknown_reward_lists_known_names() -> None:
    with pytest.raises(UnknownRewardError) as info:
        get_reward("nope")
    assert isinstance(info.value, KeyError)
    assert "unknown reward 'nope'; known rewards: " in str(info.value)
    assert "math" in str(info.value) and "register_reward" in str(info.value)


@pytest.mark.parametrize("name", ["", "Math", "1abc", "has space", "x" * 65])
def test_invalid_reward_names(name: str) -> None:
    with pytest.raises(ValueError, match=r"reward name: must match"):
        register_reward(name)
