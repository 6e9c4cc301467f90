"""Operator settings, read once from ``LONGTAIL_OPERATOR_*`` environment variables.

The kopf entry point (``handlers.py``) builds one :class:`Settings` at start-up with
:func:`from_env`; everything else receives it as an argument, so tests pass their own values
(short poll periods, loopback ports) without touching the environment. Every variable is listed
in :data:`ENV_DOCS` and in docs/operator.md; a bad value raises :class:`SettingsError` naming the
variable, the value and what is expected.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from longtail_api.rendezvous import DEFAULT_PORT, WEIGHT_SYNC_PORT
from longtail_api.scheduling import BACKENDS, DefaultGang
from longtail_api.workerapi import ROLLOUT_PORT, TRAINER_PORT, VERIFIER_PORT, WEIGHTS_PORT

PREFIX = "LONGTAIL_OPERATOR_"


class SettingsError(ValueError):
    """An environment variable holds a value the operator cannot use."""


@dataclass(frozen=True)
class Settings:
    """Everything configurable about the operator (see :data:`ENV_DOCS`)."""

    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty watches the whole cluster."""
    worker_image: str = "ghcr.io/longtail-dev/longtail-worker:0.1.0"
    image_pull_policy: str = "IfNotPresent"
    metrics_port: int = 8080
    """Port of /metrics, /healthz and /readyz; 0 disables the server."""
    metrics_host: str = "0.0.0.0"
    reconcile_period_s: float = 10.0
    """Longest time between two reconciles of one RLJob (events trigger them sooner)."""
    http_timeout_s: float = 2.0
    """Timeout of one call to a worker's or the trainer's HTTP endpoint."""
    worker_port: int = ROLLOUT_PORT
    trainer_port: int = TRAINER_PORT
    weights_port: int = WEIGHTS_PORT
    verifier_port: int = VERIFIER_PORT
    weight_sync_port: int = WEIGHT_SYNC_PORT
    """Trainer pods' weight-sync store (``--weight-sync-port``) for jobs whose resolved
    ``spec.weightSync`` transport is ``broadcast``; rollout pods dial it on trainer pod 0."""
    role_retry_initial_s: float = 0.25
    role_retry_max_s: float = 10.0
    checkpoint_timeout_s: float = 300.0
    """How long suspend waits for the trainer's checkpoint before deleting pods anyway."""
    harvest_workers: int = 16
    """Threads polling worker status endpoints concurrently (per RLJob)."""
    network_policy: bool = True
    """Create a NetworkPolicy per RLJob limiting ingress to its pods (``access.py``)."""
    network_policy_operator_labels: tuple[str, ...] = (
        "app.kubernetes.io/name=longtail",
        "app.kubernetes.io/component=operator",
    )
    """``key=value`` labels of the operator's pods, allowed in by the NetworkPolicy."""
    network_policy_operator_namespace_labels: tuple[str, ...] = ()
    """``key=value`` labels of the operator's namespace; empty: ``kubernetes.io/metadata.name=``
    :attr:`operator_namespace` (set by Kubernetes >= 1.21; on 1.20 label the namespace so)."""
    network_policy_metrics_namespace_labels: tuple[str, ...] = ()
    """``key=value`` labels of namespaces allowed to scrape the workers; empty: none."""
    operator_namespace: str = "default"
    """The operator's own namespace: it holds the Lease and the token key Secret, and the
    NetworkPolicies admit the operator from it. :func:`from_env`: ``POD_NAMESPACE``, else the
    in-cluster service account's namespace, else ``default``."""
    token_key_secret: str = "longtail-operator-token-key"
    """Secret in :attr:`operator_namespace` (key ``key``) every job token is derived from;
    made by the operator when absent (``access.py``). Its RBAC names it: keep the default."""
    leader_election: bool = True
    """Act only while holding the Lease :attr:`lease_name` (``leader.py``), so that several
    replicas run one at a time."""
    lease_name: str = "longtail-operator-leader"
    """Lease in :attr:`operator_namespace`. Its RBAC names it: keep the default."""
    lease_duration_s: float = 15.0
    """How long a standby waits after the last renewal it saw before taking the Lease."""
    renew_deadline_s: float = 10.0
    """How long the leader keeps trying to renew before it stops acting (< lease duration)."""
    retry_period_s: float = 2.0
    """Time between two tries to acquire or renew the Lease (at most
    ``leader.RETRY_AFTER_FAILURE_S`` after a failed one)."""
    kueue: bool = True
    """Admit RLJobs labelled ``kueue.x-k8s.io/queue-name`` through Kueue (the chart's
    ``scheduling.kueue``, which also grants Kueue's RBAC); false: such a job waits with a
    condition saying this install does not do Kueue admission."""
    gang_backends: tuple[str, ...] = BACKENDS
    """Gang backends whose PodGroups this install may manage (the chart's
    ``scheduling.gangBackends``, which grants exactly their RBAC); a job asking for another is
    refused, naming them."""
    default_gang_backend: str = ""
    """Gang of jobs without ``spec.scheduling.gang`` (empty: none); ``backend: none`` in a
    job opts out."""
    default_gang_queue: str = ""
    default_gang_scheduler_name: str = ""
    token_key: bytes = field(default=b"", repr=False, compare=False)
    """The key itself, loaded from :attr:`token_key_secret` at start-up (``handlers.py``);
    never from the environment, never logged."""

    @property
    def default_gang(self) -> DefaultGang:
        return DefaultGang(
            self.default_gang_backend, self.default_gang_queue, self.default_gang_scheduler_name
        )


