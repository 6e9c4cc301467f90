"""Who receives a broadcast policy version: the job's rendezvous store, members, attempts, groups.

The trainer's :class:`~longtail_workers.weights.broadcast.Broadcast` hosts a
``torch.distributed.TCPStore`` (:class:`Roster`) on ``--weight-sync-port``; each rollout
worker's :class:`~longtail_workers.weights.broadcast_source.BroadcastSource` connects to it
(:class:`Registration`), registers under its worker name, beats every ~0.5 s and publishes the
version it holds. Every broadcast attempt is announced as an ``AttemptRecord``; its members
acknowledge (``Ack``: which group they hold), the trainer writes the final member list and the
group to use (``Go``): the group of an earlier attempt when the members are exactly its
members and every one of them still holds it, else a FRESH process group built for this attempt
(:func:`attempt_group`) from a ``PrefixStore`` of the same store. Never the default process group
(a sharded trainer's FSDP owns it); a join, restart or loss of a worker changes the members and
so builds a new group, and a group that failed once is dropped on both sides.
(:class:`KeptGroup`: building a group is a rendezvous of every member, and NCCL's costs seconds.)

Store keys (all under ``ws/``): ``nreg`` counter and ``reg/<i>`` names; ``beat/<name>``
counters; ``held/<name>`` (``Held``); ``attempt`` counter; ``attempt/<n>/record``,
``attempt/<n>/ack/<name>``, ``attempt/<n>/go``, ``attempt/<n>/done/<name>`` (the member's
``Report``) and ``attempt/<n>/pg/`` (a fresh group's own rendezvous). The records are
``records.py``'s, written and read only through its ``encode``/``decode``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
from torch._C._distributed_c10d import (
    Backend,
    BroadcastOptions,
    PrefixStore,
    ProcessGroupGloo,
    Store,
    TCPStore,
    Work,
)

from longtail_api import podenv, rendezvous
from longtail_workers.weights.records import Held, decode, encode

log = logging.getLogger(__name__)

DEFAULT_SYNC_PORT = rendezvous.WEIGHT_SYNC_PORT
"""The trainer's rendezvous port when neither ``--weight-sync-port`` nor its environment
variable (``podenv.WEIGHT_SYNC_PORT``) is given."""
ADDR_ENV = podenv.WEIGHT_SYNC_ADDR
PORT_ENV = podenv.WEIGHT_SYNC_PORT
BEAT_S = 0.5
"""A member's heartbeat period."""
STALE_S = 3.0
"""A member whose beat has not moved for this long is gone."""
POLL_S = 0.01
"""Period of the trainer's store polls during a sync (acks, reports): one local round trip
each, and they add straight to every version's sync time."""
IDLE_POLL_S = 0.05
"""Period of a receiver's poll for the next attempt (between syncs: kept cheap for the store)."""
ATTEMPTS = "ws/attempt"


def beat_key(name: str) -> str:
    return f"ws/beat/{name}"


def held_key(name: str) -> str:
    return f"ws/held/{name}"


def attempt_key(n: int, what: str) -> str:
    """``ws/attempt/<n>/<what>`` (``record``, ``go``, ``ack/<name>``, ``done/<name>``)."""
    return f"{ATTEMPTS}/{n}/{what}"


