"""The trainer's book of weight syncs: what each policy version's sync cost, phase by phase.

The step driver (``trainer/driver.py``) tells it about every publish (:meth:`SyncBook.published`:
the publisher's :class:`~longtail_workers.weights.sync.SyncPhases` and the publish's wall time)
and hands it every rollout's generate replies (:meth:`SyncBook.replied`: each worker's
``engine.policy_load_seconds``, the rollout pause its call spent obtaining and loading the
version it names, and the version it holds now). A version's sync ends at the first generate
calls that load it, one step after it was published, so the row of a step describes the version
its rollout generated with (:meth:`SyncBook.fill`). The held versions (:attr:`SyncBook.held`) go
into the trainer's status, and from there into the RLJob's ``status.weightSync``; they come from
the generate replies, which every transport answers the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from longtail_api.steprow import StepRow
from longtail_workers.weights.sync import SyncPhases
from longtail_workers.wire.rollout import GenerateReply

KEEP_VERSIONS = 4
"""Versions the book remembers (a row needs the one its rollout used; older ones are done)."""


@dataclass
class VersionSync:
    """One policy version's sync: the trainer's side and the workers' loads."""

    version: int
    publish_s: float
    """Wall time of the trainer's publish (gather + pack + wire, and whatever else it took)."""
    phases: SyncPhases | None
    """The publisher's split (None: a publisher that does not time its phases)."""
    loads: dict[str, float] = field(default_factory=dict)
    """Seconds each worker's generate call spent loading this version."""

    @property
    def load_s(self) -> float | None:
        """The slowest worker's load (None: no worker has loaded it yet)."""
        return max(self.loads.values()) if self.loads else None

    @property
    def pause_s(self) -> float:
        """From the publish's start until the last worker holds the version."""
        return self.publish_s + (self.load_s or 0.0)

    @property
    def gb_per_s(self) -> float | None:
        """End-to-end rate of the version's bytes over :attr:`pause_s`, GB/s."""
        if self.phases is None or not self.phases.bytes or self.pause_s <= 0:
            return None
        return self.phases.bytes / self.pause_s / 1e9


class SyncBook:
    """Per-version sync figures and each rollout worker's held version (module text)."""

    def __init__(self) -> None:
        self._versions: dict[int, VersionSync] = {}
        self.held: dict[str, int] = {}
        """Policy version each rollout worker reported holding in its last generate reply."""
        self._lock = threading.Lock()  # the status endpoint reads ``held`` from its thread

    def published(self, version: int, seconds: float, phases: SyncPhases | None) -> None:
        """The trainer published ``version`` in ``seconds`` (wall time), split as ``phases``."""
        with self._lock:
            self._versions[version] = VersionSync(version, seconds, phases)
            for old in sorted(self._versions)[:-KEEP_VERSIONS]:
                del self._versions[old]

    def replied(self, replies: Sequence[GenerateReply]) -> None:
        """Book each reply's load seconds to the version it names, and its held version."""
        with self._lock:
            for reply in replies:
                self.held[reply.worker] = reply.policy_version
                seconds = reply.engine.policy_load_seconds
                sync = self._versions.get(reply.policy_version)
                if sync is None or seconds <= 0.0:
                    continue  # held already (loaded by an earlier call), or an unknown version
                sync.loads[reply.worker] = max(seconds, sync.loads.get(reply.worker, 0.0))

    def held_versions(self) -> dict[str, int]:
        """A copy of :attr:`held`, sorted by worker name."""
        with self._lock:
            return dict(sorted(self.held.items()))

    def get(self, version: int) -> VersionSync | None:
        """The book of ``version`` (None: not published by this trainer process, or too old)."""
        with self._lock:
            return self._versions.get(version)

    def fill(self, row: StepRow, version: int) -> None:
        """Set ``row``'s ``sync_*`` fields from the sync of ``version`` (if it was booked)."""
        sync = self.get(version)
        if sync is None:
            return
        row.sync_version = version
        row.sync_load_s = sync.load_s
        row.sync_pause_s = sync.pause_s
        row.sync_gb_per_s = sync.gb_per_s
        row.worker_load_s = dict(sorted(sync.loads.items()))
        p = sync.phases
        if p is not None:
            row.sync_transport = p.transport
            row.sync_gather_s, row.sync_pack_s, row.sync_wire_s = p.gather_s, p.pack_s, p.wire_s
            row.sync_bytes = p.bytes
