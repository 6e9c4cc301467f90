"""Leader election on a ``coordination.k8s.io/v1`` Lease, so that one operator replica acts.

``handlers.py`` starts one :class:`LeaderElector` per process when
``LONGTAIL_OPERATOR_LEADER_ELECTION`` is true: kopf's start-up waits until :attr:`leading` is
set, so a standby watches nothing and acts on nothing; the per-job daemons stop within one tick
once it is cleared. The rules are client-go's (``tools/leaderelection``):

- a candidate takes the Lease when it is free (no holder) or when the holder's record has not
  changed for ``lease_duration_s`` *as observed locally* (monotonic clock: the holder's clock
  and renewTime are never compared with ours);
- the leader renews every ``retry_period_s``; if no renewal succeeded for ``renew_deadline_s``
  (< lease duration) it stops acting (``on_lost``), so it has stopped before a standby may take
  over;
- every write is an update carrying the read ``resourceVersion``: of two racing candidates the
  API server keeps one (409 for the other);
- on a clean stop the leader releases the Lease (holder cleared), so a standby takes over at
  once instead of after the lease duration.

For a process that exits and is restarted (the operator exits 1 on losing the Lease, the
kubelet restarts its container), and for one that is stopping:

- the identity is the pod's name (``handlers.lease_config``), the same for every container of the
  pod: a restarted container finds its predecessor's record and re-takes the Lease at once
  (client-go does the same for a holder it recognises as itself). Safe because the kubelet starts
  a pod's container again only after the previous one exited: no two processes of one pod act;
- a failed try is repeated after :data:`RETRY_AFTER_FAILURE_S` rather than a whole retry period
  (a failure is mostly an API server down or starting: no answer, a 5xx, or a 403 while a
  restarted kube-apiserver fills its RBAC caches), so the Lease is taken or renewed within a
  fraction of a second of the API server's return. Not after a 429: the API server asked us to
  slow down;
- :meth:`LeaderElector.stop` ends the campaign for good before it releases: a process that is
  stopping never takes the Lease, and one that took it in its last try gives it back.

Not ``kubernetes.leaderelection`` (the Python client's): its ``run()`` loops forever with no
way to stop a candidate, it never releases the lock, it calls ``sys.exit`` on a missing config,
and it logs at INFO on every retry.
"""

from __future__ import annotations

import copy
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from longtail_operator.kube import Kube, KubeError

log = logging.getLogger(__name__)
JITTER = 0.2
"""A candidate's wait is ``retry_period_s`` x (1 + up to this), so candidates spread out."""
RETRY_AFTER_FAILURE_S = 0.5
"""The wait after a failed try (429 aside), when shorter than the retry period: an outage ends
with the Lease taken or renewed within about this long. The cost is one more request a second
to an API server that is down, starting, or refusing us (each failure logged once a minute)."""
LOG_EVERY_S = 60.0
"""Failing tries log the first failure, then one line a minute (as the job loops do)."""


@dataclass(frozen=True)
class LeaseConfig:
    """Where the Lease is, who we are, and the timings (``settings.py``)."""

    namespace: str
    name: str
    identity: str
    """The pod's name, shared by its restarted containers (they re-take their own Lease at once);
    outside a pod the host name plus a random suffix (a restarted process is a new candidate)."""
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


def _lease_client(api: client.ApiClient) -> client.ApiClient:
    """The elector's own client: the same credentials (a shallow copy of the configuration
    shares them, refreshed tokens included) without urllib3's retries, which would log three
    warnings per try while the API server is down; the elector's loop does the retrying. Its
    own connection pool too, so a renewal never queues behind the job loops' calls."""
    cfg = copy.copy(api.configuration)
    cfg.retries = 0
    return client.ApiClient(configuration=cfg)


