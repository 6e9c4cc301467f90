"""The rollout engine's Prometheus metrics: what ``longtail_workers.engine.stats.RolloutMetrics``
builds its collectors from (decode steps, tokens, drafts, accepted length, step latency, batch).

Split from ``metrics.py`` (which re-exports every name here, so ``metrics.ROLLOUT_...`` is the
spelling the workers use) to keep files small. Kept out of ``metrics.ALL_METRICS``: the
generated observability reference lists these in a section of their own.

Pure module: standard library and ``longtail_api`` only.
"""

from __future__ import annotations

from longtail_api.metrictypes import MetricSpec

LABEL_MODE = "mode"
"""Kind of one engine step: ``sd`` (speculative), ``plain`` or ``prefill``."""

ROLLOUT_DECODE_STEPS_TOTAL = MetricSpec(
    "longtail_rollout_decode_steps_total",
    "counter",
    "Engine steps by mode (sd, plain, prefill).",
    labels=(LABEL_MODE,),
)
ROLLOUT_GENERATED_TOKENS_TOTAL = MetricSpec(
    "longtail_rollout_generated_tokens_total", "counter", "Tokens generated (committed)."
)
ROLLOUT_DRAFT_TOKENS_TOTAL = MetricSpec(
    "longtail_rollout_draft_tokens_total", "counter", "Draft tokens proposed by the drafter."
)
ROLLOUT_ACCEPTED_DRAFT_TOKENS_TOTAL = MetricSpec(
    "longtail_rollout_accepted_draft_tokens_total",
    "counter",
    "Draft tokens accepted by the target.",
)
ROLLOUT_ACCEPTED_LENGTH = MetricSpec(
    "longtail_rollout_accepted_length",
    "histogram",
    "Tokens gained per sequence per speculative step (accepted drafts + 1).",
    buckets=(1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 33),
)
ROLLOUT_STEP_SECONDS = MetricSpec(
    "longtail_rollout_step_seconds",
    "histogram",
    "Latency of one engine step by mode.",
    labels=(LABEL_MODE,),
)
ROLLOUT_RUNNING_SEQUENCES = MetricSpec(
    "longtail_rollout_running_sequences", "gauge", "Sequences being decoded."
)
ROLLOUT_WAITING_SEQUENCES = MetricSpec(
    "longtail_rollout_waiting_sequences", "gauge", "Sequences queued."
)
ROLLOUT_SD_ACTIVE = MetricSpec(
    "longtail_rollout_sd_active", "gauge", "1 while speculative decoding is on."
)
ROLLOUT_DRAFT_DEPTH = MetricSpec(
    "longtail_rollout_draft_depth", "gauge", "Draft depth of the last SD step."
)
ROLLOUT_TOKENS_PER_SECOND = MetricSpec(
    "longtail_rollout_tokens_per_second", "gauge", "Tokens per second of the last step."
)
ROLLOUT_ACCEPTANCE_RATE = MetricSpec(
    "longtail_rollout_acceptance_rate", "gauge", "Cumulative accepted / proposed draft tokens."
)

ROLLOUT_ENGINE_METRICS: tuple[MetricSpec, ...] = (
    ROLLOUT_DECODE_STEPS_TOTAL,
    ROLLOUT_GENERATED_TOKENS_TOTAL,
    ROLLOUT_DRAFT_TOKENS_TOTAL,
    ROLLOUT_ACCEPTED_DRAFT_TOKENS_TOTAL,
    ROLLOUT_ACCEPTED_LENGTH,
    ROLLOUT_STEP_SECONDS,
    ROLLOUT_RUNNING_SEQUENCES,
    ROLLOUT_WAITING_SEQUENCES,
    ROLLOUT_SD_ACTIVE,
    ROLLOUT_DRAFT_DEPTH,
    ROLLOUT_TOKENS_PER_SECOND,
    ROLLOUT_ACCEPTANCE_RATE,
)
"""Everything the rollout engine exports. Kept out of :data:`ALL_METRICS`: the generated
observability reference lists them in a section of their own, read from the live collectors."""

ROLLOUT_METRIC_NAMES: tuple[str, ...] = tuple(m.name for m in ROLLOUT_ENGINE_METRICS)
"""The names of :data:`ROLLOUT_ENGINE_METRICS`."""
