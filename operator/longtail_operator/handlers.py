"""kopf wiring of the operator: start-up, per-RLJob daemons, and events that wake them.

Run it with ``python -m longtail_operator`` (which calls ``kopf.run`` with the namespaces from
``LONGTAIL_OPERATOR_NAMESPACES``) or ``kopf run --standalone -m longtail_operator.handlers``.
Everything here is thin: each RLJob gets two daemons (``runtime.Operator.run_job`` reconciles,
``run_harvest`` reassigns idle GPUs), watch events of the RLJob, of its pods or of its Kueue
Workload only wake the job's reconcile loop, and deleting a job queued by Kueue releases its
Workload. The decisions live in pure modules (``builders``, ``derive``,
``longtail_api.harvestloop``).

Start-up, in order: the metrics/health server (so ``/healthz`` answers on a standby too); with
``LONGTAIL_OPERATOR_LEADER_ELECTION`` the wait for the Lease (``leader.py``: kopf watches and
does nothing before it ends); the job-token key (``access.py``: read by name from the
operator's namespace, made when absent); a check that the operator's namespace carries the
labels the per-job NetworkPolicies admit the operator by. The daemons run only while this
process holds the Lease (:class:`Fenced`). On losing it, ``python -m longtail_operator``
stops kopf and exits 1 (as controller-runtime does), so a fresh process campaigns again (the
kubelet's restart of the container: same pod name, so it re-takes its own Lease at once); in
tests (kopf in-process) the daemons stop and resume once the Lease is held again.

The elector stops on every way out: kopf's cleanup handler; a start-up cancelled by SIGTERM
(kopf then runs no cleanup: the standby stops campaigning at once, and gives back a Lease its
last try took); and ``python -m longtail_operator``'s own exit (:func:`stop_elector`), whatever
kopf ran.

The Kubernetes client authenticates like kopf does: in-cluster service account, else the
kubeconfig named by ``KUBECONFIG`` (its current context). With namespace patterns, kopf's
discovery of the namespaces to watch is completed by ``namespaces.py`` (installed on import):
a namespace created while kopf starts is watched too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import kopf
from kubernetes import client, config

from longtail_api import GROUP, PLURAL, VERSION
from longtail_operator import access, kueue, namespaces
from longtail_operator.builders import LABEL_JOB
from longtail_operator.kube import Kube, KubeError
from longtail_operator.leader import LeaderElector, LeaseConfig
from longtail_operator.metrics import Health, HealthServer, OperatorMetrics
from longtail_operator.runtime import TICK_S, Operator, Stopped
from longtail_operator.settings import Settings, from_env

log = logging.getLogger(__name__)
namespaces.install()  # before kopf starts: a namespace made while it starts is watched too
FINALIZER = "longtail.dev/operator"
WATCH_RETRY_BACKOFFS_S = (1.0,) * 5 + (2.0,) * 10 + (3.0,) * 10 + (5.0,) * 10
"""Seconds between kopf's retries of a failed API request (watches included), ~2 min in all."""
EXIT_GRACE_S = 10.0
"""After losing the Lease, how long kopf may take to stop before the process exits anyway."""

_state: dict[str, Any] = {}
_lost_lease = threading.Event()
_exiting = threading.Event()
"""Set by the cleanup handler: every job loop ends within a tick, also one whose kopf flag was
never raised (a daemon spawned by a watch event during shutdown), so that no thread keeps the
process from exiting after SIGTERM."""


def api_client() -> client.ApiClient:
    """Credentials: in-cluster service account, else ``KUBECONFIG``'s current context. Its
    connection pool keeps up to :data:`API_CONNECTIONS` connections (the client's default,
    five per CPU, is fewer than the job loops calling at once under a burst of jobs)."""
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        load = config.load_kube_config
        load(config_file=os.environ.get("KUBECONFIG"), client_configuration=cfg)  # type: ignore[no-untyped-call]
    cfg.connection_pool_maxsize = API_CONNECTIONS
    return client.ApiClient(cfg)


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
    # kopf's default request retries (1, 1, 2, 3, 5, 8, 13, 21 s) leave its watches down for up
    # to 21 s after a short API-server outage ends; retry every 1-5 s for about two minutes so
    # pod and RLJob events flow again within seconds of the API answering.
    settings.networking.error_backoffs = WATCH_RETRY_BACKOFFS_S
    _exiting.clear()  # kopf in-process (tests) starts again after a cleanup
    if "kube" not in _state:  # once, also when kopf retries this handler
        kube = Kube(api_client())
        # /readyz asks the API server from the start: a standby waiting for the Lease is not
        # ready while it cannot reach the API either.
        _state["kube"], _state["metrics"], _state["health"] = (
            kube,
            OperatorMetrics(),
            Health(api_probe=kube.probe),
        )
        _serve(cfg, _state["metrics"], _state["health"])
    kube, health = _state["kube"], _state["health"]
    _state["loop"] = asyncio.get_running_loop()
    try:
        if cfg.leader_election:
            await _wait_for_lease(kube, cfg)
        key = await asyncio.to_thread(_startup_call, load_token_key, kube, cfg)
        cfg = replace(cfg, token_key=key)
        await asyncio.to_thread(check_namespace_labels, kube, cfg)
    except asyncio.CancelledError:
        # SIGTERM during start-up (a standby, most often): kopf runs no cleanup handler after
        # a cancelled start-up. A stopping process must not take (or keep) the Lease: stop
        # campaigning now, then clean up as the handler would (the heartbeat task left running
        # would also hold kopf's exit up for its 5 s wait on leftover tasks).
        elector: LeaderElector | None = _state.get("elector")
        if elector is not None:
            elector.halt()
        await asyncio.shield(_shut_down())
        raise
    _state["operator"] = Operator(kube, cfg, _state["metrics"], health)


