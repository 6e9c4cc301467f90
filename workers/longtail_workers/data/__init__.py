"""Datasets of the trainer: prompts with gold answers, from files or built-in tasks.

The trainer worker (and local mode through it) calls :func:`resolve_dataset` with the job's
``spec.dataset`` to get the train and eval examples, :func:`iterate_batches` for the seeded
prompt order, :func:`format_prompt` / :func:`format_example` to put each prompt into the
text the policy sees, and :func:`reward_name` for the reward that scores each example.
Modules: ``loader`` (public entry points, splits, order), ``readers`` (jsonl / parquet),
``records`` (row -> :class:`Example` checks), ``prompts`` (chat template).
"""

from longtail_workers.data.loader import (
    BUILTIN_TASKS,
    SUPPORTED_EXTENSIONS,
    DatasetError,
    Example,
    epoch_order,
    holdout_split,
    iterate_batches,
    load_examples,
    resolve_dataset,
    reward_name,
    shuffle,
)
from longtail_workers.data.prompts import format_example, format_prompt, has_chat_template

__all__ = [
    "BUILTIN_TASKS",
    "SUPPORTED_EXTENSIONS",
    "DatasetError",
    "Example",
    "epoch_order",
    "format_example",
    "format_prompt",
    "has_chat_template",
    "holdout_split",
    "iterate_batches",
    "load_examples",
    "resolve_dataset",
    "reward_name",
    "shuffle",
]
