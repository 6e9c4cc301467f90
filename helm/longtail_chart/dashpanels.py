"""The panels of Longtail's three Grafana dashboards: what each shows and the PromQL behind it.

:mod:`longtail_chart.dashgen` lays these out and renders the JSON the chart ships. Queries use
the label conventions described there (``namespace``, ``pod``, ``rljob``, ``worker_role``) and
the Grafana variables ``$namespace``, ``$rljob`` and ``$__rate_interval``. Metric names must exist
in ``longtail_api.metrics`` (or :data:`DCGM_METRICS`); ``tests/unit/helm`` checks that and
parses every expression with ``promtool``.
"""

from __future__ import annotations

from dataclasses import dataclass

DCGM_METRICS: tuple[str, ...] = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
)
"""NVIDIA dcgm-exporter metrics the dashboards read (Longtail does not export them)."""

DS: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}
"""Every panel and query uses the dashboard's datasource variable, never a fixed UID."""
JOB = 'namespace=~"$namespace", rljob=~"$rljob"'
"""Label matchers selecting the chosen jobs' series."""
NS = 'namespace=~"$namespace"'
R = "$__rate_interval"


@dataclass
class Panel:
    """One Grafana panel: a title, its queries as (expr, legend) and how to draw it.

    :mod:`longtail_chart.dashgen` turns it into the SDK's timeseries or stat panel builder.
    """

    title: str
    queries: list[tuple[str, str]]
    kind: str = "timeseries"
    unit: str = "short"
    width: int = 12
    height: int = 8
    description: str = ""
    stack: bool = False


@dataclass
class Row:
    """A titled row of panels, laid out left to right and wrapped at the 24-column grid."""

    title: str
    panels: list[Panel]


def _ratio(num: str, den: str, by: str = "") -> str:
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({num}[{R}])) / sum{group} (rate({den}[{R}]))"


def _quantile(q: float, bucket: str, sel: str, by: str) -> str:
    matchers = f"{{{sel}}}" if sel else ""
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({bucket}{matchers}[{R}])))"


def _sum_rate(metric: str, sel: str = "", by: str = "") -> str:
    """``sum by (by) (rate(metric{sel}[$__rate_interval]))``."""
    group = f" by ({by})" if by else ""
    matchers = f"{{{sel}}}" if sel else ""
    return f"sum{group} (rate({metric}{matchers}[{R}]))"


def _p50_p95(bucket: str, sel: str, by: str, legend: str) -> list[tuple[str, str]]:
    return [
        (_quantile(0.5, bucket, sel, by), f"p50 {legend}"),
        (_quantile(0.95, bucket, sel, by), f"p95 {legend}"),
    ]


def _per_job(metric: str, legend: str = "{{rljob}}") -> tuple[str, str]:
    return (f"max by (rljob) ({metric}{{{JOB}}})", legend)


def _stat(title: str, query: tuple[str, str], unit: str = "short") -> Panel:
    return Panel(title, [query], kind="stat", unit=unit, width=4, height=4)


