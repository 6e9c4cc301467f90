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

Not ``kubernetes.leaderelection`` (the Python client's): its ``run()`` loops forever with no
way to stop a candidate, it never releases the lock, it calls ``sys.exit`` on a missing config,
and it logs at INFO on every retry.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class LeaseConfig:
    """Where the Lease is, who we are, and the timings (``settings.py``)."""

    namespace: str
    name: str
    identity: str
    """Unique per process (pod name + random suffix): a restarted process is a new candidate."""
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


def micro_time(when: datetime) -> str:
    """A Lease timestamp (``MicroTime``: RFC 3339, six fractional digits, UTC)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for the Lease in a daemon thread; :attr:`leading` is set while we hold it."""

    def __init__(self, kube: Kube, config: LeaseConfig, on_lost: Callable[[], None]) -> None:
        self.kube, self.config, self.on_lost = kube, config, on_lost
        self.coordination = client.CoordinationV1Api(kube.api_client)
        self.leading = threading.Event()
        self._stop = threading.Event()
        self._observed: dict[str, Any] | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0
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

    def stop(self, release: bool = True) -> None:
        """Stop campaigning; release the Lease if we hold it (a standby takes over at once)."""
        self._stop.set()
        self._thread.join(timeout=self.config.retry_period_s + self._call_timeout() * 2)
        was_leading = self.leading.is_set()
        self.leading.clear()
        if release and was_leading:
            try:
                self._release()
            except KubeError as exc:  # the Lease then expires after its duration
                log.warning("could not release %s: %s", self.what, exc)

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
        while not self._stop.is_set():
            try:
                renewed = self.try_acquire_or_renew()
            except KubeError as exc:
                renewed = False
                log.warning("%s: %s", self.what, exc)
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
