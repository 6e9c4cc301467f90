"""Built-in tasks: generated prompts with checkable answers (``dataset.path: builtin:<name>``).

Each task module exposes ``generate(n, seed, split) -> list[TaskItem]`` (see
:mod:`longtail_workers.tasks.arith`, the long-tailed arithmetic task ``builtin:arith``, and
:mod:`longtail_workers.tasks.arith_long`, its variant with answers up to 2,036 tokens,
``builtin:arith-long``). The dataset loader imports a task module only when a job names it.
"""