ENV_DOCS: dict[str, str] = {
    "namespaces": "comma-separated namespaces to watch (empty: all namespaces)",
    "worker_image": "image of worker pods whose role sets no image",
    "image_pull_policy": "imagePullPolicy of worker containers (Always, IfNotPresent, Never)",
    "metrics_port": "port of /metrics, /healthz, /readyz (0 disables)",
    "metrics_host": "address the metrics server binds",
    "reconcile_period_s": "seconds between periodic reconciles of one RLJob",
    "http_timeout_s": "timeout of one HTTP call to a worker or the trainer",
    "worker_port": "control port of rollout (and drafter) workers",
    "trainer_port": "status/control port of the trainer",
    "weights_port": "port of the trainer's policy weight server (rollout workers pull from it)",
    "verifier_port": "port of the verifier",
    "weight_sync_port": (
        "port of the trainer's weight-sync store for broadcast jobs (--weight-sync-port; "
        "rollout workers dial it)"
    ),
    "role_retry_initial_s": "first retry delay of an unacknowledged role change",
    "role_retry_max_s": "longest retry delay of an unacknowledged role change",
    "checkpoint_timeout_s": "how long suspend waits for the trainer's checkpoint",
    "harvest_workers": "threads polling worker status endpoints per RLJob",
    "network_policy": "create a NetworkPolicy per RLJob limiting ingress to its pods (true/false)",
    "network_policy_operator_labels": "comma-separated key=value labels of the operator's pods",
    "network_policy_operator_namespace_labels": (
        "comma-separated key=value labels of the operator's namespace "
        "(empty: kubernetes.io/metadata.name=<operator namespace>)"
    ),
    "network_policy_metrics_namespace_labels": (
        "comma-separated key=value labels of namespaces that may scrape workers (empty: none)"
    ),
    "operator_namespace": (
        "the operator's namespace (Lease, token key; default: POD_NAMESPACE, else the "
        "service account's, else default)"
    ),
    "token_key_secret": "Secret in the operator's namespace holding the job-token key",
    "leader_election": "act only while holding the Lease (true/false)",
    "lease_name": "Lease in the operator's namespace used for leader election",
    "lease_duration_s": "seconds a standby waits after the leader's last renewal",
    "renew_deadline_s": "seconds the leader retries renewing before it stops acting",
    "retry_period_s": "seconds between tries to acquire or renew the Lease",
    "kueue": "admit RLJobs labelled kueue.x-k8s.io/queue-name through Kueue (true/false)",
    "gang_backends": (
        "comma-separated gang backends the operator may use (volcano, coscheduling, kai, "
        "kubernetes)"
    ),
    "default_gang_backend": "gang backend of RLJobs without spec.scheduling.gang (empty: none)",
    "default_gang_queue": "queue of the default gang (Volcano, KAI)",
    "default_gang_scheduler_name": "schedulerName of the default gang (empty: the backend's)",
}
"""Help text per setting; the variable is ``LONGTAIL_OPERATOR_`` + the upper-cased name."""

_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
"""Where a pod with a service account token reads its own namespace."""


def env_name(field_name: str) -> str:
    return PREFIX + field_name.upper()


def _convert(name: str, raw: str, default: object) -> object:
    var = env_name(name)
    if isinstance(default, bool):
        if raw.strip().lower() not in ("true", "false"):
            raise SettingsError(f"{var}: must be true or false, got {raw!r}")
        return raw.strip().lower() == "true"
    if isinstance(default, tuple):
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if not isinstance(default, int | float):
        if not raw.strip():
            raise SettingsError(f"{var}: must not be empty (unset it to use {default!r})")
        return raw.strip()
    try:
        value: int | float = int(raw) if isinstance(default, int) else float(raw)
    except ValueError:
        kind = "an integer" if isinstance(default, int) else "a number"
        raise SettingsError(f"{var}: must be {kind}, got {raw!r}") from None
    if value < 0 or (isinstance(default, int) and name.endswith("_port") and value > 65535):
        raise SettingsError(f"{var}: must be a non-negative value (a port <= 65535), got {raw!r}")
    return value


