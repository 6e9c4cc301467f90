"""What each drafter kind gains in a simulated speculative step, and where its figures come from.

Called by ``sim/worker.py`` (every speculative step asks :meth:`HistoryAcceptance.mix` for the
rows' accepted length under the step's drafter), ``sim/step.py`` (a :class:`JobShape` carries a
:class:`HistoryAcceptance`) and ``longtail simulate`` (:func:`history_acceptance` reads the
profile's figures, or the caller's, and says which defaults filled the gaps). Pure Python.

The drafter kinds are the strategies' (``speculative.strategies[].drafter``):

* ``learned``: every row gains its own accepted length (the job's, or a replayed answer's);
* ``history``: every row gains the history drafter's accepted length over all rows of a history
  step (rows without a match propose padding and rarely keep a draft);
* ``hybrid``: a share of the rows (those whose match reaches ``hybridMinMatch``) take the
  history's drafts and gain what such rows gain; the others gain their learned accepted length.
  Per row the simulator applies the expected value, ``share x history + (1 - share) x own``.

What each kind costs is ``sim/latency.py``'s :meth:`LatencyModel.speculative_step_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

from longtail_api.policies import DrafterKind
from longtail_api.profile import EngineProfile

DEFAULT_HISTORY_ACCEPTED_LENGTH = 1.6
"""Accepted length of a history step over all its rows where neither the profile nor the caller
gives one: the history arm of ``bench/staleness.py`` (examples/01, 20 GRPO steps,
``bench/results/staleness.json``), token-weighted over its steps. Short arithmetic answers: a
long reasoning answer repeats itself and its group more, so treat it as a low figure."""
DEFAULT_HYBRID_HISTORY_SHARE = 0.28
"""Share of a hybrid step's rows drafted from history, where none is given: the hybrid arm of
the same run (each source's token share over its accepted length)."""
DEFAULT_HYBRID_HISTORY_ACCEPTED_LENGTH = 2.5
"""Accepted length of those rows, where none is given: the same run's hybrid arm."""


@dataclass(frozen=True)
class HistoryAcceptance:
    """What the history drafter's rows gain per speculative step (see the module text)."""

    accepted_length: float = DEFAULT_HISTORY_ACCEPTED_LENGTH
    """A history step's rows, all of them (accepted drafts + 1)."""
    hybrid_share: float = DEFAULT_HYBRID_HISTORY_SHARE
    """Share of a hybrid step's rows whose match is long enough to take the history's drafts."""
    hybrid_accepted_length: float = DEFAULT_HYBRID_HISTORY_ACCEPTED_LENGTH
    """Accepted length of those rows."""

    def __post_init__(self) -> None:
        if not (self.accepted_length >= 1 and self.hybrid_accepted_length >= 1):
            raise ValueError(
                f"history accepted lengths {self.accepted_length!r}, "
                f"{self.hybrid_accepted_length!r}: must be >= 1 (accepted drafts + 1)"
            )
        if not 0 <= self.hybrid_share <= 1:
            raise ValueError(f"hybrid history share {self.hybrid_share!r}: must be in [0, 1]")

    def mix(self, kind: DrafterKind) -> tuple[float, float]:
        """``(share of rows drafted from history, their accepted length)`` in a ``kind`` step;
        a row's accepted length is ``share x length + (1 - share) x its own``."""
        if kind == "history":
            return 1.0, self.accepted_length
        if kind == "hybrid":
            return self.hybrid_share, self.hybrid_accepted_length
        return 0.0, 1.0


DEFAULT_HISTORY = HistoryAcceptance()
"""The defaults above (what a :class:`~longtail_workers.sim.step.JobShape` carries unless
told)."""


def history_acceptance(
    profile: EngineProfile,
    accepted_length: float | None = None,
    hybrid_share: float | None = None,
) -> tuple[HistoryAcceptance, list[str]]:
    """The history drafter's figures: the caller's where given, else the profile's, else the
    defaults above; and a note for each default used."""
    notes: list[str] = []
    length = accepted_length or profile.accepted_length.get("history")
    if length is None:
        length = DEFAULT_HISTORY_ACCEPTED_LENGTH
        notes.append(
            f"history drafter: accepted length {length} over all rows of a history step "
            "(default: examples/01's history arm, bench/results/staleness.json; the profile "
            "records none, e.g. one written before the history drafter)"
        )
    share = hybrid_share if hybrid_share is not None else profile.hybrid_history_share
    hybrid_length = profile.hybrid_history_accepted_length
    if share is None or hybrid_length is None:
        notes.append(
            "hybrid drafter: "
            + ("" if share is not None else f"{DEFAULT_HYBRID_HISTORY_SHARE:.0%} of the rows ")
            + ("" if hybrid_length is not None else
               f"at accepted length {DEFAULT_HYBRID_HISTORY_ACCEPTED_LENGTH} ")
            + "from history (default: examples/01's hybrid arm, bench/results/staleness.json), "
            "the others at the learned drafter's"
        )  # fmt: skip
    acceptance = HistoryAcceptance(
        accepted_length=length,
        hybrid_share=DEFAULT_HYBRID_HISTORY_SHARE if share is None else share,
        hybrid_accepted_length=(
            DEFAULT_HYBRID_HISTORY_ACCEPTED_LENGTH if hybrid_length is None else hybrid_length
        ),
    )
    return acceptance, notes
