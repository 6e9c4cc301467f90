"""The one list of Prometheus metric names shared by workers, the operator and dashboards.

Workers create their collectors from the :class:`MetricSpec` entries here (so a name, its type,
help text and labels are written once), the operator reads the same names when it scrapes
worker ``/metrics``, and the Grafana dashboards and alert rules query them. Every name starts
with ``longtail_``; counters end in ``_total`` and durations in ``_seconds`` as Prometheus
naming conventions ask. Renaming a metric here is a breaking change for dashboards.

Pure module: standard library and ``longtail_api`` only. Add new roles' metrics as new
sections below and list them in :data:`ALL_METRICS`. Sections: verifier, spot drafter
training, rollout worker control, operator, trainer, dedicated drafter worker; the rollout
engine's are in ``enginemetrics.py`` and :class:`MetricSpec` in ``metrictypes.py``, both
re-exported here.
"""

from __future__ import annotations

from longtail_api import enginemetrics as _engine
from longtail_api.metrictypes import PREFIX as PREFIX
from longtail_api.metrictypes import MetricKind as MetricKind
from longtail_api.metrictypes import MetricSpec as MetricSpec

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
"""Why a captured sequence was dropped or evicted (stale_step, lock_contended, capacity, ...),
or why the trainer refused a drafter candidate (``drafterstatus.REFUSAL_REASONS``)."""
LABEL_STATE = "state"
"""Spot trainer state: idle, training, stopping, failed."""
LABEL_ROLE = "role"
"""A worker activity from ``longtail_api.harvest.Activity``."""
LABEL_DRAFTER_VERSION = "drafter_version"
LABEL_POLICY_VERSION = "policy_version"
LABEL_SOURCE = "source"
"""What drafted a row of a speculative step: ``learned`` or ``history``
(``longtail_api.policies.DRAFT_SOURCES``; a ``hybrid`` strategy drafts each row from one)."""

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

