"""``builtin:arith``: a seeded, long-tailed arithmetic task with step-by-step worked solutions.

Each item asks for the sum of a list of small numbers, each labelled with a letter; the worked
solution adds them one at a time, one line per running total, and ends with ``Answer: <sum>``.
The number of operands (the item's ``size``) is drawn from a truncated Zipf distribution, so
solution lengths have a real long tail (most items need one or two lines, a few need two dozen) —
the rollout regime Longtail exists for.

The format is shaped so that the tiny built-in policy (``builtin:tiny``,
:mod:`longtail_workers.models.builtin`) learns the task partially from a short supervised fit,
leaving room for RL. Every token the model writes is either a copy or a small sum of tokens it
can find cheaply: each step line starts with the label and value of the operand it adds, copied
from the prompt where the value directly follows its label (a plain induction-head copy, not
line counting, which a tiny model does not learn in a few hundred steps); totals are zero-padded
to a fixed width, so every step line has the same length and the previous total and the digits
being added sit at fixed distances.

More than 26 operands (``builtin:arith-long``, :mod:`longtail_workers.tasks.arith_long`): with
``ArithConfig.label_letters = 2`` every label has two letters (``aa``, ``ab``, ... ``zz``: up to
676 operands) and the totals are padded to the width of the largest sum those labels allow, so
the step lines of that variant again all have one length and the copy stays label + value.

Called by the dataset loader (``dataset.path: builtin:arith``), by the built-in policies' builds
(SFT data and their eval split) and by ``bench/tiny_model.py``.

Format contract (shared by SFT and RL rollout): the model sees ``prompt`` (which ends in a
newline) and must generate ``solution`` followed by EOS. No chat template is involved.

    prompt:   "Add: a7 b9 c5\\n"
    solution: "b9: 007+9=016\\nc5: 016+5=021\\nAnswer: 21"

Train and eval splits are disjoint *for every seed*: each prompt text is assigned to one split by
a hash of the text, and each split's generator rejects prompts that belong to the other split.
The two splits also draw from different seed streams. The eval split never repeats a prompt
(small sizes have few distinct prompts: 81 with two operands, about 8 of them eval prompts), so
every eval item is a different question and 200 items weigh 0.5 points each.
"""

from __future__ import annotations

import hashlib
import re
import string
from dataclasses import dataclass

import numpy as np

SPLITS = ("train", "eval")
PROMPT_PREFIX = "Add: "
ANSWER_PREFIX = "Answer: "
_SPLIT_STREAM = {"train": 0, "eval": 1}
LABELS = string.ascii_lowercase  # the letters of operand labels
MAX_LABEL_LETTERS = 2  # two-letter labels: up to 26 ** 2 = 676 operands
_OPERAND = re.compile(r"\b([a-z]+)(\d+)\b")


def label_capacity(letters: int) -> int:
    """How many distinct operand labels of ``letters`` letters there are."""
    return int(len(LABELS) ** letters)  # int: mypy types int ** int as Any


def operand_labels(n: int, letters: int = 1) -> list[str]:
    """The labels of ``n`` operands in order: ``a, b, ..`` or ``aa, ab, .., az, ba, ..``."""
    if not 0 <= n <= label_capacity(letters):
        raise ValueError(
            f"operand_labels: {n} operands do not fit {letters}-letter labels (0.."
            f"{label_capacity(letters)}); use more letters (ArithConfig.label_letters)"
        )
    return [_label(i, letters) for i in range(n)]


def _label(index: int, letters: int) -> str:
    """Label number ``index``: its ``letters`` base-26 digits as letters, most significant first."""
    label = ""
    for _ in range(letters):
        index, digit = divmod(index, len(LABELS))
        label = LABELS[digit] + label
    return label


@dataclass(frozen=True)
class TaskItem:
    """One problem of the task."""

    prompt: str  # the question text shown to the model, ends with "\n"
    answer: str  # gold final answer, e.g. "1234"
    solution: str  # worked step-by-step solution, ending with a line "Answer: <answer>"
    size: int  # problem size: number of operands


@dataclass(frozen=True)
class ArithConfig:
    """Knobs of the task's distribution. The defaults are ``builtin:arith``."""

    min_operands: int = 2
    max_operands: int = 26  # at most 26 ** label_letters
    # P(size = k) ∝ (k - min_operands + 1) ** -zipf_alpha: about a third of items have two
    # operands, while p99 needs ~25 (solution length p99/p50 ≈ 9).
    zipf_alpha: float = 1.3
    max_operand: int = 9  # operands are uniform in 1..max_operand
    # Share of all prompt texts that belong to the eval split (hash-assigned, see split_of).
    eval_fraction: float = 0.1
    # Letters per operand label: 1 labels a..z (builtin:arith), 2 labels aa, ab, .. zz (up to 676
    # operands, builtin:arith-long). It also fixes the width of the padded totals (the largest
    # sum the labels allow), so configs that differ only in their sizes write the same format.
    label_letters: int = 1

    def validate(self) -> None:
        """Raise ValueError naming the bad knob and a valid range."""
        if not 1 <= self.label_letters <= MAX_LABEL_LETTERS:
            raise ValueError(
                f"ArithConfig.label_letters must be 1 (labels a..z) or 2 (aa..zz), got "
                f"{self.label_letters}"
            )
        most = label_capacity(self.label_letters)
        if not 2 <= self.min_operands <= self.max_operands <= most:
            raise ValueError(
                f"ArithConfig: need 2 <= min_operands <= max_operands <= {most} (one "
                f"{self.label_letters}-letter label per operand; label_letters=2 allows "
                f"{label_capacity(2)}), got min_operands={self.min_operands}, "
                f"max_operands={self.max_operands}"
            )
        if self.zipf_alpha <= 0:
            raise ValueError(f"ArithConfig.zipf_alpha must be > 0, got {self.zipf_alpha}")
        if self.max_operand < 2:
            raise ValueError(f"ArithConfig.max_operand must be >= 2, got {self.max_operand}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(
                f"ArithConfig.eval_fraction must be in (0, 1), got {self.eval_fraction}"
            )


