"""Metric specs of the spot drafter machinery and the rollout worker's control surface.

Written as ``longtail_api.metrics.MetricSpec`` entries so that the lead can move them verbatim
into the shared ``api/longtail_api/metrics.py`` (this package may not edit it); until then the
rollout worker (``rollout/control.py``, ``rollout/http.py``) and ``acceptance.py`` build their
collectors from these. Values that already live in Python objects (buffer sizes, trainer steps,
versions) are exported by scrape-time collectors, so nothing is counted twice.
"""

from __future__ import annotations

from longtail_api.metrics import LABEL_CODE, LABEL_ENDPOINT, MetricSpec

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
