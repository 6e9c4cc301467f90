"""Refused drafter candidates: one record per refusal, and the book that counts them.

A :class:`Refusal` is what the registry (``registry.py``: an upload that is not the job's
drafter, a stale base, the merge's checks, a publish that supersedes a stored candidate), the
trainer's exchange (``exchange.py``: every 400 of the upload route) and the merge gate
(``trainer/candidate_checks.py``) report for one refused candidate. :class:`RefusalBook` (the
registry's ``refusals``) logs each one once, counts it by stage and by reason
(``longtail_api.drafterstatus.REFUSAL_REASONS``: the trainer's counter, the step row's
``drafter_refused``), and says why no online drafter version was published
(:meth:`RefusalBook.unpublished`: the trainer's status, the step rows, ``longtail run``'s
report). Thread-safe: uploads are refused on the trainer's request threads, merges on the
step driver's.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass

from longtail_api.drafterstatus import NO_CANDIDATE, DrafterMergeStatus, describe_refusals

log = logging.getLogger(__name__)

STAGES = ("upload", "stale", "merge", "superseded")
"""Where a candidate was refused: at the upload (HTTP 400, nothing stored), for its base
(HTTP 409, nothing stored), at the step's merge (dropped from the registry) or by a publish
that overtook it after it was stored."""


@dataclass(frozen=True)
class Refusal:
    """One refused candidate (or one refused merge of several)."""

    stage: str
    """One of :data:`STAGES`."""
    reason: str
    """A key of ``REFUSAL_REASONS``: the metric's ``reason`` label."""
    worker: str
    """The submitting worker (``a+b``: the workers of a refused merge; ``?``: unknown)."""
    message: str
    """What was wrong, naming the field, the value and what is expected."""
    candidates: int = 1
    """Candidates it refuses: a refused merge refuses all of its candidates at once."""
    top1: float | None = None
    """``worse``: the held-out top-1 of the candidate (or merge) on the trainer's sample."""
    bar: float | None = None
    """``worse``: that of the current version on the same sample, which it had to reach."""


class RefusalBook:
    """Every refusal of one registry, counted once (see the module text)."""

    def __init__(self) -> None:
        self.by_stage: Counter[str] = Counter()
        """Candidates refused, by stage."""
        self.by_reason: Counter[str] = Counter()
        """Candidates refused, by reason."""
        self.taken = 0
        """Candidates the merges took (each worker's newest of a window)."""
        self.published = 0
        """Versions the merges published."""
        self.closest: Refusal | None = None
        """The ``worse`` refusal that came closest to its bar (the report's "best")."""
        self._taken_counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, refusal: Refusal) -> None:
        """Count ``refusal`` and log it (one warning line)."""
        with self._lock:
            self.by_stage[refusal.stage] += refusal.candidates
            self.by_reason[refusal.reason] += refusal.candidates
            if refusal.top1 is not None and refusal.bar is not None:
                best = self.closest
                if best is None or refusal.top1 - refusal.bar > _gap(best):
                    self.closest = refusal
        log.warning(
            "drafter candidate of %s refused at %s (%s): %s",
            refusal.worker, refusal.stage, refusal.reason, refusal.message,
        )  # fmt: skip

    def merged(self, taken: int, published: bool) -> None:
        """A merge took ``taken`` candidates and published a version (or not)."""
        with self._lock:
            self.taken += taken
            self.published += int(published)

    def counts(self) -> dict[str, int]:
        """Candidates refused so far, by reason."""
        with self._lock:
            return dict(self.by_reason)

    def take_new(self) -> dict[str, int]:
        """Candidates refused since the last call, by reason (a step row's)."""
        with self._lock:
            new = self.by_reason - self._taken_counts
            self._taken_counts = self.by_reason.copy()
        return dict(new)

    def unpublished(self) -> str:
        """Why no online drafter version was published (ask while none is): no candidate, or
        what was refused, with the best score against the bar it missed."""
        with self._lock:
            taken, reasons, closest = self.taken, dict(self.by_reason), self.closest
        if not taken and not reasons:
            return (
                f"{NO_CANDIDATE}: no drafter window ended with a candidate for the trainer (no "
                "idle window was harvested, or every window drafted worse than its base and "
                "its worker dropped it)"
            )
        refused = sum(reasons.values())
        if closest is not None and set(reasons) == {"worse"}:
            assert closest.top1 is not None and closest.bar is not None
            return (
                f"every candidate ({refused}) scored below the initial drafter's held-out "
                f"top-1 {closest.bar:.3f} on the trainer's sample (best {closest.top1:.3f}), "
                "so the workers keep drafting with the initial drafter"
            )
        why = f"every candidate was refused: {describe_refusals(reasons)}" if reasons else ""
        if not taken:
            why = f"no candidate reached a merge: {describe_refusals(reasons)}"
        elif not why:
            why = f"{taken} candidate(s) were merged, but no merge was published"
        if closest is not None:
            assert closest.top1 is not None and closest.bar is not None
            why += (
                f" (the best scored {closest.top1:.3f} against the initial drafter's "
                f"{closest.bar:.3f})"
            )
        return why

    def status(self, any_published: bool) -> DrafterMergeStatus:
        """The trainer status's ``drafterMerges`` (``any_published``: the registry holds a
        version, so nothing needs explaining)."""
        with self._lock:
            taken, published, refused = self.taken, self.published, dict(self.by_reason)
        why = None if any_published else self.unpublished()
        return DrafterMergeStatus(taken, published, refused, why)


def _gap(refusal: Refusal) -> float:
    assert refusal.top1 is not None and refusal.bar is not None
    return refusal.top1 - refusal.bar