DEFAULT_CONFIG = ArithConfig()


def size_distribution(config: ArithConfig = DEFAULT_CONFIG) -> tuple[np.ndarray, np.ndarray]:
    """Return (sizes, probabilities) of the truncated Zipf over the number of operands."""
    config.validate()
    sizes = np.arange(config.min_operands, config.max_operands + 1)
    weights = (sizes - config.min_operands + 1.0) ** -config.zipf_alpha
    return sizes, weights / weights.sum()


def split_of(prompt: str, config: ArithConfig = DEFAULT_CONFIG) -> str:
    """The split a prompt text belongs to, fixed by a hash of the text (seed-independent)."""
    digest = hashlib.blake2b(prompt.encode(), digest_size=8).digest()
    bucket = int.from_bytes(digest, "big") / 2.0**64  # uniform in [0, 1)
    return "eval" if bucket < config.eval_fraction else "train"


def make_item(operands: list[int], config: ArithConfig = DEFAULT_CONFIG) -> TaskItem:
    """Build the item (prompt, running-total solution, answer) for a list of operands."""
    most = label_capacity(config.label_letters)
    if not 2 <= len(operands) <= most or any(not 0 <= x <= config.max_operand for x in operands):
        raise ValueError(
            f"make_item needs 2..{most} operands (ArithConfig.label_letters="
            f"{config.label_letters}) in 0..{config.max_operand} (ArithConfig.max_operand), "
            f"got {operands}"
        )
    op_width = len(str(config.max_operand))
    total_width = len(str(config.max_operand * most))  # the largest sum the labels allow
    labels = operand_labels(len(operands), config.label_letters)
    labelled = " ".join(f"{a}{x:0{op_width}d}" for a, x in zip(labels, operands, strict=True))
    prompt = f"{PROMPT_PREFIX}{labelled}\n"
    total = operands[0]
    lines = []
    for label, x in zip(labels[1:], operands[1:], strict=True):
        op = f"{x:0{op_width}d}"
        lines.append(f"{label}{op}: {total:0{total_width}d}+{op}={total + x:0{total_width}d}")
        total += x
    lines.append(f"{ANSWER_PREFIX}{total}")  # unpadded: the gold answer as a plain number
    return TaskItem(prompt=prompt, answer=str(total), solution="\n".join(lines), size=len(operands))


def generate(
    n: int, seed: int, split: str = "train", config: ArithConfig = DEFAULT_CONFIG
) -> list[TaskItem]:
    """``n`` items of ``split`` ("train" or "eval"), deterministic in (n, seed, split, config).

    A larger ``n`` with the same seed extends the list: the first items are the same.
    """
    if split not in SPLITS:
        raise ValueError(f"generate: split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise ValueError(f"generate: n must be >= 0, got {n}")
    sizes, probs = size_distribution(config)
    rng = np.random.default_rng(np.random.SeedSequence([seed, _SPLIT_STREAM[split]]))
    items: list[TaskItem] = []
    seen: set[str] = set()
    while len(items) < n:
        size = int(rng.choice(sizes, p=probs))
        operands = rng.integers(1, config.max_operand + 1, size=size).tolist()
        item = make_item(operands, config)
        # Rejection keeps the splits disjoint; it removes the same share of every size on
        # average. Eval prompts are also distinct (a repeat would count one question twice),
        # so once the few small eval prompts are used, the eval mix leans to larger sizes.
        if split_of(item.prompt, config) != split or (split == "eval" and item.prompt in seen):
            continue
        seen.add(item.prompt)
        items.append(item)
    return items


def parse_operands(prompt: str) -> list[int]:
    """Inverse of the prompt format: the operands of ``"Add: a7 b9 c5\\n"`` (or of the
    two-letter ``"Add: aa7 ab9 ac5\\n"``)."""
    if not prompt.startswith(PROMPT_PREFIX):
        raise ValueError(f"not an arith prompt (expected {PROMPT_PREFIX!r}...): {prompt!r}")
    pairs = _OPERAND.findall(prompt)
    letters = len(pairs[0][0]) if pairs else 1
    if (
        len(pairs) < 2
        or letters > MAX_LABEL_LETTERS
        or len(pairs) > label_capacity(letters)
        or [label for label, _ in pairs] != operand_labels(len(pairs), letters)
    ):
        raise ValueError(
            f"arith prompt without labels a, b, c, ... (or aa, ab, ac, ...) in order: {prompt!r}"
        )
    return [int(value) for _, value in pairs]