def job_overview_rows() -> list[Row]:
    """RL job overview: progress, step-time split, weight sync, reward/accuracy, versions,
    GPUs."""
    return [
        Row(
            "Progress",
            [
                _stat("Step", _per_job("longtail_trainer_step")),
                _stat("Policy version", _per_job("longtail_trainer_policy_version")),
                _stat(
                    "Drafter version (newest in use)", _per_job("longtail_worker_drafter_version")
                ),
                _stat(
                    "Mean step time",
                    (
                        _ratio(
                            f"longtail_trainer_step_seconds_sum{{{JOB}}}",
                            f"longtail_trainer_step_seconds_count{{{JOB}}}",
                            "rljob",
                        ),
                        "{{rljob}}",
                    ),
                    unit="s",
                ),
                _stat("Reward (last step)", _per_job("longtail_trainer_reward_mean")),
                _stat("Accuracy (last step)", _per_job("longtail_trainer_accuracy"), "percentunit"),
            ],
        ),
        Row(
            "Step time",
            [
                Panel(
                    "Step time split: rollout / tail / train / sync (mean per step)",
                    [
                        (
                            _ratio(
                                f"longtail_trainer_stage_seconds_sum{{{JOB}}}",
                                f"longtail_trainer_stage_seconds_count{{{JOB}}}",
                                "stage",
                            ),
                            "{{stage}}",
                        )
                    ],
                    unit="s",
                    stack=True,
                    description="The tail is the part of the rollout after the first rollout "
                    "worker ran out of work: the idle time Longtail harvests.",
                ),
                Panel(
                    "Step time (p50 / p95)",
                    _p50_p95("longtail_trainer_step_seconds_bucket", JOB, "rljob", "{{rljob}}"),
                    unit="s",
                ),
            ],
        ),
        Row(
            "Weight sync",
            [
                Panel(
                    "Weight sync seconds by phase (mean per policy version)",
                    [
                        (
                            _ratio(
                                f'longtail_weight_sync_seconds_sum{{{JOB}, phase!="pause"}}',
                                f'longtail_weight_sync_seconds_count{{{JOB}, phase!="pause"}}',
                                "phase, transport",
                            ),
                            "{{phase}} ({{transport}})",
                        )
                    ],
                    unit="s",
                    width=8,
                    stack=True,
                    description="Each policy version's trip to the rollout workers: gather "
                    "(the trainer's all-gathers), pack (cast, copy, hash into pieces/buckets), "
                    "wire (broadcast buckets on the wire; 0 over HTTP), load (the slowest "
                    "worker's pull and load at its next rollout). Stacked, they are the pause.",
                ),
                Panel(
                    "Rollout pause per policy version (p50 / p95)",
                    _p50_p95(
                        "longtail_weight_sync_seconds_bucket",
                        f'{JOB}, phase="pause"',
                        "transport",
                        "{{transport}}",
                    ),
                    unit="s",
                    width=8,
                    description="From the trainer starting a publish until the last rollout "
                    "worker holds the version: what the weight sync adds to a step.",
                ),
                Panel(
                    "Weight sync rate (GB/s, end to end)",
                    [
                        (
                            "max by (rljob, transport) "
                            f"(longtail_weight_sync_bytes_per_second{{{JOB}}})",
                            "{{rljob}} {{transport}}",
                        )
                    ],
                    unit="Bps",
                    width=8,
                    description="The last synced version's bytes over its pause seconds.",
                ),
            ],
        ),
        Row(
            "Reward and accuracy",
            [
                Panel(
                    "Reward and accuracy per step",
                    [
                        _per_job("longtail_trainer_reward_mean", "reward {{rljob}}"),
                        _per_job("longtail_trainer_accuracy", "accuracy {{rljob}}"),
                    ],
                ),
                Panel(
                    "Verifier: correct / formatted answers",
                    [
                        (
                            _ratio(
                                f"longtail_verifier_items_correct_total{{{JOB}}}",
                                f"longtail_verifier_items_scored_total{{{JOB}}}",
                                "reward",
                            ),
                            "correct ({{reward}})",
                        ),
                        (
                            "1 - "
                            + _ratio(
                                f"longtail_verifier_items_unformatted_total{{{JOB}}}",
                                f"longtail_verifier_items_scored_total{{{JOB}}}",
                                "reward",
                            ),
                            "well-formed ({{reward}})",
                        ),
                    ],
                    unit="percentunit",
                ),
            ],
        ),
        Row(
            "Versions and GPUs",
            [
                Panel(
                    "Policy and drafter versions",
                    [
                        _per_job("longtail_trainer_policy_version", "policy {{rljob}}"),
                        _per_job("longtail_worker_policy_version", "policy on workers {{rljob}}"),
                        _per_job("longtail_worker_drafter_version", "drafter {{rljob}}"),
                    ],
                ),
                Panel(
                    "GPUs: total / idle / harvested / drafter",
                    [(f"sum by (state) (longtail_operator_job_gpus{{{JOB}}})", "{{state}}")],
                    description="From the operator: GPUs requested by the job, idle now, "
                    "harvested now (training the drafter instead of idling), and those of the "
                    "ready dedicated drafter pods (spec.drafter).",
                ),
                Panel(
                    "Harvested GPU time (GPU-seconds per second)",
                    [
                        (
                            _sum_rate(
                                "longtail_operator_harvested_gpu_seconds_total", JOB, "rljob"
                            ),
                            "{{rljob}}",
                        )
                    ],
                ),
                Panel(
                    "Mean accepted length (speculative decoding)",
                    [
                        (
                            _ratio(
                                f"longtail_rollout_accepted_length_sum{{{JOB}}}",
                                f"longtail_rollout_accepted_length_count{{{JOB}}}",
                                "rljob",
                            ),
                            "{{rljob}}",
                        )
                    ],
                ),
            ],
        ),
    ]


