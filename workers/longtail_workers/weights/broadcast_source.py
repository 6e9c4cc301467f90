"""The broadcast transport, rollout side: receive versions in the background, catch up over HTTP.

``runtime.make_weight_source`` builds a :class:`BroadcastSource` when the job's plan
(``plan.sync_plan``) is ``broadcast``; the rollout worker calls ``load_into`` between rollouts
as with HTTP. A background
thread follows the trainer's attempts (``membership.py``): for each one naming this worker it
acknowledges, builds the attempt's fresh group, receives every bucket straight into one buffer
on the engine's device and compares each bucket's digest with the trainer's
(``buckets.bucket_digest``). Only a version whose every bucket matched, whose size is the
announced one and whose header parses is kept; it then reports it to the trainer
(``records.Report``: ``ok``, else ``refused`` or ``failed`` with the reason). A refused version
never reaches the model: it keeps its previous one.

:meth:`BroadcastSource.fetch` hands out the version received by broadcast when it is the one
asked for, waits (at most the phase timeout) while an attempt carrying it is running, and
otherwise pulls it over HTTP (``HttpWeightClient``): a new or restarted worker catches up that
way, and its registration puts it in the next broadcast.
"""

from __future__ import annotations

import logging
import threading
import time

import torch
from torch import nn
from torch._C._distributed_c10d import Backend, Store

from longtail_workers.weights.buckets import (
    bucket_count,
    bucket_digest,
    bucket_span,
)
from longtail_workers.weights.buffers import BufferPool
from longtail_workers.weights.http_sync import HttpWeightClient
from longtail_workers.weights.membership import (
    ATTEMPTS,
    IDLE_POLL_S,
    POLL_S,
    KeptGroup,
    Registration,
    attempt_group,
    attempt_key,
    broadcast,
    error_line,
    keep_connected,
    parse_addr,
)
from longtail_workers.weights.pieces import tensors_from_buffer
from longtail_workers.weights.records import Ack, AttemptRecord, Go, Report, decode, encode
from longtail_workers.weights.sync import StateDict, WeightSource, WeightVersionError

log = logging.getLogger(__name__)

RECENT_ATTEMPTS = 3
"""Attempts announced before a (re)connection that a receiver still considers joining."""


