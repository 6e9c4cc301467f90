"""``builtin:arith-long``: ``builtin:arith`` with up to 120 operands, answers up to 2,036 tokens.

The GPU-sized built-in policy (``builtin:small``, :data:`longtail_workers.models.recipe.SMALL`)
needs answers long enough for a GPU rollout's real tail: published RL traces run to a length cap
of several thousand tokens with p99 / median of 5 or more. ``builtin:arith`` stops at 26
operands (362 tokens), so this variant keeps its format and its generator
(:mod:`longtail_workers.tasks.arith`) and changes three knobs: two-letter labels (``aa``,
``ab``, ..., so more than 26 operands keep the label + value copy), 2 to 120 operands, and a
flatter Zipf law (exponent 1.0) that puts more items in the tail. Every step line is 17
characters, so the longest worked answer (120 operands, EOS included) is 2,036 tokens of the
built-in char tokenizer: it fits the ``maxNewTokens: 2048`` jobs give it. Over 20,000 training
items (tests/unit/workers/tasks/test_task_arith_long.py, docs/tasks-and-rewards.md): median
147 tokens, p99 about 1,950, p99 / median about 13.

Called by the dataset loader (``dataset.path: builtin:arith-long``, through
``data/loader.py``'s ``BUILTIN_TASKS``) and by the ``builtin:small`` build.
"""

from __future__ import annotations

from longtail_workers.tasks import arith
from longtail_workers.tasks.arith import ArithConfig, TaskItem

CONFIG = ArithConfig(min_operands=2, max_operands=120, zipf_alpha=1.0, label_letters=2)
"""The task's distribution: sizes 2..120, P(k) ∝ (k - 1) ** -1.0, labels ``aa`` .. ``ep``."""
MAX_NEW_TOKENS = 2048
"""The answer budget a job on this task gives (``algorithm.maxNewTokens``): the longest worked
answer, 2,036 tokens with EOS, fits it; prompts are at most 485 tokens."""


def generate(n: int, seed: int, split: str = "train") -> list[TaskItem]:
    """``n`` items of ``split`` ("train" or "eval"), deterministic in (n, seed, split)."""
    return arith.generate(n, seed, split, CONFIG)