def rollout_rows() -> list[Row]:
    """Rollout & speculative decoding: throughput, batch, SD, acceptance, GPUs per role."""
    by_pod = f"{{{JOB}}}"
    return [
        Row(
            "Throughput and batch",
            [
                Panel(
                    "Generated tokens/s per worker",
                    [
                        (
                            _sum_rate("longtail_rollout_generated_tokens_total", JOB, "pod"),
                            "{{pod}}",
                        )
                    ],
                    stack=True,
                ),
                Panel(
                    "Running batch size (sequences) per worker",
                    [
                        (
                            f"sum by (pod) (longtail_rollout_running_sequences{by_pod})",
                            "running {{pod}}",
                        ),
                        (
                            f"sum by (pod) (longtail_rollout_waiting_sequences{by_pod})",
                            "waiting {{pod}}",
                        ),
                    ],
                ),
                Panel(
                    "Engine step latency (p50 / p95) by mode",
                    _p50_p95("longtail_rollout_step_seconds_bucket", JOB, "mode", "{{mode}}"),
                    unit="s",
                ),
                Panel(
                    "Worker activity",
                    [
                        (
                            f"max by (pod, role) (longtail_worker_role{by_pod} == 1)",
                            "{{pod}}: {{role}}",
                        )
                    ],
                    description="1 for what each worker does now: rollout or drafter-train.",
                ),
            ],
        ),
        Row(
            "Speculative decoding",
            [
                Panel(
                    "SD-on fraction of decode steps",
                    [
                        (
                            _sum_rate(
                                "longtail_rollout_decode_steps_total", JOB + ', mode="sd"', "rljob"
                            )
                            + " / "
                            + _sum_rate(
                                "longtail_rollout_decode_steps_total",
                                JOB + ', mode!="prefill"',
                                "rljob",
                            ),
                            "{{rljob}}",
                        ),
                        (
                            f"avg by (rljob) (longtail_rollout_sd_active{by_pod})",
                            "workers with SD on {{rljob}}",
                        ),
                    ],
                    unit="percentunit",
                ),
                Panel(
                    "Accepted length by drafter version",
                    [
                        (
                            f"max by (drafter_version) (longtail_drafter_accepted_length{by_pod})",
                            "drafter v{{drafter_version}}",
                        )
                    ],
                    description="Accepted drafts + 1 per speculative step; a new drafter version "
                    "should hold or raise it as the policy changes.",
                ),
                Panel(
                    "Acceptance rate and draft depth",
                    [
                        (
                            f"avg by (pod) (longtail_rollout_acceptance_rate{by_pod})",
                            "acceptance {{pod}}",
                        ),
                        (f"avg by (pod) (longtail_rollout_draft_depth{by_pod})", "depth {{pod}}"),
                    ],
                ),
                Panel(
                    "Accepted vs proposed draft tokens/s",
                    [
                        (
                            _sum_rate("longtail_rollout_accepted_draft_tokens_total", JOB),
                            "accepted",
                        ),
                        (
                            _sum_rate("longtail_rollout_draft_tokens_total", JOB),
                            "proposed",
                        ),
                    ],
                ),
            ],
        ),
        Row(
            "GPUs and drafter training",
            [
                Panel(
                    "GPU utilisation per pod and activity (DCGM)",
                    [
                        (
                            f"avg by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{{{NS}}}) "
                            "* on (namespace, pod) group_left (role) "
                            f"max by (namespace, pod, role) (longtail_worker_role{by_pod} == 1)",
                            "{{pod}} ({{role}})",
                        ),
                        (
                            f"100 * avg by (namespace, pod) (DCGM_FI_PROF_SM_ACTIVE{{{NS}}}) "
                            "* on (namespace, pod) group_left (role) "
                            f"max by (namespace, pod, role) (longtail_worker_role{by_pod} == 1)",
                            "SM active {{pod}} ({{role}})",
                        ),
                    ],
                    unit="percent",
                    width=24,
                    description="dcgm-exporter samples every 30 s by default; its pod/namespace "
                    "labels must be kept (honorLabels) for the join on the worker role metric.",
                ),
                Panel(
                    "Idle seconds per worker",
                    [(f"max by (pod) (longtail_worker_idle_seconds{by_pod})", "{{pod}}")],
                    unit="s",
                ),
                Panel(
                    "Drafter training: steps/s and loss",
                    [
                        (
                            _sum_rate("longtail_spot_train_steps_total", JOB, "pod"),
                            "steps/s {{pod}}",
                        ),
                        (f"max by (pod) (longtail_spot_train_loss{by_pod})", "loss {{pod}}"),
                    ],
                ),
                Panel(
                    "Capture buffer (tokens)",
                    [(f"sum by (pod) (longtail_spot_buffer_tokens{by_pod})", "{{pod}}")],
                ),
                Panel(
                    "Worker role switch (p95)",
                    [
                        (
                            _quantile(
                                0.95, "longtail_worker_role_switch_seconds_bucket", JOB, "role"
                            ),
                            "to {{role}}",
                        )
                    ],
                    unit="s",
                ),
            ],
        ),
    ]