WORKER_SD_TOKENS_TOTAL = MetricSpec(
    "longtail_worker_sd_tokens_total",
    "counter",
    "Tokens committed in speculative steps, by the draft source of the rows that committed "
    "them (learned, history): each drafter's token share.",
    labels=(LABEL_SOURCE,),
)
WORKER_ACCEPTED_LENGTH = MetricSpec(
    "longtail_worker_accepted_length",
    "histogram",
    "Tokens gained per row per speculative step (accepted drafts + 1), by the draft source of "
    "the row (learned, history).",
    labels=(LABEL_SOURCE,),
    buckets=(1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 33),
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
WORKER_WEIGHTS_REFUSED_TOTAL = MetricSpec(
    "longtail_worker_weights_refused_total",
    "counter",
    "Policy weight pieces (HTTP pull: a piece, or a version's list of pieces; broadcast: a "
    "bucket) this worker refused because they did not match the checksum the trainer sent; "
    "nothing was loaded and the version is fetched again (a corrupted transfer, or a trainer "
    "and worker of different Longtail versions).",
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
    WORKER_SD_TOKENS_TOTAL,
    WORKER_ACCEPTED_LENGTH,
)
"""Everything the spot machinery exports (to be appended to ``ALL_METRICS``)."""

WORKER_CONTROL_METRICS: tuple[MetricSpec, ...] = (
    WORKER_ROLE,
    WORKER_GENERATING,
    WORKER_IDLE_SECONDS,
    WORKER_CONTROL_REQUESTS_TOTAL,
    WORKER_ROLE_SWITCH_SECONDS,
    WORKER_WEIGHTS_REFUSED_TOTAL,
)
"""Everything the rollout worker's control surface exports."""

# --- rollout engine -------------------------------------------------------------------------
# Declared in ``enginemetrics.py`` (split to keep this file small), spelled here as the
# workers and the chart generator read them.

LABEL_MODE = _engine.LABEL_MODE
ROLLOUT_ACCEPTANCE_RATE = _engine.ROLLOUT_ACCEPTANCE_RATE
ROLLOUT_ACCEPTED_DRAFT_TOKENS_TOTAL = _engine.ROLLOUT_ACCEPTED_DRAFT_TOKENS_TOTAL
ROLLOUT_ACCEPTED_LENGTH = _engine.ROLLOUT_ACCEPTED_LENGTH
ROLLOUT_DECODE_STEPS_TOTAL = _engine.ROLLOUT_DECODE_STEPS_TOTAL
ROLLOUT_DRAFT_DEPTH = _engine.ROLLOUT_DRAFT_DEPTH
ROLLOUT_DRAFT_TOKENS_TOTAL = _engine.ROLLOUT_DRAFT_TOKENS_TOTAL
ROLLOUT_ENGINE_METRICS = _engine.ROLLOUT_ENGINE_METRICS
ROLLOUT_GENERATED_TOKENS_TOTAL = _engine.ROLLOUT_GENERATED_TOKENS_TOTAL
ROLLOUT_METRIC_NAMES = _engine.ROLLOUT_METRIC_NAMES
ROLLOUT_RUNNING_SEQUENCES = _engine.ROLLOUT_RUNNING_SEQUENCES
ROLLOUT_SD_ACTIVE = _engine.ROLLOUT_SD_ACTIVE
ROLLOUT_STEP_SECONDS = _engine.ROLLOUT_STEP_SECONDS
ROLLOUT_TOKENS_PER_SECOND = _engine.ROLLOUT_TOKENS_PER_SECOND
ROLLOUT_WAITING_SEQUENCES = _engine.ROLLOUT_WAITING_SEQUENCES

# --- operator -------------------------------------------------------------------------------
# The operator's own /metrics (longtail_operator.metrics builds the collectors from these).

LABEL_RESULT = "result"
"""Outcome of one operation: for reconciles ``ok``, ``retry`` (temporary error, retried),
``failed`` (permanent error) or ``invalid`` (spec failed validation); for role switches
``acknowledged``, ``pending``, ``refused`` or ``error``."""
LABEL_PHASE = "phase"
"""An RLJob phase from ``longtail_api.status.PHASES``."""
LABEL_NAMESPACE = "namespace"
LABEL_RLJOB = "rljob"
LABEL_TARGET = "target"
"""Which status endpoint was polled: ``trainer`` or ``worker``."""
LABEL_GPU_STATE = "state"
"""GPU accounting bucket: ``total``, ``idle``, ``harvested`` or ``drafter`` (dedicated drafter
pods)."""

OPERATOR_RECONCILE_TOTAL = MetricSpec(
    "longtail_operator_reconcile_total",
    "counter",
    "RLJob reconciles, by result (ok, retry, failed, invalid).",
    labels=(LABEL_RESULT,),
)
OPERATOR_RECONCILE_DURATION_SECONDS = MetricSpec(
    "longtail_operator_reconcile_duration_seconds",
    "histogram",
    "Time of one RLJob reconcile (read children, create/delete, derive status), by result.",
    labels=(LABEL_RESULT,),
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
OPERATOR_RECONCILE_ERRORS_TOTAL = MetricSpec(
    "longtail_operator_reconcile_errors_total",
    "counter",
    "Reconciles that raised, by CamelCase reason (e.g. ApiError, ValidationFailed).",
    labels=(LABEL_REASON,),
)
OPERATOR_JOBS = MetricSpec(
    "longtail_operator_jobs",
    "gauge",
    "RLJobs the operator currently tracks, by phase.",
    labels=(LABEL_PHASE,),
)
OPERATOR_JOB_GPUS = MetricSpec(
    "longtail_operator_job_gpus",
    "gauge",
    "GPUs of one RLJob by state (total requested, idle now, harvested for drafter training now, "
    "drafter: ready dedicated drafter pods).",
    labels=(LABEL_NAMESPACE, LABEL_RLJOB, LABEL_GPU_STATE),
)
OPERATOR_HARVESTED_GPU_SECONDS_TOTAL = MetricSpec(
    "longtail_operator_harvested_gpu_seconds_total",
    "counter",
    "GPU-seconds spent on drafter training by GPUs that would otherwise have idled.",
    labels=(LABEL_NAMESPACE, LABEL_RLJOB),
)
OPERATOR_ROLE_SWITCHES_TOTAL = MetricSpec(
    "longtail_operator_role_switches_total",
    "counter",
    "Role changes sent to workers, by target activity and result (acknowledged, pending, "
    "refused, error).",
    labels=(LABEL_ROLE, LABEL_RESULT),
)
OPERATOR_ROLE_SWITCH_SECONDS = MetricSpec(
    "longtail_operator_role_switch_seconds",
    "histogram",
    "Harvest decision to acknowledged role switch, including retries (target p95 < 2 s).",
    labels=(LABEL_ROLE,),
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0),
)
OPERATOR_STATUS_POLLS_TOTAL = MetricSpec(
    "longtail_operator_status_polls_total",
    "counter",
    "Polls of trainer and worker status endpoints, by target and result (ok, error).",
    labels=(LABEL_TARGET, LABEL_RESULT),
)
OPERATOR_UNREACHABLE_WORKERS = MetricSpec(
    "longtail_operator_unreachable_workers",
    "gauge",
    "Worker pods of one running RLJob whose status endpoint failed several polls in a row "
    "(the RLJob's WorkersUnreachable condition names them).",
    labels=(LABEL_NAMESPACE, LABEL_RLJOB),
)

OPERATOR_IDLENESS_SOURCE_UP = MetricSpec(
    "longtail_operator_idleness_source_up",
    "gauge",
    "1 while a running RLJob's GPU idleness source answers, 0 while it fails (harvest.source "
    "prometheus: the query errs or Prometheus is down; nothing is harvested then, the RLJob's "
    "IdlenessUnavailable condition says why).",
    labels=(LABEL_NAMESPACE, LABEL_RLJOB),
)

OPERATOR_METRICS: tuple[MetricSpec, ...] = (
    OPERATOR_RECONCILE_TOTAL,
    OPERATOR_RECONCILE_DURATION_SECONDS,
    OPERATOR_RECONCILE_ERRORS_TOTAL,
    OPERATOR_JOBS,
    OPERATOR_JOB_GPUS,
    OPERATOR_HARVESTED_GPU_SECONDS_TOTAL,
    OPERATOR_ROLE_SWITCHES_TOTAL,
    OPERATOR_ROLE_SWITCH_SECONDS,
    OPERATOR_STATUS_POLLS_TOTAL,
    OPERATOR_UNREACHABLE_WORKERS,
    OPERATOR_IDLENESS_SOURCE_UP,
)
"""Everything the operator exports on its metrics port."""


# --- trainer --------------------------------------------------------------------------------
# The trainer (step driver) exports these on its /metrics; the RL job overview dashboard and the
# "job stuck" alert read them.

LABEL_STAGE = "stage"
"""Part of one RL step: ``rollout`` (step start until the first rollout worker runs out of
work), ``tail`` (from then until the last answer arrives: the long tail), ``train`` (rewards,
advantages, policy update) or ``sync`` (new policy weights to the rollout workers)."""

TRAINER_STEP = MetricSpec(
    "longtail_trainer_step",
    "gauge",
    "Last RL step the trainer completed (0 before the first); resumes from the checkpoint.",
)
TRAINER_LAST_STEP_TIMESTAMP = MetricSpec(
    "longtail_trainer_last_step_timestamp_seconds",
    "gauge",
    "Unix time the trainer completed its last step (its start time before the first step); "
    "the 'job stuck' alert fires when this stops moving.",
)
TRAINER_STEP_SECONDS = MetricSpec(
    "longtail_trainer_step_seconds",
    "histogram",
    "Wall time of one whole RL step (rollout + tail + train + sync).",
    buckets=(1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0),
)
TRAINER_STAGE_SECONDS = MetricSpec(
    "longtail_trainer_stage_seconds",
    "histogram",
    "Wall time of one stage of an RL step, by stage (rollout, tail, train, sync).",
    labels=(LABEL_STAGE,),
    buckets=(0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0),
)
TRAINER_REWARD_MEAN = MetricSpec(
    "longtail_trainer_reward_mean",
    "gauge",
    "Mean reward of the answers of the last completed step.",
)
TRAINER_ACCURACY = MetricSpec(
    "longtail_trainer_accuracy",
    "gauge",
    "Fraction of the last completed step's answers that the verifier scored correct.",
)
TRAINER_POLICY_VERSION = MetricSpec(
    "longtail_trainer_policy_version",
    "gauge",
    "Policy weights version the trainer last published to the rollout workers.",
)

TRAINER_SD_FRACTION = MetricSpec(
    "longtail_trainer_sd_fraction",
    "gauge",
    "Share of the last completed step's generated tokens committed in speculative steps by the "
    "rows each draft source drafted, by source (learned, history; 0: it drafted nothing).",
    labels=(LABEL_SOURCE,),
)
TRAINER_ACCEPTED_LENGTH = MetricSpec(
    "longtail_trainer_accepted_length",
    "gauge",
    "Mean accepted length (accepted drafts + 1 per row and speculative step) of the last "
    "completed step, by draft source (learned, history; 0: it drafted nothing).",
    labels=(LABEL_SOURCE,),
)

TRAINER_HARVESTED_SECONDS_TOTAL = MetricSpec(
    "longtail_trainer_harvested_seconds_total",
    "counter",
    "Seconds of the trainer's waits for rollouts spent training the drafter (trainer harvest: "
    "'trainer' in harvest.eligibleRoles); stays 0 when the trainer is not a harvest target.",
)

TRAINER_DRAFTER_CANDIDATES_REJECTED_TOTAL = MetricSpec(
    "longtail_trainer_drafter_candidates_rejected_total",
    "counter",
    "Drafter candidates the trainer refused, each counted once, by stage and reason. Stage "
    "'upload' (answered 400, nothing stored; a log line names the field and value): reason "
    "'request' (no Content-Length, too large, no or a wrong sha256), 'query' (a malformed query "
    "field), 'policy_version' (newer than the trainer's policy version or older than it allows) "
    "or 'malformed' (not the job's drafter, no tensors, NaN/inf weights). Stage 'stale' "
    "(answered 409, nothing stored), reason 'base_version': trained from a drafter version that "
    "is not the latest. Stage 'merge' (dropped from the registry at the step's merge, never "
    "scored again): 'malformed', 'empty' (trained on no token), 'unverified' (no token the "
    "trainer can verify) or 'worse' (a well-formed drafter, or the merge of several, scoring "
    "below the current version on the trainer's held-out sample). Stage 'superseded', reason "
    "'superseded': accepted (201) while a newer version was being published from the other "
    "candidates, so never merged.",
    labels=(LABEL_STAGE, LABEL_REASON),
)

LABEL_BACKEND = "backend"
"""An experiment tracker the trainer logs to: ``tensorboard``, ``mlflow`` or ``wandb``
(``longtail_api.tracking``)."""

TRAINER_TRACKING_FAILURES_TOTAL = MetricSpec(
    "longtail_trainer_tracking_failures_total",
    "counter",
    "Failed attempts to hand records to an experiment tracker (spec.tracking), by backend: "
    "unreachable, refusing or erroring. Training goes on; the records wait in a bounded buffer "
    "and are sent when the tracker answers again (the trainer log names each failure).",
    labels=(LABEL_BACKEND,),
)
TRAINER_TRACKING_BUFFERED = MetricSpec(
    "longtail_trainer_tracking_buffered",
    "gauge",
    "Records (one per step, plus the parameters and artifacts) waiting to be sent to an "
    "experiment tracker, by backend; grows while the tracker is down.",
    labels=(LABEL_BACKEND,),
)
TRAINER_TRACKING_DROPPED_TOTAL = MetricSpec(
    "longtail_trainer_tracking_dropped_total",
    "counter",
    "Records dropped, oldest first, because the tracker stayed down past "
    "spec.tracking.bufferRecords, by backend.",
    labels=(LABEL_BACKEND,),
)

LABEL_SYNC_PHASE = "phase"
"""A phase of one policy version's weight sync: ``gather``, ``pack``, ``wire``, ``load`` or
``pause`` (``longtail_api.steprow.SYNC_PHASES`` says what each one is)."""
LABEL_TRANSPORT = "transport"
"""The weight-sync transport a version travelled by: ``http`` or ``broadcast`` (``unknown``
when the publisher did not say)."""

WEIGHT_SYNC_SECONDS = MetricSpec(
    "longtail_weight_sync_seconds",
    "histogram",
    "Seconds of each phase of a policy version's weight sync (gather, pack, wire: the trainer; "
    "load: the slowest rollout worker's pull and load; pause: all of it, the time the sync adds "
    "to a step), by phase and transport.",
    labels=(LABEL_SYNC_PHASE, LABEL_TRANSPORT),
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)
WEIGHT_SYNC_BYTES = MetricSpec(
    "longtail_weight_sync_bytes",
    "gauge",
    "Bytes of the last synced policy version as it travels (the rollout engine's dtype).",
    labels=(LABEL_TRANSPORT,),
)
WEIGHT_SYNC_BYTES_PER_SECOND = MetricSpec(
    "longtail_weight_sync_bytes_per_second",
    "gauge",
    "End-to-end rate of the last synced policy version: its bytes over its pause seconds.",
    labels=(LABEL_TRANSPORT,),
)

TRAINER_METRICS: tuple[MetricSpec, ...] = (
    TRAINER_STEP,
    TRAINER_LAST_STEP_TIMESTAMP,
    TRAINER_STEP_SECONDS,
    TRAINER_STAGE_SECONDS,
    TRAINER_REWARD_MEAN,
    TRAINER_ACCURACY,
    TRAINER_POLICY_VERSION,
    TRAINER_SD_FRACTION,
    TRAINER_ACCEPTED_LENGTH,
    TRAINER_HARVESTED_SECONDS_TOTAL,
    TRAINER_DRAFTER_CANDIDATES_REJECTED_TOTAL,
    WEIGHT_SYNC_SECONDS,
    WEIGHT_SYNC_BYTES,
    WEIGHT_SYNC_BYTES_PER_SECOND,
    TRAINER_TRACKING_FAILURES_TOTAL,
    TRAINER_TRACKING_BUFFERED,
    TRAINER_TRACKING_DROPPED_TOTAL,
)
"""Everything the trainer exports (dashboards and alerts need all of them)."""


# --- dedicated drafter worker (``longtail worker drafter``, spec.drafter) ---------------------

LABEL_OUTCOME = "outcome"
"""How a drafter window ended: submitted, dropped (quality gate), stale (a newer version was
published during it), empty (no answer long enough to train on)."""

DRAFTER_WORKER_WINDOWS_TOTAL = MetricSpec(
    "longtail_drafter_worker_windows_total",
    "counter",
    "Drafter windows the dedicated drafter worker ran, by outcome: 'submitted' (its candidate "
    "went to the trainer), 'dropped' (worse than its base on held-out answers), 'stale' (a newer "
    "drafter version was published meanwhile), 'empty' (nothing long enough to train on).",
    labels=(LABEL_OUTCOME,),
)

DRAFTER_WORKER_STEP = MetricSpec(
    "longtail_drafter_worker_step",
    "gauge",
    "The newest RL step whose answers the dedicated drafter worker trained on (0: none yet).",
)

DRAFTER_WORKER_METRICS: tuple[MetricSpec, ...] = (DRAFTER_WORKER_WINDOWS_TOTAL, DRAFTER_WORKER_STEP)
"""Everything the dedicated drafter worker exports."""


ALL_METRICS: tuple[MetricSpec, ...] = (
    VERIFIER_METRICS
    + SPOT_METRICS
    + WORKER_CONTROL_METRICS
    + OPERATOR_METRICS
    + TRAINER_METRICS
    + DRAFTER_WORKER_METRICS
)
"""Every Longtail metric declared as a spec; dashboards and tests check names against this
(plus :data:`ROLLOUT_ENGINE_METRICS`)."""