def from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from ``LONGTAIL_OPERATOR_*`` variables; unset ones keep their defaults."""
    env = os.environ if environ is None else environ
    defaults = Settings()
    values: dict[str, object] = {}
    for f in fields(Settings):
        if f.name not in ENV_DOCS:  # the token key: loaded at start-up, never from the env
            continue
        raw = env.get(env_name(f.name))
        if raw is not None:
            values[f.name] = _convert(f.name, raw, getattr(defaults, f.name))
    if "operator_namespace" not in values:
        values["operator_namespace"] = own_namespace(env)
    settings = Settings(**values)  # type: ignore[arg-type]
    if settings.image_pull_policy not in _PULL_POLICIES:
        raise SettingsError(
            f"{env_name('image_pull_policy')}: must be one of {', '.join(_PULL_POLICIES)}, "
            f"got {settings.image_pull_policy!r}"
        )
    for name in ("reconcile_period_s", "http_timeout_s", "role_retry_initial_s"):
        if getattr(settings, name) <= 0:
            raise SettingsError(f"{env_name(name)}: must be > 0, got {getattr(settings, name)}")
    if settings.harvest_workers < 1:
        raise SettingsError(f"{env_name('harvest_workers')}: must be >= 1")
    _check_weight_sync_port(settings)
    _check_labels(settings)
    _check_lease(settings)
    _check_gang(settings)
    return settings


def _check_gang(settings: Settings) -> None:
    unknown = [b for b in settings.gang_backends if b not in BACKENDS]
    if unknown:
        raise SettingsError(
            f"{env_name('gang_backends')}: {', '.join(unknown)} not a gang backend; use any of "
            f"{', '.join(BACKENDS)}"
        )
    default = settings.default_gang
    for problem in default.problems():
        raise SettingsError(f"{env_name('default_gang_backend')} and the rest: {problem}")
    if default.backend and default.backend not in settings.gang_backends:
        raise SettingsError(
            f"{env_name('default_gang_backend')}: {default.backend!r} is not among "
            f"{env_name('gang_backends')} ({', '.join(settings.gang_backends) or 'none'}); add "
            "it there (the chart's scheduling.gangBackends) or pick one of them"
        )


def own_namespace(env: Mapping[str, str]) -> str:
    """The operator's namespace when not set: ``POD_NAMESPACE`` (the chart sets it), else the
    service account's (in a pod), else ``default`` (as kubectl)."""
    if env.get("POD_NAMESPACE", "").strip():
        return env["POD_NAMESPACE"].strip()
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def _check_lease(settings: Settings) -> None:
    """client-go's rules: the leader must give up before a standby may take over."""
    d, r, p = settings.lease_duration_s, settings.renew_deadline_s, settings.retry_period_s
    if not 0 < p < r < d:
        raise SettingsError(
            f"{env_name('retry_period_s')}={p}, {env_name('renew_deadline_s')}={r}, "
            f"{env_name('lease_duration_s')}={d}: need 0 < retry period < renew deadline < "
            "lease duration (defaults 2, 10, 15)"
        )


def _check_weight_sync_port(settings: Settings) -> None:
    """Rollout pods dial the port by number, and trainer pod 0 listens on it next to its
    other ports: 0 (a free port, as ``longtail run`` may pick) cannot be dialled, and a port
    the trainer already uses would fail its bind."""
    port, var = settings.weight_sync_port, env_name("weight_sync_port")
    taken = {
        settings.trainer_port: env_name("trainer_port"),
        settings.weights_port: env_name("weights_port"),
        DEFAULT_PORT: "the trainer group's rendezvous port",
    }
    if port == 0:
        raise SettingsError(f"{var}: must be a port rollout pods can dial (1-65535), got 0")
    if port in taken:
        raise SettingsError(
            f"{var}: {port} is already {taken[port]} on trainer pods; pick another port "
            f"(default {WEIGHT_SYNC_PORT})"
        )


def _check_labels(settings: Settings) -> None:
    for name in (
        "network_policy_operator_labels",
        "network_policy_operator_namespace_labels",
        "network_policy_metrics_namespace_labels",
    ):
        for item in getattr(settings, name):
            key, sep, _ = item.partition("=")
            if not sep or not key.strip():
                raise SettingsError(
                    f"{env_name(name)}: {item!r} is not key=value; give comma-separated "
                    "labels like app.kubernetes.io/name=longtail"
                )
