"""The weight sync a simulated step pays: the job's transport, charged phase by phase.

Called by ``longtail simulate`` (``sim/main.py``) once per job: the charge does not depend on
the step's answers. :func:`sync_charge` scales the profile's per-phase rates
(:class:`~longtail_api.profile.SyncCosts`: measured by ``longtail profile``, or the roofline's
stated assumptions) to one policy version of the profiled model, for the transport the job
uses (``spec.weightSync``, resolved; ``--weight-sync`` overrides it)::

    gather = bytes x (W-1)/W / gather rate       # a sharded trainer of W ranks; 0 for W = 1
    http:      pack = bytes / http pack rate     # pieces packed and hashed before dispatch
               wire = 0                          # the workers pull during their load
               load = bytes / pull rate + bytes / load rate
                      (with --link-gbps: the pull is at least workers x bytes / link rate:
                       every worker pulls from the trainer's one link)
    broadcast: pack = bytes / bucket pack rate   # cast + copy into device buckets
               wire = bytes / wire rate          # wire rate: the measured broadcast rate,
                                                 # capped by --link-gbps when given
               (pack and wire overlap: bucket k+1 is packed while k is on the wire)
               load = bytes / load rate
    pause = gather + pack + wire + load, with pack + wire replaced by
            max(pack, wire) + min(pack, wire) / buckets for broadcast

Where the profile did not measure a rate, it is derived from a measured one or from the link
rate given as an assumption, and the charge's ``notes`` say which, as they say for every
measured and assumed rate used. A profile without per-phase costs (written before they were
measured) is refused with the fix, unless the caller passes its own seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from longtail_api.profile import EngineProfile, SyncCosts
from longtail_api.spec import RLJobSpec
from longtail_workers.weights.plan import TRANSPORTS, sync_plan


@dataclass(frozen=True)
class SyncCharge:
    """One policy version's sync as the simulator charges it (seconds)."""

    transport: str
    """``http`` or ``broadcast``."""
    version_bytes: int
    """Bytes moved per version."""
    gather_s: float
    pack_s: float
    wire_s: float
    load_s: float
    pause_s: float
    """What the step pays: gather, pack and wire (overlapped for broadcast), load."""
    notes: list[str] = field(default_factory=list)
    """Where every rate came from (measured, derived, assumed)."""

    @property
    def gb_per_s(self) -> float:
        """End-to-end rate: bytes over the pause, GB/s."""
        return self.version_bytes / self.pause_s / 1e9 if self.pause_s > 0 else math.inf

    def line(self) -> str:
        """One line: the phases, the pause and the rate."""
        return (
            f"weight sync ({self.transport}, {self.version_bytes / 1e9:.2f} GB a version): "
            f"gather {self.gather_s:.2f} s, pack {self.pack_s:.2f} s, wire {self.wire_s:.2f} s"
            f"{' (overlapping the pack)' if self.transport == 'broadcast' else ''}, "
            f"load {self.load_s:.2f} s -> pause {self.pause_s:.2f} s ({self.gb_per_s:.2f} GB/s)"
        )


def _rate(c: SyncCosts, name: str, what: str) -> tuple[float, str]:
    """A measured (or profile-assumed) rate and the note saying so."""
    value = getattr(c, name)
    source = c.sources.get(name, "from the profile")
    return value, f"{what} {value / 1e9:.2f} GB/s ({source})"


