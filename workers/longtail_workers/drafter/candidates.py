"""What a drafter candidate is, and the trainer's checks of it at the merge: shared types.

Used by :mod:`~longtail_workers.drafter.registry` (which re-exports them: callers import them
from there), the trainer's HTTP exchange (``exchange.py``: an upload's query string is
:meth:`CandidateInfo.to_query`, its answer :meth:`Candidate.to_dict`: the candidate's id,
never where the trainer keeps it), the window cycle (``spot/cycle.py``) and the trainer's merge
checks (``trainer/candidate_checks.py``, the :class:`MergeGate`, whose refusals are
``refusals.Refusal``). A registry's own candidates are :class:`StoredCandidate` (with their
directory).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlencode

import torch

from longtail_api.protocol import ProtocolError
from longtail_api.wirecodec import Count, Finite, NonNegative, from_wire
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.refusals import Refusal

CANDIDATE_FILE = "candidate.json"
"""A stored candidate's :class:`CandidateInfo` and ``created_unix`` (its directory's)."""


class StaleCandidateError(RuntimeError):
    """A candidate trained from a version that is not the latest published one (HTTP 409)."""

    def __init__(self, message: str, base_version: int | None, latest: int | None) -> None:
        super().__init__(message)
        self.base_version, self.latest = base_version, latest


@dataclass(frozen=True)
class CandidateInfo:
    """What a worker says about the drafter it submits (one window's work): the one argument of
    every ``submit_candidate`` (directory registry, the trainer's HTTP exchange, their callers);
    ``candidate.json`` stores it with ``created_unix``; its keys are the fields' names."""

    worker: str
    """The submitting worker's name (it names a directory: non-empty, no ``/``)."""
    base_version: Count | None
    """The published drafter version the window trained from (None: the initial drafter)."""
    policy_version: Count
    """The newest policy version whose samples the window trained on."""
    tokens: Count
    """Training pairs since the base version: the candidate's weight in the merge, capped by
    the tokens the trainer handed out in the window when it checks (``candidate_checks.py``)."""
    steps: Count
    """The spot trainer's optimizer steps over its life when the window ended."""
    train_loss: Finite | None = None
    """The window's mean training loss (None: unknown)."""
    heldout_top1: NonNegative | None = None
    """Held-out top-1 accuracy of the trained drafter (None: not judged)."""

    def __post_init__(self) -> None:
        if not self.worker or "/" in self.worker:
            raise ValueError(f"worker={self.worker!r}; must be a non-empty name without '/'")

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON (``candidate.json``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object, where: str = "candidate") -> CandidateInfo:
        """Read :meth:`to_dict`'s JSON; :class:`ProtocolError` (a ValueError) names the field."""
        return from_wire(cls, data, where, snake_case=True)

    def to_query(self) -> str:
        """The exchange's upload query string (``exchange.py``): the fields that are set."""
        return urlencode({k: v for k, v in self.to_dict().items() if v is not None})

    @classmethod
    def from_query(cls, query: str) -> CandidateInfo:
        """Read :meth:`to_query`'s string; :class:`ProtocolError` names the field."""
        names = [f.name for f in dataclasses.fields(cls)]
        fields: dict[str, object] = {}
        given = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
        for name, values in given.items():
            if name not in names:
                fix = f"use {', '.join(names)}"
                raise ProtocolError(f"query.{name}", "not a candidate field", fix=fix)
            if len(values) != 1:
                raise ProtocolError(f"query.{name}", f"given {len(values)} times; give it once")
            fields[name] = values[0] if name == "worker" else _number(values[0])
        return cls.from_dict({"base_version": None, **fields}, "query")  # None: not sent


def _number(text: str) -> object:
    """A query value as the JSON number it spells (else the text, which the reader refuses)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


@dataclass(frozen=True, kw_only=True)
class Candidate(CandidateInfo):
    """A worker's drafter trained from ``base_version`` in one window, as the trainer stored
    it: its :class:`CandidateInfo` with its id and when it was stored. The exchange's 201
    answer to an upload (:meth:`to_dict`), which never says where the trainer keeps it."""

    id: str
    """The candidate's name in the registry (``<worker>-<hex>``): what log lines name."""
    created_unix: float

    def to_dict(self) -> dict[str, Any]:
        """The exchange's 201 answer to an upload: the fields of :class:`Candidate` only (a
        :class:`StoredCandidate`'s directory stays on the trainer)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(Candidate)}

    @classmethod
    def from_dict(cls, data: object, where: str = "candidate") -> Candidate:
        """Read :meth:`to_dict`'s JSON; :class:`ProtocolError` (a ValueError) names the field."""
        return from_wire(Candidate, data, where, snake_case=True)


@dataclass(frozen=True, kw_only=True)
class StoredCandidate(Candidate):
    """A candidate in a registry's directory (``candidate.json`` in ``path``)."""

    path: Path

    @classmethod
    def read(cls, path: Path) -> StoredCandidate:
        """The candidate stored in directory ``path``; :class:`ProtocolError` names the field
        of a bad ``candidate.json`` (``OSError`` when there is none)."""
        data = json.loads((path / CANDIDATE_FILE).read_text())
        if isinstance(data, dict):
            data = {**data, "id": path.name, "path": str(path)}
        return from_wire(cls, data, f"{path / CANDIDATE_FILE}", snake_case=True)


@dataclass(frozen=True)
class Admitted:
    """A candidate let into the merge, with the weight and the score the merge uses."""

    candidate: StoredCandidate
    weights: dict[str, torch.Tensor]
    """Its trainable weights (checked by ``vetting.py``)."""
    tokens: int
    """Its weight in the merge: the trainer's verified tokens (the self-report without a gate)."""
    heldout_top1: float | None
    """The trainer's held-out top-1 of it (the self-report without a gate; None: not judged)."""


class MergeGate(Protocol):
    """What the trainer checks at the merge (``trainer/candidate_checks.py``; see the module
    text). ``current`` is the version the candidates were trained from (None: unknown)."""

    def admit(
        self,
        base: int | None,
        usable: Sequence[tuple[StoredCandidate, dict[str, torch.Tensor]]],
        scratch: EagleDrafter,
        current: EagleDrafter | None,
    ) -> tuple[list[Admitted], list[Refusal]]:
        """Weigh and judge the vetted candidates of ``base`` (``scratch``: a drafter to load
        each one into for scoring); each refusal is of stage ``merge``."""
        ...

    def judge_merge(
        self, merged: EagleDrafter, current: EagleDrafter | None
    ) -> tuple[float | None, Refusal | None]:
        """The merge's held-out top-1 and, when it must not be published, why (a refusal of
        stage ``merge`` whose worker the registry fills in with the merged ones)."""
        ...

    def initial_drafter(self) -> EagleDrafter | None:
        """The job's initial drafter: the current version before anything was published."""
        ...
