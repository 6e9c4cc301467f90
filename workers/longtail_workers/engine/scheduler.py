"""Continuous admission: a FIFO waiting queue feeding a running set of bounded size.

Used by the torch engine before every decode step: as soon as running sequences finish, waiting
prompts are admitted (prefilled as one left-padded group and merged into the running batch), so
the batch stays full while the queue lasts and shrinks only in the tail, which is where
speculative decoding switches on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from longtail_workers.engine.batch import SequenceState


class Scheduler:
    """FIFO admission bounded by running slots and a padded prefill-token budget."""

    def __init__(self, max_running: int, max_prefill_tokens: int) -> None:
        if max_running < 1:
            raise ValueError(f"max_running={max_running}; must be >= 1")
        if max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens={max_prefill_tokens}; must be >= 1")
        self.max_running = max_running
        self.max_prefill_tokens = max_prefill_tokens
        self._waiting: deque[SequenceState] = deque()

    def add(self, seqs: Iterable[SequenceState]) -> None:
        self._waiting.extend(seqs)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def admit(self, running: int) -> list[SequenceState]:
        """Pop the prompts to prefill now, given ``running`` sequences already decoding.

        The group's padded size (count x longest prompt) stays within ``max_prefill_tokens``,
        except that one prompt is always admitted when a slot is free (no starvation on a prompt
        longer than the budget).
        """
        free = self.max_running - running
        group: list[SequenceState] = []
        longest = 0
        while self._waiting and len(group) < free:
            nxt = len(self._waiting[0].prompt)
            padded = (len(group) + 1) * max(longest, nxt)
            if group and padded > self.max_prefill_tokens:
                break
            group.append(self._waiting.popleft())
            longest = max(longest, nxt)
        return group
