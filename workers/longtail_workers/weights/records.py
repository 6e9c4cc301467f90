"""The weight-sync records that cross processes, spelled once and read with the wire codec.

Both ends of each record import it from here: the trainer's broadcast
(``broadcast.py``) and a rollout worker's receiver (``broadcast_source.py``) exchange
:class:`AttemptRecord`, :class:`Ack`, :class:`Go`, :class:`Held` and :class:`Report` through
the job's rendezvous store (``membership.py`` names the keys); the HTTP weight server and its
client (``http_sync.py``) exchange the version's manifest
(:class:`~longtail_workers.weights.sync.WeightsManifest`). :func:`encode` and :func:`decode`
are the only places that turn them into text and back: JSON written by
``longtail_api.wirecodec.to_wire`` and read by ``from_wire``, which checks every field and
names the bad one (:class:`~longtail_api.protocol.ProtocolError`, a ``ValueError``). Keys are
camelCase like the other worker APIs.

A receiver's :class:`Report` says how an attempt ended for it with one of a closed set of
:data:`Outcome` values and, when it did not go well, a reason in its own field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from longtail_api.fields import Constraints
from longtail_api.protocol import ProtocolError
from longtail_api.wirecodec import Count, from_wire, to_wire

T = TypeVar("T")

Device = Literal["cpu", "cuda"]
"""Where the buckets live on both sides: ``cpu`` (gloo) or ``cuda`` (NCCL)."""
Outcome = Literal["ok", "refused", "failed"]
"""How an attempt ended for a receiver: ``ok`` (every bucket matched its digest and the version
is kept), ``refused`` (it arrived but failed a check: the receiver fetches it over HTTP) or
``failed`` (it did not arrive: the group broke or the trainer's go never came)."""


@dataclass(frozen=True)
class AttemptRecord:
    """What the trainer announces for one broadcast attempt (``ws/attempt/<n>/record``)."""

    version: Count
    """The policy version this attempt carries."""
    size: Count
    """Length of its canonical bytes."""
    bucket_bytes: Annotated[int, Constraints(minimum=8)]
    """Bytes per bucket (the last may be shorter)."""
    members: list[str]
    """Worker names asked to receive, in rank order (rank 0 is the trainer)."""
    device: Device
    """Where the buckets live on both sides."""


@dataclass(frozen=True)
class Ack:
    """A member's acknowledgement of an attempt (``ws/attempt/<n>/ack/<name>``)."""

    group: Count
    """The attempt whose process group this member still holds (0: none)."""


@dataclass(frozen=True)
class Go:
    """The trainer's word to start an attempt (``ws/attempt/<n>/go``)."""

    members: list[str]
    """The members that acknowledged, in rank order (rank 0 is the trainer)."""
    group: Count
    """The attempt whose group they use: this attempt's own number for a fresh group, an
    earlier one's when these are exactly its members and each acknowledged holding it."""


@dataclass(frozen=True)
class Held:
    """The policy version a member holds, sent with its beats (``ws/held/<name>``)."""

    version: Count


@dataclass(frozen=True)
class Report:
    """How an attempt ended for one member (``ws/attempt/<n>/done/<name>``)."""

    outcome: Outcome
    reason: str = ""
    """Why it was refused or failed (empty when ``ok``)."""

    def __str__(self) -> str:
        return self.outcome if not self.reason else f"{self.outcome}: {self.reason}"


def encode(record: Any) -> str:
    """A record (any dataclass of this module, or a manifest) as its JSON text."""
    return json.dumps(to_wire(record))


def decode(cls: type[T], raw: bytes | str, path: str) -> T:
    """The ``cls`` record in ``raw`` (JSON text); :class:`ProtocolError` naming ``path`` and the
    field when it is not one (a peer of another longtail version?)."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(path, f"not JSON ({exc})", raw[:80]) from None
    return from_wire(cls, data, path)