def micro_time(when: datetime) -> str:
    """A Lease timestamp (``MicroTime``: RFC 3339, six fractional digits, UTC)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for the Lease in a daemon thread; :attr:`leading` is set while we hold it."""

    def __init__(self, kube: Kube, config: LeaseConfig, on_lost: Callable[[], None]) -> None:
        self.kube, self.config, self.on_lost = kube, config, on_lost
        self.coordination = client.CoordinationV1Api(_lease_client(kube.api_client))
        self.leading = threading.Event()
        self._stop = threading.Event()
        self._observed: dict[str, Any] | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0
        self._stopping = threading.Lock()
        self._stopped = False
        self.failed: BaseException | None = None
        """What ended the campaign other than an API error (a bug): the process must stop."""
        self._thread = threading.Thread(target=self._guarded, name="leader-election", daemon=True)
        self.what = f"Lease {config.namespace}/{config.name}"

    def acting(self) -> bool:
        """Whether to act now: we hold the Lease and renewed it within the renew deadline
        (checked here too, so a process that was frozen stops before its elector thread runs)."""
        fresh = time.monotonic() - self._renewed_at <= self.config.renew_deadline_s
        return self.leading.is_set() and fresh

    def start(self) -> LeaderElector:
        self._thread.start()
        return self

    def halt(self) -> None:
        """Never try again from now on (any thread, no wait): a process that is stopping must
        not take the Lease. :meth:`stop` then waits for the last try and releases."""
        self._stop.set()

    def stop(self, release: bool = True) -> None:
        """Stop campaigning; with ``release``, give the Lease back if the record says we hold it
        (also after losing it: we no longer act, and a standby takes over at once). Idempotent
        and safe from any thread: a second call returns once the first is done."""
        self.halt()
        with self._stopping:
            if self._stopped:
                return
            self._stopped = True
            if self._thread.ident is not None:  # started
                # At most one try is under way: two calls, each with its timeout.
                self._thread.join(timeout=self._call_timeout() * 2 + 1.0)
            running = self._thread.is_alive()
            if running:  # a call past its timeout: its write may still land, so release anyway
                log.warning("%s: the last try has not ended; releasing anyway", self.what)
            self.leading.clear()
            if release and (running or self._holds_record()):
                try:
                    self._release()
                except KubeError as exc:  # the Lease then expires after its duration
                    log.warning("could not release %s: %s", self.what, exc)

    def _holds_record(self) -> bool:
        """Whether the last record we read or wrote names us (our own, or our pod's previous
        container's: same identity)."""
        return (self._observed or {}).get("holderIdentity") == self.config.identity

    def _call_timeout(self) -> float:
        return max(1.0, self.config.retry_period_s)

    def _guarded(self) -> None:
        """:meth:`_run`, and a dead campaign never goes unnoticed: a bug in it clears
        :attr:`leading`, records :attr:`failed` (kopf's start-up raises it) and calls
        ``on_lost``, so neither a leader nor a standby carries on without an elector."""
        try:
            self._run()
        except BaseException as exc:
            log.exception("%s: leader election failed", self.what)
            self.failed = exc
            self.leading.clear()
            self.on_lost()
            raise

    def _run(self) -> None:
        failures, warned = 0, -LOG_EVERY_S
        while not self._stop.is_set():
            soon = False
            try:
                renewed = self.try_acquire_or_renew()
            except KubeError as exc:
                soon = exc.status != 429  # 429: the API server asks us to slow down
                renewed, failures = False, failures + 1
                now = time.monotonic()
                if failures == 1 or now - warned >= LOG_EVERY_S:
                    log.warning("%s: try %d failed: %s", self.what, failures, exc)
                    warned = now
            else:
                if failures:
                    log.info("%s: a try succeeded after %d failed one(s)", self.what, failures)
                failures = 0
            if self._stop.is_set():  # stopping: never start acting (stop() releases what we took)
                break
            now = time.monotonic()
            if renewed:
                self._renewed_at = now
                if not self.leading.is_set():
                    log.info("%s acquired by %s: acting", self.what, self.config.identity)
                    self.leading.set()
            elif self.leading.is_set() and now - self._renewed_at > self.config.renew_deadline_s:
                self.leading.clear()
                log.error(
                    "%s not renewed for %.0f s (renew deadline %.0f s): stopped acting",
                    self.what,
                    now - self._renewed_at,
                    self.config.renew_deadline_s,
                )
                self.on_lost()
            wait = self.config.retry_period_s
            if soon:  # the API server's return is the moment to be quick
                wait = min(wait, RETRY_AFTER_FAILURE_S)
            if not self.leading.is_set():
                wait *= 1 + random.uniform(0, JITTER)
            self._stop.wait(wait)

    def _spec(self, previous: dict[str, Any] | None) -> dict[str, Any]:
        now = micro_time(datetime.now(UTC))
        ours = previous is not None and previous.get("holderIdentity") == self.config.identity
        transitions = int((previous or {}).get("leaseTransitions") or 0)
        return {
            "holderIdentity": self.config.identity,
            "leaseDurationSeconds": math.ceil(self.config.lease_duration_s),
            "acquireTime": (previous or {}).get("acquireTime") if ours else now,
            "renewTime": now,
            "leaseTransitions": transitions if ours or previous is None else transitions + 1,
        }

    def try_acquire_or_renew(self) -> bool:
        """One try: True when we hold the Lease afterwards (KubeError: the API failed)."""
        cfg, timeout = self.config, self._call_timeout()
        read = self.coordination.read_namespaced_lease
        lease = self.kube._call(
            f"get {self.what}", read, cfg.name, cfg.namespace, ok=(404,), timeout=timeout
        )
        if lease is None:
            body = self._body({"name": cfg.name, "namespace": cfg.namespace}, self._spec(None))
            create = self.coordination.create_namespaced_lease
            made = self.kube._call(
                f"create {self.what}", create, cfg.namespace, body, ok=(409,), timeout=timeout
            )
            if made is not None:
                self._observe(made["spec"])
            return made is not None
        spec = lease.get("spec") or {}
        if spec != self._observed:
            self._observe(spec)
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration_s)
        if holder and holder != cfg.identity:
            if time.monotonic() < self._observed_at + duration:
                return False  # held, and renewed within its duration as far as we saw
            log.info("%s: holder %s stopped renewing; taking over", self.what, holder)
        elif holder and not self.leading.is_set() and not self._renewed_at:
            log.info(
                "%s: held by %s, this pod's previous process: taking it back", self.what, holder
            )
        return self._update(lease, self._spec(spec))

    def _observe(self, spec: dict[str, Any]) -> None:
        self._observed, self._observed_at = spec, time.monotonic()

    def _body(self, meta: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    def _update(self, lease: dict[str, Any], spec: dict[str, Any]) -> bool:
        cfg, meta = self.config, lease["metadata"]
        body = self._body(
            {
                "name": cfg.name,
                "namespace": cfg.namespace,
                "resourceVersion": meta["resourceVersion"],
            },
            spec,
        )
        replace = self.coordination.replace_namespaced_lease
        done = self.kube._call(
            f"update {self.what}",
            replace,
            cfg.name,
            cfg.namespace,
            body,
            ok=(409,),
            timeout=self._call_timeout(),
        )
        if done is None:  # someone else wrote it since we read it
            return False
        self._observe(done["spec"])
        return True

    def _release(self) -> None:
        """Clear the holder if it is still us (client-go's ReleaseOnCancel)."""
        cfg = self.config
        read = self.coordination.read_namespaced_lease
        lease = self.kube._call(
            f"get {self.what}", read, cfg.name, cfg.namespace, ok=(404,), timeout=5.0
        )
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != cfg.identity:
            return
        spec = {
            **lease["spec"],
            "holderIdentity": None,
            "leaseDurationSeconds": 1,
            "renewTime": micro_time(datetime.now(UTC)),
        }
        if self._update(lease, spec):
            log.info("%s released by %s", self.what, cfg.identity)