def sync_charge(
    profile: EngineProfile,
    transport: str,
    *,
    workers: int,
    trainer_world: int,
    bucket_bytes: int,
    link_bytes_per_s: float | None = None,
) -> SyncCharge:
    """The sync of one version of ``profile``'s model by ``transport`` (module text)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"weight-sync transport {transport!r}: use http or broadcast")
    c = profile.weight_sync
    if c is None:
        raise ValueError(
            "this profile has no per-phase weight-sync costs (written before `longtail profile` "
            "measured them): take the profile again, or pass --weight-sync-s SECONDS"
        )
    if workers < 1 or trainer_world < 1 or bucket_bytes < 1:
        raise ValueError(f"workers={workers}, trainer_world={trainer_world}, "
                         f"bucket_bytes={bucket_bytes}: each must be >= 1")  # fmt: skip
    if link_bytes_per_s is not None and not link_bytes_per_s > 0:
        raise ValueError(f"--link-gbps: must be > 0, got {link_bytes_per_s * 8 / 1e9:g}")
    size, notes = c.version_bytes, list[str]()
    link_note = (
        None if link_bytes_per_s is None
        else f"link {link_bytes_per_s * 8 / 1e9:g} Gb/s = {link_bytes_per_s / 1e9:.2f} GB/s "
             "(assumed: --link-gbps)"
    )  # fmt: skip
    gather_s = _gather(c, size, trainer_world, link_bytes_per_s, notes)
    if transport == "http":
        pack, note = _rate(c, "http_pack_bytes_per_s", "pack (pieces + sha256)")
        pull, pull_note = _rate(c, "http_pull_bytes_per_s", "pull")
        pull_s = size / pull
        if link_bytes_per_s is not None and workers * size / link_bytes_per_s > pull_s:
            pull_s = workers * size / link_bytes_per_s
            pull_note += f"; bound by {workers} workers sharing the trainer's {link_note}"
        load, load_note = _rate(c, "load_bytes_per_s", "load")
        pack_s, wire_s, load_s = size / pack, 0.0, pull_s + size / load
        notes += [note, pull_note + " (the HTTP wire: in the load phase)", load_note]
        pause_s = gather_s + pack_s + load_s
    else:
        pack, wire, more = _broadcast_rates(c, link_bytes_per_s, link_note)
        notes += more
        load, load_note = _rate(c, "load_bytes_per_s", "load")
        notes.append(load_note)
        pack_s, wire_s, load_s = size / pack, size / wire, size / load
        buckets = max(1, -(-size // bucket_bytes))
        overlap = max(pack_s, wire_s) + min(pack_s, wire_s) / buckets
        notes.append(f"{buckets} bucket(s) of {bucket_bytes / 2**20:g} MiB: pack and wire overlap")
        pause_s = gather_s + overlap + load_s
    return SyncCharge(transport, size, gather_s, pack_s, wire_s, load_s, pause_s, notes)


def _gather(c: SyncCosts, size: int, world: int, link: float | None, notes: list[str]) -> float:
    """The sharded trainer's gather: each rank receives (W-1)/W of the version."""
    if world == 1:
        notes.append("gather 0 s (trainer world 1: whole tensors at hand)")
        return 0.0
    moved = size * (world - 1) / world
    if c.gather_bytes_per_s is not None:
        rate, note = _rate(c, "gather_bytes_per_s", "gather")
    elif c.broadcast_wire_bytes_per_s is not None:
        rate = c.broadcast_wire_bytes_per_s
        source = c.sources.get("broadcast_wire_bytes_per_s", "from the profile")
        note = (f"gather {rate / 1e9:.2f} GB/s (not measured: derived, the broadcast rate, "
                f"{source}, taken for the trainer ranks' all-gather)")  # fmt: skip
    elif link is not None:
        rate, note = link, f"gather at the link rate {link / 1e9:.2f} GB/s (assumed: --link-gbps)"
    else:
        raise ValueError(
            f"a trainer of world {world} gathers its shards, and this profile measured neither a "
            "gather nor a broadcast rate: pass --link-gbps (the trainer ranks' link) or "
            "--weight-sync-s"
        )
    notes.append(note + f"; world {world} moves {(world - 1) / world:.0%} of the version")
    return moved / rate


def _broadcast_rates(
    c: SyncCosts, link: float | None, link_note: str | None
) -> tuple[float, float, list[str]]:
    """(pack, wire) rates of the broadcast and their notes; derived where not measured."""
    notes = []
    if c.broadcast_pack_bytes_per_s is not None:
        pack, note = _rate(c, "broadcast_pack_bytes_per_s", "bucket pack")
    else:
        pack = c.http_pack_bytes_per_s
        note = (f"bucket pack {pack / 1e9:.2f} GB/s (not measured: derived, the measured HTTP "
                "pack rate, which also hashes: an upper bound on the time)")  # fmt: skip
    notes.append(note)
    if c.broadcast_wire_bytes_per_s is not None:
        wire, note = _rate(c, "broadcast_wire_bytes_per_s", "broadcast wire")
        if c.sources.get("broadcast_wire_bytes_per_s", "").startswith("measured"):
            note += f", timed to {c.broadcast_receivers} receiver(s)"
        if link is not None and link < wire:
            wire, note = link, note + f"; capped by the {link_note}"
    elif link is not None:
        wire, note = link, f"broadcast wire at the {link_note} (not measured)"
    else:
        raise ValueError(
            "this profile has no broadcast rate (not measured): pass --link-gbps (the link "
            "between trainer and rollout workers, e.g. 25 for 25 GbE, 400 for 400 Gb/s "
            "InfiniBand), or --weight-sync-s"
        )
    notes.append(note)
    return pack, wire, notes


def job_sync_charge(
    spec: RLJobSpec,
    profile: EngineProfile,
    transport: str | None = None,
    link_bytes_per_s: float | None = None,
) -> SyncCharge:
    """The weight sync ``spec``'s job pays for a version of ``profile``'s model: its plan's
    transport (``weights.plan.sync_plan``: ``spec.weightSync``, ``auto`` resolved; ``transport``
    overrides it) and bucket size, its rollout workers and trainer world (``longtail simulate``
    and ``bench/sim_validate.py``)."""
    plan = sync_plan(spec, transport)
    return sync_charge(
        profile,
        plan.transport,
        workers=spec.rollout.replicas,
        trainer_world=spec.trainer.replicas * max(1, spec.trainer.resources.gpus),
        bucket_bytes=plan.broadcast.bucket_bytes,
        link_bytes_per_s=link_bytes_per_s,
    )