class BroadcastSource(WeightSource):
    """A rollout worker's weights: broadcast when it is in the attempt, HTTP otherwise."""

    def __init__(
        self,
        addr: str,
        name: str,
        http: HttpWeightClient,
        *,
        device: str = "cpu",
        timeout_s: float = 120.0,
    ) -> None:
        self.host, self.port = parse_addr(addr, "--weight-sync-addr")
        self.name, self.http, self.device, self.timeout_s = name, http, device, timeout_s
        self.last_via = ""
        """How the last fetch got its version: ``broadcast`` or ``http``."""
        self.registration: Registration | None = None
        self._cond = threading.Condition()
        self._latest: tuple[int, StateDict] | None = None
        self._busy: int | None = None  # the version of the attempt this worker is in
        self._kept: KeptGroup | None = None  # the last attempt's group, if it went well
        # On CPU one landing buffer is kept for the next version (no page faults on the
        # critical path); on a GPU it is freed at once: device memory is the KV cache's.
        self._landing = BufferPool(1 if device == "cpu" else 0, device)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ws-receive", daemon=True)
        self._thread.start()

    # --- the engine's side ---------------------------------------------------------------

    def fetch(self, version: int | None = None) -> tuple[int, StateDict]:
        if version is None:
            manifest = self.http.latest()
            if manifest is None:
                raise WeightVersionError(
                    f"{self.http.base_url} has no policy weights published yet",
                    requested=None,
                    received=None,
                )
            version = manifest.version
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while self._busy == version and time.monotonic() < deadline:
                self._cond.wait(min(1.0, max(deadline - time.monotonic(), 0.0)))
            if self._latest is not None and self._latest[0] == version:
                self.last_via = "broadcast"
                return self._latest
        got = self.http.fetch(version)
        self.last_via = "http"
        return got

    def refusals(self) -> int:
        """Buckets refused here plus pieces refused by the HTTP catch-up."""
        return super().refusals() + self.http.refusals()

    def received(self) -> int | None:
        """The version received (and verified) by broadcast and not loaded yet, if any."""
        with self._cond:
            return None if self._latest is None else self._latest[0]

    def load_into(self, model: nn.Module, version: int | None = None) -> int:
        got = super().load_into(model, version)
        self.loaded(got)
        return got

    def loaded(self, version: int) -> None:
        """``version`` is in the engine now (``load_into`` calls this; an engine fed from
        :meth:`fetch` directly calls it itself): free the received copy, report it as held."""
        with self._cond:
            if self._latest is not None and self._latest[0] <= version:
                self._latest = None
        if self.registration is not None:
            self.registration.set_held(version)

    def close(self) -> None:
        self._stop.set()
        if self.registration is not None:
            self.registration.close()
        self._thread.join(timeout=5.0)

    # --- the receiving thread ------------------------------------------------------------

    def _run(self) -> None:
        keep_connected(self.host, self.port, self.timeout_s, self._stop, self._follow)

    def _follow(self, store: Store) -> None:
        """Register (once), then take part in every attempt that names this worker and is
        still waiting for acknowledgements (no ``go`` yet: one with a ``go`` went on without
        it). The last few attempts before connecting are looked at too: the registration's own
        connection may have put this worker in an attempt before this one (re)connected."""
        seen = max(0, store.add(ATTEMPTS, 0) - RECENT_ATTEMPTS)
        if self.registration is None:
            self.registration = Registration(self.host, self.port, self.name, self.timeout_s)
        while True:
            for n in range(seen + 1, store.add(ATTEMPTS, 0) + 1):
                seen = n
                key = attempt_key(n, "record")
                record = decode(AttemptRecord, store.get(key), key)
                if self.name in record.members and not store.check([attempt_key(n, "go")]):
                    self._attempt(store, n, record)
            if self._stop.wait(IDLE_POLL_S):
                return

    def _attempt(self, store: Store, n: int, record: AttemptRecord) -> None:
        """Take part in attempt ``n``: ack (naming the group held), wait for the members,
        receive, report."""
        with self._cond:
            self._busy = record.version
        try:
            held = self._kept.group if self._kept is not None else 0
            store.set(attempt_key(n, f"ack/{self.name}"), encode(Ack(held)))
            go = self._go(store, n)
            if go is None:
                report = Report("failed", f"no go for attempt {n} within {self.timeout_s:g}s")
            elif self.name not in go.members:
                self._kept = None  # the members change: the next group is a fresh one
                return  # dropped before the group formed: HTTP catch-up
            else:
                report = self._receive(store, n, record, go)
            if report.outcome != "ok":
                log.warning("weight sync attempt %d (version %d): %s", n, record.version, report)
            store.set(attempt_key(n, f"done/{self.name}"), encode(report))
        finally:
            with self._cond:
                self._busy = None
                self._cond.notify_all()

    def _go(self, store: Store, n: int) -> Go | None:
        deadline = time.monotonic() + self.timeout_s
        key = attempt_key(n, "go")
        while not store.check([key]):
            if time.monotonic() > deadline or self._stop.is_set():
                return None
            time.sleep(POLL_S)
        return decode(Go, store.get(key), key)

    def _group(self, store: Store, n: int, record: AttemptRecord, go: Go) -> Backend:
        """The attempt's group: the kept one when the trainer says so, else a fresh one."""
        kept, self._kept = self._kept, None  # kept again only if this attempt goes well
        if go.group != n:
            if kept is None or kept.group != go.group or kept.members != tuple(go.members):
                raise RuntimeError(
                    f"the trainer reuses the group of attempt {go.group}, this worker holds "
                    f"{kept.group if kept else 'none'}"
                )
            return kept.pg
        rank, size = go.members.index(self.name) + 1, len(go.members) + 1
        return attempt_group(store, n, rank, size, record.device, self.timeout_s)

    def _receive(self, store: Store, n: int, record: AttemptRecord, go: Go) -> Report:
        """Every bucket of attempt ``n`` into one buffer; ``ok`` once it is kept, else why not."""
        t0 = time.perf_counter()
        try:
            pg = self._group(store, n, record, go)
            buf, bad = self._buckets(pg, record)
        except RuntimeError as exc:
            return Report("failed", error_line(exc))  # the group is dropped: it broke
        self._kept = KeptGroup(go.group, tuple(go.members), pg)
        if bad:
            self.count_refused(len(bad))  # logged at warning by the caller
            return Report(
                "refused",
                f"version {record.version}: bucket(s) {bad[:10]} of "
                f"{bucket_count(record.size, record.bucket_bytes)} failed their digest; the "
                "model keeps its previous version (it fetches this one over HTTP)",
            )
        try:
            state = tensors_from_buffer(buf)
        except (ValueError, KeyError, TypeError, RuntimeError) as exc:
            reason = f"version {record.version}: digests ok but not safetensors: {exc}"
            return Report("refused", reason)
        with self._cond:
            self._latest = (record.version, state)
        log.info(
            "weight sync: version %d received by broadcast (%.1f MB in %.2fs)",
            record.version, record.size / 1e6, time.perf_counter() - t0,
        )  # fmt: skip
        return Report("ok")

    def _buckets(self, pg: Backend, record: AttemptRecord) -> tuple[torch.Tensor, list[int]]:
        """Every bucket into one buffer (``[size]`` uint8 on the device), and the buckets whose
        digest did not match the trainer's."""
        buf = self._landing.take(record.size)  # [size] uint8 on the device
        theirs = torch.empty(2, dtype=torch.int64, device=record.device)  # [2] digest
        bad: list[int] = []
        for k in range(bucket_count(record.size, record.bucket_bytes)):
            a, b = bucket_span(k, record.size, record.bucket_bytes)
            self._receive_bucket(pg, record, k, buf[a:b])
            broadcast(pg, theirs).wait()
            if not torch.equal(bucket_digest(buf[a:b]), theirs):
                bad.append(k)  # keep receiving: the collectives must stay paired
        return buf, bad

    def _receive_bucket(
        self, pg: Backend, record: AttemptRecord, k: int, view: torch.Tensor
    ) -> None:
        """Bucket ``k`` of ``record``'s version from the trainer into ``view`` (the fault tests'
        receiver corrupts it here, as a faulty link would, or dies here)."""
        broadcast(pg, view).wait()
