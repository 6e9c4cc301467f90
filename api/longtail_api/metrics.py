"""The one list of Prometheus metric names shared by workers, the operator and dashboards.

Workers create their collectors from the :class:`MetricSpec` entries here (so a name, its type,
help text and labels are written once), the operator reads the same names when it scrapes
worker ``/metrics``, and the Grafana dashboards and alert rules query them. Every name starts
with ``longtail_``; counters end in ``_total`` and durations in ``_seconds`` as Prometheus
naming conventions ask. Renaming a metric here is a breaking change for dashboards.

Pure module: standard library only. Add new roles' metrics as new sections below and list
them in :data:`ALL_METRICS`. Sections: verifier, spot drafter training, rollout worker control,
rollout engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PREFIX = "longtail_"
"""Prefix of every Longtail metric name."""

MetricKind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class MetricSpec:
    """Name, type, help text and label names of one metric."""

    name: str
    """Full exposition name, e.g. ``longtail_verifier_requests_total``."""
    kind: MetricKind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    """Histogram bucket upper bounds; ``None`` for counters, gauges and default buckets."""


# Label names used across metrics.
LABEL_ENDPOINT = "endpoint"
"""HTTP path of a known endpoint (``/v1/verify``), or ``other`` for unknown paths."""
LABEL_CODE = "code"
"""HTTP status code as a string, e.g. ``200``, ``413``."""
LABEL_REWARD = "reward"
"""Reward function name, e.g. ``math``."""

# --- verifier -----------------------------------------------------------------------------

VERIFIER_REQUESTS_TOTAL = MetricSpec(
    name="longtail_verifier_requests_total",
    kind="counter",
    help="HTTP requests handled by the verifier, by endpoint and status code.",
    labels=(LABEL_ENDPOINT, LABEL_CODE),
)
VERIFIER_REQUEST_DURATION_SECONDS = MetricSpec(
    name="longtail_verifier_request_duration_seconds",
    kind="histogram",
    help="Time from reading a request to sending its response, by endpoint.",
    labels=(LABEL_ENDPOINT,),
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
VERIFIER_BATCH_SIZE = MetricSpec(
    name="longtail_verifier_batch_size",
    kind="histogram",
    help="Items per accepted /v1/verify request.",
    buckets=(1, 4, 16, 64, 256, 1024, 4096, 16384),
)
VERIFIER_ITEMS_SCORED_TOTAL = MetricSpec(
    name="longtail_verifier_items_scored_total",
    kind="counter",
    help="Answers scored, by reward function.",
    labels=(LABEL_REWARD,),
)
VERIFIER_ITEMS_CORRECT_TOTAL = MetricSpec(
    name="longtail_verifier_items_correct_total",
    kind="counter",
    help="Answers scored as correct, by reward function.",
    labels=(LABEL_REWARD,),
)
VERIFIER_ITEMS_UNFORMATTED_TOTAL = MetricSpec(
    name="longtail_verifier_items_unformatted_total",
    kind="counter",
    help="Answers with no well-formed final answer (no box, no 'Answer:' line), by reward.",
    labels=(LABEL_REWARD,),
)
VERIFIER_REWARD = MetricSpec(
    name="longtail_verifier_reward",
    kind="histogram",
    help="Distribution of per-item rewards, by reward function (sum/count give the mean).",
    labels=(LABEL_REWARD,),
    buckets=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
)

VERIFIER_METRICS: tuple[MetricSpec, ...] = (
    VERIFIER_REQUESTS_TOTAL,
    VERIFIER_REQUEST_DURATION_SECONDS,
    VERIFIER_BATCH_SIZE,
    VERIFIER_ITEMS_SCORED_TOTAL,
    VERIFIER_ITEMS_CORRECT_TOTAL,
    VERIFIER_ITEMS_UNFORMATTED_TOTAL,
    VERIFIER_REWARD,
)
"""Everything the verifier exports."""

LABEL_REASON = "reason"
"""Why a captured sequence was dropped or evicted (stale_step, lock_contended, capacity, ...)."""
LABEL_STATE = "state"
"""Spot trainer state: idle, training, stopping, failed."""
LABEL_ROLE = "role"
"""A worker activity from ``longtail_api.harvest.Activity``."""
LABEL_DRAFTER_VERSION = "drafter_version"
LABEL_POLICY_VERSION = "policy_version"

# --- spot buffer and trainer --------------------------------------------------------------

SPOT_BUFFER_TOKENS = MetricSpec(
    "longtail_spot_buffer_tokens", "gauge", "Captured tokens held for drafter training."
)
SPOT_BUFFER_BYTES = MetricSpec(
    "longtail_spot_buffer_bytes", "gauge", "Bytes (tokens + hidden states) held for training."
)
SPOT_BUFFER_CAPTURED_TOKENS_TOTAL = MetricSpec(
    "longtail_spot_buffer_captured_tokens_total",
    "counter",
    "Tokens ever stored in the capture buffer.",
)
SPOT_BUFFER_DROPPED_TOTAL = MetricSpec(
    "longtail_spot_buffer_dropped_sequences_total",
    "counter",
    "Captured sequences not stored, by reason.",
    labels=(LABEL_REASON,),
)
SPOT_BUFFER_EVICTED_TOTAL = MetricSpec(
    "longtail_spot_buffer_evicted_sequences_total",
    "counter",
    "Stored sequences evicted (capacity, old step), by reason.",
    labels=(LABEL_REASON,),
)
SPOT_TRAIN_STEPS_TOTAL = MetricSpec(
    "longtail_spot_train_steps_total", "counter", "Drafter optimizer steps taken by this worker."
)
SPOT_TRAIN_LOSS = MetricSpec(
    "longtail_spot_train_loss", "gauge", "Drafter training loss of the last optimizer step."
)
SPOT_TRAINER_STATE = MetricSpec(
    "longtail_spot_trainer_state",
    "gauge",
    "1 for the spot trainer's current state, 0 for the others.",
    labels=(LABEL_STATE,),
)
SPOT_STOP_LATENCY_SECONDS = MetricSpec(
    "longtail_spot_last_stop_latency_seconds",
    "gauge",
    "Stop request to training-thread exit, for the last stopped window.",
)

# --- versions and acceptance --------------------------------------------------------------

POLICY_VERSION = MetricSpec(
    "longtail_worker_policy_version", "gauge", "Policy weights version the worker generates with."
)
DRAFTER_VERSION = MetricSpec(
    "longtail_worker_drafter_version",
    "gauge",
    "Drafter version the worker's engine drafts with (-1: the unpublished initial drafter).",
)
DRAFTER_ACCEPTED_LENGTH = MetricSpec(
    "longtail_drafter_accepted_length",
    "gauge",
    "Mean accepted length (accepted drafts + 1 per speculative step) per drafter version; "
    "the most recent versions only.",
    labels=(LABEL_DRAFTER_VERSION,),
)
POLICY_ACCEPTED_LENGTH = MetricSpec(
    "longtail_policy_accepted_length",
    "gauge",
    "Mean accepted length per policy version; the most recent versions only.",
    labels=(LABEL_POLICY_VERSION,),
)

# --- worker control surface ---------------------------------------------------------------

WORKER_ROLE = MetricSpec(
    "longtail_worker_role",
    "gauge",
    "1 for the activity the worker is doing now (role-info metric to join GPU metrics on).",
    labels=(LABEL_ROLE,),
)
WORKER_GENERATING = MetricSpec(
    "longtail_worker_generating", "gauge", "1 while the worker is generating a rollout."
)
WORKER_IDLE_SECONDS = MetricSpec(
    "longtail_worker_idle_seconds",
    "gauge",
    "Seconds since the worker finished its last generation (0 while generating).",
)
WORKER_CONTROL_REQUESTS_TOTAL = MetricSpec(
    "longtail_worker_control_requests_total",
    "counter",
    "HTTP requests to the worker's control surface, by endpoint and status code.",
    labels=(LABEL_ENDPOINT, LABEL_CODE),
)
WORKER_ROLE_SWITCH_SECONDS = MetricSpec(
    "longtail_worker_role_switch_seconds",
    "histogram",
    "Time from receiving a role change to acknowledging it (target p95 < 2 s).",
    labels=(LABEL_ROLE,),
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0),
)

SPOT_METRICS: tuple[MetricSpec, ...] = (
    SPOT_BUFFER_TOKENS,
    SPOT_BUFFER_BYTES,
    SPOT_BUFFER_CAPTURED_TOKENS_TOTAL,
    SPOT_BUFFER_DROPPED_TOTAL,
    SPOT_BUFFER_EVICTED_TOTAL,
    SPOT_TRAIN_STEPS_TOTAL,
    SPOT_TRAIN_LOSS,
    SPOT_TRAINER_STATE,
    SPOT_STOP_LATENCY_SECONDS,
    POLICY_VERSION,
    DRAFTER_VERSION,
    DRAFTER_ACCEPTED_LENGTH,
    POLICY_ACCEPTED_LENGTH,
)
"""Everything the spot machinery exports (to be appended to ``ALL_METRICS``)."""

WORKER_CONTROL_METRICS: tuple[MetricSpec, ...] = (
    WORKER_ROLE,
    WORKER_GENERATING,
    WORKER_IDLE_SECONDS,
    WORKER_CONTROL_REQUESTS_TOTAL,
    WORKER_ROLE_SWITCH_SECONDS,
)
"""Everything the rollout worker's control surface exports."""

# --- rollout engine -------------------------------------------------------------------------
# Names of the engine's collectors (``longtail_workers.engine.stats`` builds them).

ROLLOUT_METRIC_NAMES: tuple[str, ...] = (
    "longtail_rollout_decode_steps_total",
    "longtail_rollout_generated_tokens_total",
    "longtail_rollout_draft_tokens_total",
    "longtail_rollout_accepted_draft_tokens_total",
    "longtail_rollout_accepted_length",
    "longtail_rollout_step_seconds",
    "longtail_rollout_running_sequences",
    "longtail_rollout_waiting_sequences",
    "longtail_rollout_sd_active",
    "longtail_rollout_draft_depth",
    "longtail_rollout_tokens_per_second",
    "longtail_rollout_acceptance_rate",
)
"""Every metric the rollout engine exports."""

ALL_METRICS: tuple[MetricSpec, ...] = VERIFIER_METRICS + SPOT_METRICS + WORKER_CONTROL_METRICS
"""Every Longtail metric declared as a spec; dashboards and tests check names against this
(plus :data:`ROLLOUT_METRIC_NAMES`)."""