def operator_rows() -> list[Row]:
    """Operator: reconciles, errors, role-switch latency, status polls, jobs."""
    return [
        Row(
            "Reconciles",
            [
                Panel(
                    "Reconciles/s by result",
                    [
                        (
                            _sum_rate("longtail_operator_reconcile_total", by="result"),
                            "{{result}}",
                        )
                    ],
                    stack=True,
                ),
                Panel(
                    "Reconcile errors/s by reason",
                    [
                        (
                            _sum_rate("longtail_operator_reconcile_errors_total", by="reason"),
                            "{{reason}}",
                        )
                    ],
                ),
                Panel(
                    "Reconcile duration (p50 / p95)",
                    _p50_p95(
                        "longtail_operator_reconcile_duration_seconds_bucket",
                        "",
                        "result",
                        "{{result}}",
                    ),
                    unit="s",
                ),
                Panel(
                    "RLJobs by phase",
                    [("sum by (phase) (longtail_operator_jobs)", "{{phase}}")],
                ),
            ],
        ),
        Row(
            "Harvest",
            [
                Panel(
                    "Role switches/s by result",
                    [
                        (
                            _sum_rate("longtail_operator_role_switches_total", by="role, result"),
                            "{{role}} {{result}}",
                        )
                    ],
                ),
                Panel(
                    "Role-switch latency, decision to acknowledgement (target p95 < 2 s)",
                    _p50_p95(
                        "longtail_operator_role_switch_seconds_bucket", "", "role", "{{role}}"
                    ),
                    unit="s",
                ),
                Panel(
                    "Status polls/s by target and result",
                    [
                        (
                            _sum_rate("longtail_operator_status_polls_total", by="target, result"),
                            "{{target}} {{result}}",
                        )
                    ],
                ),
                Panel(
                    "GPUs by job and state",
                    [
                        (
                            f"sum by (rljob, state) (longtail_operator_job_gpus{{{NS}}})",
                            "{{rljob}} {{state}}",
                        )
                    ],
                ),
            ],
        ),
    ]