async def _wait_for_lease(kube: Kube, cfg: Settings) -> None:
    """Campaign (once per process, also when kopf retries the start-up) until acting."""
    elector = _state.get("elector") or LeaderElector(kube, lease_config(cfg), _lost).start()
    _state["elector"] = elector
    log.info("waiting for Lease %s/%s", cfg.operator_namespace, cfg.lease_name)
    while not elector.acting():  # a standby: no watch, no action until this ends
        if elector.failed is not None:
            raise kopf.PermanentError(f"leader election failed: {elector.failed!r}")
        await asyncio.sleep(TICK_S)


def stop_elector() -> None:
    """Stop campaigning and give the Lease back if this process (or its pod's previous
    container) holds it. Idempotent, blocking: the cleanup handler, a cancelled start-up, and
    ``python -m longtail_operator`` on its way out, whatever kopf ran."""
    elector: LeaderElector | None = _state.get("elector")
    if elector is not None:
        elector.stop()
        _state.pop("elector", None)


def _serve(cfg: Settings, metrics: OperatorMetrics, health: Health) -> None:
    """The metrics/health server and the heartbeat, before any wait for the Lease."""
    if cfg.metrics_port:
        server = HealthServer(metrics, health, cfg.metrics_host, cfg.metrics_port).start()
        _state["server"] = server
        log.info("metrics, /healthz and /readyz on %s:%d", cfg.metrics_host, server.port)
    _state["heartbeat"] = asyncio.get_running_loop().create_task(_heartbeat(health))
    health.started = True


def lease_config(cfg: Settings) -> LeaseConfig:
    """This process's candidacy. In a pod (``POD_NAME``, which the chart sets from the downward
    API) the pod's name: a container restarted after losing the Lease (or killed) is the same
    candidate and re-takes the Lease at once instead of waiting out its lease duration; the
    kubelet never runs two containers of one pod at once. Outside a pod the host name plus a
    random suffix: two processes on one host are two candidates."""
    pod = os.environ.get("POD_NAME", "").strip()
    return LeaseConfig(
        namespace=cfg.operator_namespace,
        name=cfg.lease_name,
        identity=pod or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
        lease_duration_s=cfg.lease_duration_s,
        renew_deadline_s=cfg.renew_deadline_s,
        retry_period_s=cfg.retry_period_s,
    )


def _startup_call(fn: Callable[[Kube, Settings], bytes], kube: Kube, cfg: Settings) -> bytes:
    """``fn`` with kopf's error kinds: no answer or a 5xx is retried, anything else (RBAC, a
    bad key) stops the operator with the message."""
    try:
        return fn(kube, cfg)
    except KubeError as exc:
        if exc.status == 0 or exc.status >= 500:
            raise kopf.TemporaryError(str(exc), delay=2.0) from exc
        raise kopf.PermanentError(str(exc)) from exc
    except access.TokenKeyError as exc:
        raise kopf.PermanentError(str(exc)) from exc


def load_token_key(kube: Kube, cfg: Settings) -> bytes:
    """The job-token key from the Secret in the operator's namespace, made when absent (409:
    another replica made it first; both then read the one the API server kept)."""
    ns, name = cfg.operator_namespace, cfg.token_key_secret
    found = kube.get_secret(ns, name)
    if found is None:
        made = secrets.token_bytes(access.KEY_BYTES)
        kube.create(access.key_secret(ns, name, made))
        found = kube.get_secret(ns, name)
        if found is None:
            raise KubeError(f"get Secret {ns}/{name}", 404, "created but not readable yet")
        log.warning(
            "made the job-token key Secret %s/%s (a first start, or it was deleted: jobs whose "
            "<job>-auth Secrets came from an earlier key reject the operator's calls, see "
            "docs/operator.md)",
            ns,
            name,
        )
    key = access.token_key(found)
    log.info("job-token key %s/%s loaded (id %s)", ns, name, access.key_id(key))
    return key