def parse_addr(addr: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` -> ``(host, port)``; a clear error naming ``what`` otherwise."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"{what}: {addr!r} is not HOST:PORT (e.g. trainer-0.job:{DEFAULT_SYNC_PORT}); give "
            f"--weight-sync-addr HOST:PORT or set {ADDR_ENV}"
        )
    return host, int(port)


def error_line(exc: BaseException) -> str:
    """The first line of a gloo/NCCL/store error (they run to many lines), at most 300 chars."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else repr(exc)


def sync_port(flag: int | None) -> int:
    """The trainer's rendezvous port: ``flag``, else ``$PORT_ENV``, else the default."""
    if flag is not None:
        return flag
    raw = os.environ.get(PORT_ENV, "")
    if not raw:
        return DEFAULT_SYNC_PORT
    if not raw.isdigit() or int(raw) > 65535:
        raise ValueError(f"{PORT_ENV}={raw!r}: not a port number (0-65535; 0 picks a free one)")
    return int(raw)


@dataclass(frozen=True)
class KeptGroup:
    """A process group kept after an attempt that went well, for the next one with the same
    members (either side keeps one; a failed attempt drops it)."""

    group: int
    """The attempt that built it."""
    members: tuple[str, ...]
    """Its members in rank order, the trainer (rank 0) not included."""
    pg: Backend


def connect(host: str, port: int, timeout_s: float, *, master: bool = False) -> TCPStore:
    """The job's rendezvous store: hosted here (``master``) or a client of it."""
    return TCPStore(
        host, port, is_master=master, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
    )


def attempt_group(
    store: Store, n: int, rank: int, size: int, device: str, timeout_s: float
) -> Backend:
    """A fresh process group for attempt ``n`` (never the default one): gloo on CPU, NCCL on
    GPUs; every collective on it fails after ``timeout_s`` instead of hanging. Building it is
    itself a rendezvous of all ``size`` ranks (bounded by the same timeout). Besides the store,
    gloo and NCCL open their own connections between the ranks (ephemeral ports)."""
    prefixed = PrefixStore(attempt_key(n, "pg/"), store)
    if device == "cuda":
        from torch._C._distributed_c10d import ProcessGroupNCCL

        opts = ProcessGroupNCCL.Options()
        opts._timeout = timedelta(seconds=timeout_s)
        return ProcessGroupNCCL(prefixed, rank, size, opts)
    return ProcessGroupGloo(prefixed, rank, size, timedelta(seconds=timeout_s))


def broadcast(pg: Backend, tensor: torch.Tensor) -> Work:
    """Start broadcasting ``tensor`` from rank 0 on ``pg`` (every rank calls it in order)."""
    opts = BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    work: Work = pg.broadcast([tensor], opts)  # type: ignore[attr-defined]  # not in the stubs
    return work


class Roster:
    """Trainer side: hosts the store and follows the registered members' heartbeats."""

    def __init__(self, port: int, timeout_s: float) -> None:
        self.store = connect("0.0.0.0", port, timeout_s, master=True)
        self.port = int(self.store.port)
        self._poller = connect("127.0.0.1", self.port, timeout_s)  # its own connection
        self._lock = threading.Lock()
        self._seen_reg = 0
        self._unread: dict[int, float] = {}  # registrations counted, name not read yet
        self._beats: dict[str, tuple[int, float]] = {}  # name -> (beat, when it last moved)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ws-roster", daemon=True)
        self._thread.start()

    def live(self) -> list[str]:
        """Members whose beat moved within the last :data:`STALE_S`, sorted by name."""
        now = time.monotonic()
        with self._lock:
            return sorted(n for n, (_, t) in self._beats.items() if now - t < STALE_S)

    def beat_after(self, name: str, when: float) -> bool:
        """Whether ``name``'s beat moved after ``when`` (``time.monotonic()``)."""
        with self._lock:
            seen = self._beats.get(name)
        return seen is not None and seen[1] > when

    def stale(self, name: str) -> bool:
        """Whether ``name`` stopped beating (gone) or never registered."""
        return name not in self.live()

    def held(self, name: str) -> int | None:
        """The version ``name`` last reported holding (None: none yet)."""
        key = held_key(name)
        if not self._poller.check([key]):
            return None
        return decode(Held, self._poller.get(key), key).version

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.wait(BEAT_S / 2):
            try:
                self._poll()
            except RuntimeError as exc:  # the store is in this process: only at shutdown
                log.warning("weight-sync roster poll failed: %s", exc)

    def _poll(self) -> None:
        now = time.monotonic()
        count = self._poller.add("ws/nreg", 0)
        for i in range(self._seen_reg + 1, count + 1):
            self._unread.setdefault(i, now)
        self._seen_reg = count
        names = []
        for i, since in sorted(self._unread.items()):
            key = f"ws/reg/{i}"
            if self._poller.check([key]):
                names.append(self._poller.get(key).decode())
                del self._unread[i]
            elif now - since > STALE_S:  # counted, then died before writing its name
                del self._unread[i]
        with self._lock:
            known = set(self._beats) | set(names)
        beats = {n: self._poller.add(beat_key(n), 0) for n in known}
        with self._lock:
            for name, beat in beats.items():
                last = self._beats.get(name)
                if last is None or last[0] != beat or name in names:
                    if last is None or name in names:
                        log.info("weight sync: %s registered", name)
                    self._beats[name] = (beat, now)


class Registration:
    """Receiver side: one store connection that registers ``name`` and beats in a thread; it
    reconnects (and registers again) when the trainer's store goes away and comes back."""

    def __init__(self, host: str, port: int, name: str, timeout_s: float) -> None:
        self.host, self.port, self.name, self.timeout_s = host, port, name, timeout_s
        self._held: int | None = None
        self._stop = threading.Event()
        self.registered = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ws-beat", daemon=True)
        self._thread.start()

    def set_held(self, version: int) -> None:
        """Report ``version`` as the one this worker now holds (sent with the next beat)."""
        self._held = version

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        keep_connected(self.host, self.port, self.timeout_s, self._stop, self._session)

    def _session(self, store: TCPStore) -> None:
        """Register on a fresh connection, then beat until stopped (or the store goes away)."""
        try:
            store.set(f"ws/reg/{store.add('ws/nreg', 1)}", self.name)
            self.registered.set()
            log.info("weight sync: registered as %s at %s:%d", self.name, self.host, self.port)
            sent: int | None = None
            while not self._stop.wait(BEAT_S):
                store.add(beat_key(self.name), 1)
                if self._held is not None and self._held != sent:
                    sent = self._held
                    store.set(held_key(self.name), encode(Held(sent)))
        finally:
            self.registered.clear()


def keep_connected(
    host: str,
    port: int,
    timeout_s: float,
    stop: threading.Event,
    session: Callable[[TCPStore], None],
) -> None:
    """Run ``session`` on a fresh connection to the trainer's store until ``stop`` is set; when
    the store is unreachable or goes away (a trainer restart), connect again with backoff
    (0.2 s doubling to 10 s). The one reconnect loop of a rollout worker's broadcast side."""
    delay = 0.2
    while not stop.is_set():
        try:
            store = connect(host, port, timeout_s)
            delay = 0.2
            session(store)
        except RuntimeError as exc:  # connect timeout, or the trainer's store went away
            log.warning(
                "weight sync: store %s:%d unreachable (%s); retrying in %.1fs",
                host, port, error_line(exc), delay,
            )  # fmt: skip
            stop.wait(delay)
            delay = min(delay * 2, 10.0)
