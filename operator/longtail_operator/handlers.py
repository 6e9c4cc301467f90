"""kopf wiring of the operator: start-up, per-RLJob daemons, and events that wake them.

Run it with ``python -m longtail_operator`` (which calls ``kopf.run`` with the namespaces from
``LONGTAIL_OPERATOR_NAMESPACES``) or ``kopf run --standalone -m longtail_operator.handlers``.
Everything here is thin: each RLJob gets two daemons (``runtime.Operator.run_job`` reconciles,
``run_harvest`` reassigns idle GPUs), and watch events of the RLJob or of its pods only wake
the job's reconcile loop. The decisions live in pure modules (``builders``, ``derive``,
``longtail_api.harvestloop``).

The Kubernetes client authenticates like kopf does: in-cluster service account, else the
kubeconfig named by ``KUBECONFIG`` (its current context).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any, cast

import kopf
from kubernetes import client, config

from longtail_api import GROUP, PLURAL, VERSION
from longtail_operator.builders import LABEL_JOB
from longtail_operator.kube import Kube
from longtail_operator.metrics import Health, HealthServer, OperatorMetrics
from longtail_operator.runtime import Operator
from longtail_operator.settings import Settings, from_env

log = logging.getLogger(__name__)
FINALIZER = "longtail.dev/operator"

_state: dict[str, Any] = {}


def api_client() -> client.ApiClient:
    """Credentials: in-cluster service account, else ``KUBECONFIG``'s current context."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        return client.ApiClient()
    except config.ConfigException:
        path = os.environ.get("KUBECONFIG")
        made = config.new_client_from_config(config_file=path)  # type: ignore[no-untyped-call]
        return cast(client.ApiClient, made)


def operator() -> Operator:
    op = _state.get("operator")
    if op is None:
        raise kopf.TemporaryError("the operator is still starting", delay=1.0)
    return op  # type: ignore[no-any-return]


async def _heartbeat(health: Health) -> None:
    while True:
        health.beat()
        await asyncio.sleep(2.0)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own credentials, read when kopf starts: in-cluster service account, else the
    kubeconfig named by ``KUBECONFIG`` *now* (the client library reads it at import time)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    cfg: Settings = _state.get("settings") or from_env()
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = logging.WARNING  # our own Events carry the stable reasons
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    metrics, health = OperatorMetrics(), Health()
    op = Operator(Kube(api_client()), cfg, metrics, health)
    _state["operator"] = op
    if cfg.metrics_port:
        server = HealthServer(metrics, health, cfg.metrics_host, cfg.metrics_port).start()
        _state["server"] = server
        log.info("metrics, /healthz and /readyz on %s:%d", cfg.metrics_host, server.port)
    _state["heartbeat"] = asyncio.get_running_loop().create_task(_heartbeat(health))
    health.started = True


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    task = _state.pop("heartbeat", None)
    if task is not None:
        task.cancel()
    server = _state.pop("server", None)
    if server is not None:
        server.stop()
    op = _state.pop("operator", None)
    if op is not None:
        op.reconciler.pool.shutdown(wait=False)


@kopf.daemon(GROUP, VERSION, PLURAL, id="reconcile", cancellation_timeout=10.0)
def reconcile_daemon(
    stopped: kopf.DaemonStopped, namespace: str | None, name: str, **_: Any
) -> None:
    operator().run_job(stopped, namespace or "", name)


@kopf.daemon(GROUP, VERSION, PLURAL, id="harvest", cancellation_timeout=10.0)
def harvest_daemon(stopped: kopf.DaemonStopped, namespace: str | None, name: str, **_: Any) -> None:
    operator().run_harvest(stopped, namespace or "", name)


@kopf.on.event(GROUP, VERSION, PLURAL)
def job_event(namespace: str | None, name: str, **_: Any) -> None:
    op = _state.get("operator")
    if op is not None:
        op.wake(namespace or "", name)


@kopf.on.event("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT})
def pod_event(namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
    op = _state.get("operator")
    if op is not None:
        op.wake(namespace or "", labels[LABEL_JOB])


def configure(settings: Settings) -> None:
    """Use ``settings`` instead of the environment (tests and benchmarks, before kopf starts)."""
    _state["settings"] = settings


def current() -> Operator | None:
    """The running operator, if started (tests and benchmarks read its metrics)."""
    return _state.get("operator")