def check_namespace_labels(kube: Kube, cfg: Settings) -> None:
    """Log an error when the operator's namespace lacks the labels the per-job NetworkPolicies
    select it by: where policies are enforced, the operator could not reach the workers
    (Kubernetes 1.20 sets no ``kubernetes.io/metadata.name`` label)."""
    if not cfg.network_policy:
        return
    ns = cfg.operator_namespace
    want = access.operator_namespace_selector(cfg)["matchLabels"]
    try:
        found = kube._call(
            f"list namespace {ns}",
            kube.core.list_namespace,
            field_selector=f"metadata.name={ns}",
        )
    except KubeError as exc:
        log.warning("cannot check the labels of namespace %s: %s", ns, exc)
        return
    items = (found or {}).get("items") or [{}]
    labels = (items[0].get("metadata") or {}).get("labels") or {}
    missing = {k: v for k, v in want.items() if labels.get(k) != v}
    if missing:
        wanted = ",".join(f"{k}={v}" for k, v in missing.items())
        log.error(
            "namespace %s lacks the label(s) %s that the per-job NetworkPolicies admit the "
            "operator by (Kubernetes < 1.21 does not set kubernetes.io/metadata.name): where "
            "NetworkPolicies are enforced the operator cannot reach the workers. Fix: "
            "`kubectl label namespace %s %s`, or set "
            "LONGTAIL_OPERATOR_NETWORK_POLICY_OPERATOR_NAMESPACE_LABELS "
            "(chart: networkPolicy.operatorNamespaceLabels) to labels it has",
            ns,
            wanted,
            ns,
            " ".join(f"{k}={v}" for k, v in missing.items()),
        )


def _lost() -> None:
    """The Lease was not renewed in time: the daemons have stopped (:class:`Fenced`); under
    ``python -m longtail_operator`` also stop kopf and exit 1, within :data:`EXIT_GRACE_S`.
    Called from the elector's thread."""
    stop: asyncio.Event | None = _state.get("stop_flag")
    loop: asyncio.AbstractEventLoop | None = _state.get("loop")
    if stop is None or loop is None:
        log.error("lost the Lease: job loops stopped until this process holds it again")
        return
    log.error("lost the Lease: stopping; the process exits 1 and campaigns afresh on restart")
    _lost_lease.set()
    loop.call_soon_threadsafe(stop.set)
    timer = threading.Timer(EXIT_GRACE_S, os._exit, args=(1,))
    timer.daemon = True
    timer.start()


def exit_on_lost(stop: asyncio.Event) -> None:
    """``python -m longtail_operator``: on losing the Lease, set ``stop`` (kopf's stop flag;
    an asyncio one: kopf waits for a threading one in an executor thread that never ends
    when the flag is not set, so the process would hang at exit after SIGTERM).
    :func:`lost_lease` then says so. The clean-up sets it too: kopf's task waiting on the flag
    outlives a stop by signal, and kopf waits 5 s for such leftovers before it returns."""
    _state["stop_flag"] = stop


def lost_lease() -> bool:
    """Whether this process stopped because it lost the Lease (the entry point exits 1)."""
    return _lost_lease.is_set()


JOB_LOOP_THREADS = 1024
"""Threads of the job loops (two per RLJob, started on demand). Not kopf's pool: it has
min(32, CPUs + 4) threads, which a few RLJobs' never-ending loops fill, starving the other
jobs' loops and every sync event handler."""
_job_loops = ThreadPoolExecutor(max_workers=JOB_LOOP_THREADS, thread_name_prefix="job-loop")
API_CONNECTIONS = JOB_LOOP_THREADS + 64
"""Connections to the API server the operator's client keeps (:func:`api_client`): one per
thread that may call it at once (the job loops, the reconciles' I/O pool, the checkpoint calls,
the readiness probe). A full pool drops the connection after the call and logs "Connection
pool is full"; connections are opened only as calls need them, so a quiet operator keeps few."""


class Fenced:
    """When a job loop must stop: kopf's flag, the daemon's own (:func:`in_thread`), the
    process exiting, and, while raised only for that, not acting as leader. A job loop checks
    it every tick, so a deposed leader stops within one."""

    def __init__(self, stopped: Stopped) -> None:
        self.stopped, self.done = stopped, threading.Event()

    def ended(self) -> bool:
        return bool(self.stopped) or self.done.is_set() or _exiting.is_set()

    def __bool__(self) -> bool:
        elector: LeaderElector | None = _state.get("elector")
        return self.ended() or (elector is not None and not elector.acting())


