"""Micro ``builtin:tiny`` and ``builtin:small`` recipes for tests that build the model (and its
drafter) for real: seconds instead of minutes (tiny) or a GPU (small). Imported by name
(``conftest.py`` puts this directory on sys.path)."""

from __future__ import annotations

import dataclasses

from longtail_workers.models.builtin import TinyRecipe
from longtail_workers.models.recipe import SMALL, SftConfig
from longtail_workers.tasks import arith_long
from longtail_workers.tasks.arith import ArithConfig

# Seconds to build: a one-layer, 32-wide model fitted for a handful of steps.
MICRO = TinyRecipe(
    num_layers=1,
    hidden_size=32,
    num_heads=2,
    num_kv_heads=2,
    intermediate_size=64,
    sft=SftConfig(steps=3, warmup_steps=1, tokens_per_batch=256),
    style_sft=SftConfig(steps=2, warmup_steps=1, tokens_per_batch=256),
    train_items=64,
    train_task=ArithConfig(max_operands=6),
    task=ArithConfig(max_operands=3),
    eval_items=4,
)

# builtin:small's recipe (name, device "auto", the arith-long format, 4096 positions, both
# phases) scaled down: one 32-wide layer with grouped KV heads, a handful of steps.
MICRO_SMALL = dataclasses.replace(
    SMALL,
    num_layers=1,
    hidden_size=32,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=64,
    sft=SftConfig(steps=3, warmup_steps=1, tokens_per_batch=1024),
    style_sft=SftConfig(steps=2, warmup_steps=1, tokens_per_batch=1024),
    train_items=48,
    train_task=dataclasses.replace(arith_long.CONFIG, max_operands=12),
    task=dataclasses.replace(arith_long.CONFIG, max_operands=3),
    eval_items=4,
)
