"""The broadcast delivery, trainer side: each policy version in buckets on a group of its own.

``trainer/setup.py`` attaches a :class:`Broadcast` to the trainer's
:class:`~longtail_workers.weights.store.WeightStore` when the job's plan
(``plan.sync_plan``) is ``broadcast``; the store hands it each version's one pass over the
tensors (:meth:`Broadcast.send`). Per version (the phases are ``docs/architecture.md``'s
"Weight sync"): membership (the live members of the
:class:`~longtail_workers.weights.membership.Roster` are announced an attempt; whoever does not
acknowledge within the phase timeout, or stops beating, is named and dropped), a gloo/NCCL
group of the acknowledged members (the last version's when they are the same members and it
went well, else a fresh one), then the buckets: bucket ``k+1`` is cast and packed from the
tensor stream while bucket ``k`` is on the wire, each followed by its digest (``buckets.py``),
and finish (every member reports its :class:`~longtail_workers.weights.records.Report`:
``ok``, or ``refused``/``failed`` with the reason, within the timeout). A member lost
mid-broadcast fails the attempt within the timeout; the version is sent again, from the
trainer's host copy (no second gather), to the members still beating, at most
:attr:`~longtail_workers.weights.plan.BroadcastConfig.attempts` times; then the step goes on.

The store's HTTP delivery (``http_sync.WeightServer``) always runs too: the host copy the
buckets are packed into is the store's copy of the version (pieces = buckets), reserved before
the first bucket and hashed in the background once the broadcast is over (nothing on the
critical path waits for sha256s: the receivers check each bucket's digest), so a dropped, new
or restarted worker and the drafter workers catch up over HTTP (``broadcast_source.py``), then
join the next broadcast. Every record on the rendezvous store goes through ``records.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch._C._distributed_c10d import Backend, Work

from longtail_workers.weights.buckets import (
    bucket_count,
    bucket_digest,
    bucket_span,
    fill_buckets,
)
from longtail_workers.weights.buffers import BufferPool
from longtail_workers.weights.membership import (
    ATTEMPTS,
    BEAT_S,
    POLL_S,
    STALE_S,
    KeptGroup,
    Roster,
    attempt_group,
    attempt_key,
    broadcast,
    error_line,
)
from longtail_workers.weights.plan import BroadcastConfig
from longtail_workers.weights.records import Ack, AttemptRecord, Go, Report, decode, encode
from longtail_workers.weights.store import Delivery, Outgoing
from longtail_workers.weights.sync import SyncPhases, TensorMeta, TensorStream

log = logging.getLogger(__name__)


@dataclass
class _Outcome:
    """How one attempt ended, per member."""

    ok: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    """Members that received it and refused it (a digest mismatch): they fetch over HTTP."""
    failed: dict[str, str] = field(default_factory=dict)
    """Members that did not get it (lost, or the group broke): retried while still beating."""
    ended: float = 0.0


class _Attempt:
    """One announced attempt's group and its in-flight bucket (the sender's half)."""

    def __init__(self, n: int, members: list[str], pg: Backend | None, group: int) -> None:
        self.n, self.members, self.pg, self.group = n, members, pg, group
        self.error: str | None = None if pg is not None else "the group was not formed"
        self._pending: tuple[Work, torch.Tensor] | None = None  # (bucket work, digest[2])
        self.wire_s = 0.0

    def send(self, bucket: torch.Tensor) -> None:
        """Put ``bucket`` on the wire after the previous one (and its digest) went out."""
        if self.error is not None or self.pg is None:
            return
        try:
            self.drain()
            digest = bucket_digest(bucket)
            self._pending = (broadcast(self.pg, bucket), digest)
        except RuntimeError as exc:
            self.fail(exc)

    def drain(self) -> None:
        """Wait for the bucket in flight, then send its digest."""
        if self._pending is None or self.pg is None:
            return
        work, digest = self._pending
        self._pending = None
        t0 = time.perf_counter()
        work.wait()
        broadcast(self.pg, digest).wait()
        self.wire_s += time.perf_counter() - t0

    def finish(self) -> None:
        """The last bucket and digest are out (or the attempt failed)."""
        if self.error is None:
            try:
                self.drain()
            except RuntimeError as exc:
                self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        self.error = error_line(exc)
        log.warning("weight sync attempt %d broke on the wire: %s", self.n, self.error)
        self.close()

    def close(self) -> None:
        """Drop the group: the survivors' pending receives fail at once instead of waiting for
        the timeout (gloo closes the connections), and the next attempt builds a new one."""
        self._pending = None
        _drop(self.pg, broken=self.error is not None)
        self.pg = None


def _drop(pg: Backend | None, *, broken: bool) -> None:
    if pg is not None and broken and hasattr(pg, "abort"):
        pg.abort()  # NCCL: tear down the communicator of a broken attempt


class Broadcast(Delivery):
    """Trainer rank 0: broadcast each version of its store to the registered rollout workers
    (the store keeps it for HTTP catch-up)."""

    transport = "broadcast"
    sends = True

    def __init__(self, port: int, config: BroadcastConfig | None = None) -> None:
        self.config = config or BroadcastConfig()
        self.piece_bytes = self.config.bucket_bytes
        """The store hashes its copy in pieces of one bucket each."""
        self.roster = Roster(port, self.config.phase_timeout_s)
        self.rendezvous = self.roster.store
        """The job's rendezvous store (hosted here): attempts, acks, gos and reports."""
        self.port = self.roster.port
        """The rendezvous port actually bound (``port`` 0 picks a free one)."""
        self._buffers: list[torch.Tensor] = []  # the two device buckets (cuda only)
        self._staging = BufferPool(2, pin=True) if self.config.device == "cuda" else None
        """Two pinned host buckets (cuda only): each device bucket's async copy lands there,
        then in the host copy (pageable: anonymous or spooled, see ``store.WeightStore``)."""
        self._kept: KeptGroup | None = None  # the last attempt's group, if it went well

    def close(self) -> None:
        self._forget_group()
        self.roster.close()

    def send(self, out: Outgoing, tensors: TensorStream | None) -> None:
        """One pass over ``out``'s tensors (started once the attempt is announced), packed into
        ``out.host`` and broadcast as it goes, then retried from ``out.host`` to the members
        that did not get it."""
        if tensors is None:
            raise ValueError("the broadcast packs the version itself: it needs the tensors")
        out.phases.attempts = 0
        self._broadcast(out.version, out.header, out.layout, tensors, out.host, out.phases)

    def _broadcast(
        self,
        version: int,
        header: bytes,
        ordered: list[TensorMeta],
        tensors: TensorStream,
        host: torch.Tensor,
        phases: SyncPhases,
    ) -> None:
        """One pass over the stream into ``host`` and out in buckets, then retries of the
        version (from ``host``) to the members that did not get it; fills ``phases``."""
        size = host.numel()
        attempt = self._announce(version, size, self.roster.live(), phases)
        t0 = time.perf_counter()
        gather = _Timed(tensors())
        try:
            self._pass(header, ordered, gather, host, attempt)
        except BaseException as exc:  # a bad stream: the receivers must not wait for buckets
            if attempt is not None:
                attempt.fail(exc)
            raise
        wire_s = attempt.wire_s if attempt else 0.0
        phases.gather_s = gather.seconds
        phases.pack_s = time.perf_counter() - t0 - gather.seconds - wire_s
        t1 = time.perf_counter()
        outcome = self._finish(attempt) if attempt else None
        while outcome is not None:
            phases.receivers += outcome.ok
            phases.dropped += list(outcome.refused)
            retry = self._survivors(outcome, phases)
            if not retry:
                break
            if phases.attempts >= self.config.attempts:
                phases.dropped += retry
                log.error(
                    "weight sync: version %d did not reach %s in %d attempts; they catch up "
                    "over HTTP", version, ", ".join(retry), phases.attempts,
                )  # fmt: skip
                break
            attempt = self._announce(version, size, retry, phases)
            if attempt is None:
                break
            for k in range(bucket_count(size, self.config.bucket_bytes)):
                a, b = bucket_span(k, size, self.config.bucket_bytes)
                attempt.send(self._device_bucket(k, b - a, host[a:b]))
            outcome = self._finish(attempt)
        phases.wire_s = wire_s + time.perf_counter() - t1
        phases.receivers.sort()
        log.info(
            "weight sync: version %d (%.1f MB) broadcast to %s in %d attempt(s)%s: gather %.2fs "
            "pack %.2fs wire %.2fs", version, size / 1e6, ", ".join(phases.receivers) or "nobody",
            phases.attempts, f", dropped {', '.join(phases.dropped)}" if phases.dropped else "",
            phases.gather_s, phases.pack_s, phases.wire_s,
        )  # fmt: skip

    def _pass(
        self,
        header: bytes,
        layout: list[TensorMeta],
        tensors: Iterator[torch.Tensor],
        host: torch.Tensor,
        attempt: _Attempt | None,
    ) -> None:
        """The one pass over the tensor stream: pack each bucket (into the host copy itself
        on CPU, into one of two device buffers on GPU, then copied to the host) and send it."""
        bucket, size = self.config.bucket_bytes, host.numel()
        cuda = self.config.device == "cuda"

        def target(k: int) -> torch.Tensor:
            a, b = bucket_span(k, size, bucket)
            return self._device_bucket(k, b - a, None) if cuda else host[a:b]

        landing: _Landing | None = None  # cuda: the previous bucket, on its way to the host
        for k in fill_buckets(header, layout, tensors, bucket, target):
            a, b = bucket_span(k, size, bucket)
            filled = self._buffers[k % 2][: b - a] if cuda else host[a:b]
            staged = None
            if cuda:  # async into pinned memory, in stream order before the buffer's next fill
                assert self._staging is not None
                staged = _Landing(host[a:b], self._staging.take(bucket)[: b - a], filled)
            if attempt is not None:
                attempt.send(filled)  # waits for bucket k-1: buffer (k+1) % 2 is free
            if landing is not None:
                landing.land()  # bucket k-1 into the host copy while bucket k is on the wire
            landing = staged
        if landing is not None:
            landing.land()  # the host copy is whole from here

    def _device_bucket(self, k: int, n: int, src: torch.Tensor | None) -> torch.Tensor:
        """Bucket ``k`` (``n`` bytes) to send: on CPU the host slice ``src`` itself; on GPU one
        of two reused device buffers (filled from ``src`` when given)."""
        if self.config.device == "cpu":
            assert src is not None
            return src
        if not self._buffers:
            self._buffers = [
                torch.empty(self.config.bucket_bytes, dtype=torch.uint8, device="cuda")
                for _ in range(2)
            ]  # two buckets: the most a sync ever adds on the trainer's GPU
        buf = self._buffers[k % 2][:n]
        if src is not None:
            buf.copy_(src)
        return buf

    def _announce(
        self, version: int, size: int, members: list[str], phases: SyncPhases
    ) -> _Attempt | None:
        """Announce an attempt to ``members``; drop (naming them) those that do not
        acknowledge within the phase timeout; give the rest the kept group when it is exactly
        theirs, else build a fresh one. None: nobody."""
        if not members:
            return None
        timeout = self.config.phase_timeout_s
        store = self.rendezvous
        n = store.add(ATTEMPTS, 1)
        phases.attempts += 1
        record = AttemptRecord(version, size, self.config.bucket_bytes, members, self.config.device)
        store.set(attempt_key(n, "record"), encode(record))
        missing, holds, deadline = set(members), {}, time.monotonic() + timeout
        while missing and time.monotonic() < deadline:
            for name in sorted(missing):
                key = attempt_key(n, f"ack/{name}")
                if store.check([key]):
                    missing.discard(name)
                    holds[name] = decode(Ack, store.get(key), key).group
                elif self.roster.stale(name):
                    missing.discard(name)
                    phases.dropped.append(name)
                    log.warning(
                        "weight sync attempt %d (version %d): %s stopped beating before it "
                        "acknowledged; dropped, it catches up over HTTP", n, version, name,
                    )  # fmt: skip
            if missing:
                time.sleep(POLL_S)
        for name in sorted(missing):
            phases.dropped.append(name)
            log.warning(
                "weight sync attempt %d (version %d): %s did not acknowledge within %gs (the "
                "phase timeout); dropped, it catches up over HTTP", n, version, name, timeout,
            )  # fmt: skip
        joined = [m for m in members if m not in phases.dropped]
        kept, self._kept = self._kept, None  # the attempt owns it now; kept again if it goes well
        if kept and kept.members == tuple(joined) and all(holds[m] == kept.group for m in joined):
            store.set(attempt_key(n, "go"), encode(Go(joined, kept.group)))
            return _Attempt(n, joined, kept.pg, kept.group)
        if kept is not None:  # the members changed (or one lost it): a fresh group
            _drop(kept.pg, broken=False)
        store.set(attempt_key(n, "go"), encode(Go(joined, n)))
        if not joined:
            return None
        try:
            pg = attempt_group(store, n, 0, len(joined) + 1, self.config.device, timeout)
        except RuntimeError as exc:  # a member lost between its ack and the group (timeout)
            attempt = _Attempt(n, joined, None, n)
            attempt.error = error_line(exc)
            log.warning("weight sync attempt %d: the group did not form: %s", n, attempt.error)
            return attempt
        return _Attempt(n, joined, pg, n)

    def _forget_group(self) -> None:
        if self._kept is not None:
            _drop(self._kept.pg, broken=False)
            self._kept = None

    def _finish(self, attempt: _Attempt) -> _Outcome:
        """Wait (<= the phase timeout) for each member's report of attempt ``attempt``; keep
        its group for the next version if it went well for every member, else drop it."""
        attempt.finish()
        out, waiting = _Outcome(), set(attempt.members)
        deadline = time.monotonic() + self.config.phase_timeout_s
        while waiting:
            for name in sorted(waiting):
                key = attempt_key(attempt.n, f"done/{name}")
                if self.rendezvous.check([key]):
                    report = decode(Report, self.rendezvous.get(key), key)
                    if report.outcome == "ok":
                        out.ok.append(name)
                    elif report.outcome == "refused":
                        out.refused[name] = report.reason
                        log.warning("weight sync attempt %d: %s %s", attempt.n, name, report)
                    else:
                        out.failed[name] = report.reason
                    waiting.discard(name)
                elif self.roster.stale(name) or time.monotonic() > deadline:
                    out.failed[name] = "stopped beating" if self.roster.stale(name) else "timeout"
                    waiting.discard(name)
            if waiting:
                time.sleep(POLL_S)
        out.ended = time.monotonic()
        if out.failed or attempt.error is not None or attempt.pg is None:
            attempt.error = attempt.error or "a member failed"
            attempt.close()  # a group that failed once is not used again
        else:  # every member got it (a refused one kept the group too: it fetches over HTTP)
            self._kept = KeptGroup(attempt.group, tuple(attempt.members), attempt.pg)
        if out.failed:
            log.warning(
                "weight sync attempt %d failed for %s%s", attempt.n,
                ", ".join(f"{n} ({why})" for n, why in sorted(out.failed.items())),
                f" (the wire: {attempt.error})" if attempt.error else "",
            )  # fmt: skip
        return out

    def _survivors(self, outcome: _Outcome, phases: SyncPhases) -> list[str]:
        """The failed members still beating after the attempt ended (they get the version
        again); the others are dropped, named."""
        names = sorted(outcome.failed)
        deadline = outcome.ended + STALE_S + BEAT_S
        while names and time.monotonic() < deadline:
            if all(self.roster.beat_after(n, outcome.ended) for n in names):
                break
            time.sleep(POLL_S)
        alive = [n for n in names if self.roster.beat_after(n, outcome.ended)]
        for name in names:
            if name not in alive:
                phases.dropped.append(name)
                log.warning("weight sync: %s was lost mid-broadcast; dropped", name)
        return alive


class _Landing:
    """One device bucket's way into the trainer's host copy (cuda): an async copy into a pinned
    staging bucket now, then (:meth:`land`, once the next bucket is on the wire) a host copy
    from there into the pageable host copy, so neither copy holds up the GPU's pack and send."""

    def __init__(self, host: torch.Tensor, staging: torch.Tensor, device: torch.Tensor) -> None:
        self.host, self.staging = host, staging
        staging.copy_(device, non_blocking=True)
        self.event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self.event.record()

    def land(self) -> None:
        self.event.synchronize()
        self.host.copy_(self.staging)
        self.staging = self.host  # drop the staging view: its buffer is free for reuse


class _Timed(Iterator[torch.Tensor]):
    """An iterator that adds up the time spent producing each item (the gather)."""

    def __init__(self, inner: Iterator[torch.Tensor]) -> None:
        self.inner, self.seconds = inner, 0.0

    def __next__(self) -> torch.Tensor:
        t0 = time.perf_counter()
        try:
            return next(self.inner)
        finally:
            self.seconds += time.perf_counter() - t0