def while_leading(fenced: Fenced, loop: Callable[[Stopped], None]) -> None:
    """Run a job's ``loop`` while leading; after losing the Lease, wait to lead again (kopf
    in-process; the entry point exits instead). Returns when the daemon ends, or when the loop
    ended by itself (the RLJob is gone)."""
    while not fenced.ended():
        if fenced:
            fenced.done.wait(TICK_S)
            continue
        loop(fenced)
        if not fenced:
            return


async def in_thread(stopped: kopf.DaemonStopped, loop: Callable[[Stopped], None]) -> None:
    """A daemon: the job loop in a thread until it ends. Async, so that kopf's cancellation
    reaches us (a sync daemon's thread is not told when kopf cancels it on exit, and keeps
    the process alive): cancelled or not, the loop's own flag is raised on the way out."""
    fenced = Fenced(stopped)
    try:
        await asyncio.get_running_loop().run_in_executor(_job_loops, while_leading, fenced, loop)
    finally:
        fenced.done.set()


def stop_job_loops() -> None:
    """After kopf returned: end every job loop still running (the entry point calls it)."""
    _exiting.set()
    _job_loops.shutdown(wait=False)


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    await _shut_down()


async def _shut_down() -> None:
    """What kopf's cleanup handler does, also after a cancelled start-up (no cleanup then)."""
    _exiting.set()
    stop: asyncio.Event | None = _state.get("stop_flag")
    if stop is not None:  # see exit_on_lost: kopf's exit no longer waits 5 s for its waiter
        stop.set()
    task = _state.pop("heartbeat", None)
    if task is not None:
        task.cancel()
    server = _state.pop("server", None)
    if server is not None:
        server.stop()
    op = _state.pop("operator", None)
    if op is not None:
        op.reconciler.pool.shutdown(wait=False)
    # The job loops have stopped: release the Lease, so a standby takes over at once.
    await asyncio.to_thread(stop_elector)
    for key in ("kube", "metrics", "health", "loop"):
        _state.pop(key, None)


@kopf.daemon(GROUP, VERSION, PLURAL, id="reconcile", cancellation_timeout=10.0)
async def reconcile_daemon(
    stopped: kopf.DaemonStopped, namespace: str | None, name: str, **_: Any
) -> None:
    await in_thread(stopped, lambda fenced: operator().run_job(fenced, namespace or "", name))


@kopf.daemon(GROUP, VERSION, PLURAL, id="harvest", cancellation_timeout=10.0)
async def harvest_daemon(
    stopped: kopf.DaemonStopped, namespace: str | None, name: str, **_: Any
) -> None:
    await in_thread(stopped, lambda fenced: operator().run_harvest(fenced, namespace or "", name))


@kopf.on.delete(GROUP, VERSION, PLURAL, labels={kueue.QUEUE_LABEL: kopf.PRESENT})
async def release_admission(body: kopf.Body, **_: Any) -> None:
    """A deleted RLJob labelled for Kueue: Kueue's finalizer comes off its Workload (as Kueue's
    job framework does), so the garbage collector can take it. A handler, not the reconcile
    daemon: the daemon is cancelled by the deletion; kopf holds the RLJob (its finalizer) until
    this succeeds, retrying a failed call."""
    await asyncio.to_thread(operator().reconciler.release_workload, dict(body))


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


def workload_event(namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
    """A Kueue Workload of an RLJob changed (admitted, evicted, deactivated, released): wake
    its job, as a pod's change does, so admission and eviction are acted on at once rather than
    at the next periodic reconcile. The Workload carries its job's label (``job_metadata``)."""
    op = _state.get("operator")
    if op is not None:
        op.wake(namespace or "", labels[LABEL_JOB])


_watching_workloads = threading.Event()
"""Set once :func:`workload_event` is registered (kopf in-process, tests: registered once)."""


@kopf.on.startup()
def watch_workloads(**_: Any) -> None:
    """Watch Kueue's Workloads where this install does Kueue admission (``Settings.kueue``;
    the chart's ``scheduling.kueue`` grants their ``list``/``watch`` only then). Registered at
    start-up, before kopf scans the cluster's resources. Without Kueue installed kopf logs
    once that the resource is unresolved and watches it from the moment its CRD appears
    (kopf watches CRDs: ``clusterRules``)."""
    cfg: Settings = _state.get("settings") or from_env()
    if not cfg.kueue or _watching_workloads.is_set():
        return
    on_workload = kopf.on.event(
        kueue.GROUP, kueue.VERSION, kueue.WORKLOADS, labels={LABEL_JOB: kopf.PRESENT}
    )
    on_workload(workload_event)
    _watching_workloads.set()


def configure(settings: Settings) -> None:
    """Use ``settings`` instead of the environment (tests and benchmarks, before kopf starts)."""
    _state["settings"] = settings


def current() -> Operator | None:
    """The running operator, if started (tests and benchmarks read its metrics)."""
    return _state.get("operator")
