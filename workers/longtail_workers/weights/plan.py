"""Which weight-sync transport a job uses, and how: decided once, the same on every side.

:func:`sync_plan` reads the job's ``spec.weightSync`` (``auto`` resolved as the operator
resolves it, ``longtail_api.policies.resolved_transport``) and the ``--weight-sync`` flag (or
the ``weight_sync`` that ``longtail run`` keeps in its ``run.json``), and returns a
:class:`SyncPlan`: the transport and, for ``broadcast``, its :class:`BroadcastConfig`. The
trainer (``trainer/setup.py``: which deliveries its store gets), the rollout workers
(``runtime.make_weight_source``: which weight source they build) and local mode
(``local/run.py``: which flags it passes them) all call it, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from longtail_api.spec import RLJobSpec
from longtail_workers.weights.records import Device

Transport = Literal["http", "broadcast"]
TRANSPORTS: tuple[Transport, ...] = ("http", "broadcast")
AUTO = "auto"
"""The flag value (and ``run.json`` value) that means "the job's ``spec.weightSync``"."""


@dataclass(frozen=True)
class BroadcastConfig:
    """How the trainer broadcasts (from ``spec.weightSync`` and the roles' devices)."""

    bucket_bytes: int = 1 << 30
    """Bytes per bucket (``bucketMB``); the sender holds at most two at a time on its device."""
    phase_timeout_s: float = 120.0
    """Longest any phase may take (``phaseTimeoutSeconds``): acks, group set-up, one bucket,
    the finish."""
    device: Device = "cpu"
    """``cpu`` (gloo, buckets in host memory) or ``cuda`` (NCCL, buckets on the GPU)."""
    attempts: int = 3
    """Broadcast attempts per version before the rest are left to catch up over HTTP."""

    def __post_init__(self) -> None:
        if self.bucket_bytes < 8 or self.bucket_bytes % 8:
            raise ValueError(f"bucket_bytes={self.bucket_bytes}: must be a multiple of 8, >= 8")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r}: use cpu (gloo) or cuda (NCCL)")


@dataclass(frozen=True)
class SyncPlan:
    """How a job's policy versions travel (see the module text)."""

    transport: Transport
    """``http``: workers pull each version from the trainer's weight server. ``broadcast``:
    the trainer broadcasts it, and the weight server is the catch-up path."""
    broadcast: BroadcastConfig = field(default_factory=BroadcastConfig)
    """The broadcast's buckets, timeout and device (read only when ``transport`` is
    ``broadcast``)."""


def sync_plan(spec: RLJobSpec, flag: str | None) -> SyncPlan:
    """The job's plan: ``flag`` (``--weight-sync``: ``http`` or ``broadcast``; ``None`` or
    ``auto``: the job's ``spec.weightSync``, resolved) and, for the broadcast, the spec's
    bucket size and phase timeout, on NCCL when both the trainer and the rollout role have
    GPUs, else on gloo. ``ValueError`` naming the value for any other ``flag``."""
    if flag is None or flag == AUTO:
        transport = spec.weight_sync_transport()
    elif flag in TRANSPORTS:
        transport = flag
    else:
        raise ValueError(f"weight sync {flag!r}: use {AUTO}, {' or '.join(TRANSPORTS)}")
    gpus = spec.trainer.resources.gpus >= 1 and spec.rollout.resources.gpus >= 1
    sync = spec.weight_sync
    config = BroadcastConfig(
        bucket_bytes=sync.bucket_mb << 20,
        phase_timeout_s=float(sync.phase_timeout_seconds),
        device="cuda" if gpus else "cpu",
    )
    return SyncPlan("broadcast" if transport == "broadcast" else "http", config)
