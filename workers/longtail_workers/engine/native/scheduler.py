"""Continuous admission: a FIFO waiting queue feeding a running set of bounded size.

Used by the torch engine before every decode step: as soon as running sequences finish, waiting
prompts are admitted (prefilled in right-padded groups, ``steps.prefill``, and take rows of the
running batch), so
the batch stays full while the queue lasts and shrinks only in the tail, which is where
speculative decoding switches on. :func:`length_groups` splits an admitted group by prompt length
so that a few long prompts do not make every short one pay for their padding.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from longtail_workers.engine.native.batch import SequenceState


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


def length_groups(lengths: list[int], split_cost: int) -> list[list[int]]:
    """Partition prompt indices into prefill groups that minimise padded tokens plus overhead.

    A group costs ``split_cost + len(group) * max(length in group)``: ``split_cost`` is what one
    more forward is worth in padded tokens (its fixed overhead). Prompts are sorted by length, so
    the optimal groups are contiguous runs of the sorted order, found by an O(n^2) dynamic
    programme (n is at most the running-batch size). Returns index lists, shortest prompts first.
    """
    if split_cost < 0:
        raise ValueError(f"split_cost={split_cost}; must be >= 0")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    ls = [lengths[i] for i in order]
    n = len(ls)
    best = [0] + [0] * n  # best[j]: cost of grouping the j shortest prompts
    cut = [0] * (n + 1)  # cut[j]: where the last group of that optimum starts
    for j in range(1, n + 1):
        best[j], cut[j] = min((best[i] + split_cost + (j - i) * ls[j - 1], i) for i in range(j))
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]
