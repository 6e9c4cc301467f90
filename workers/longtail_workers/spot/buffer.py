"""The rollout capture buffer: what the spot trainer learns from, filled while the worker generates.

Called by the rollout worker (``rollout/control.py``) right after each ``engine.generate`` via
:meth:`RolloutBuffer.add_results`, and read by the spot trainer (``trainer.py``) through
:meth:`RolloutBuffer.snapshot`. One :class:`CapturedSequence` per finished request holds the
response in ``drafter/pairs.py``'s convention (``sequence_from_result``): tokens
``[x_{P-1}, y_0 .. y_{T-2}]`` with the target's post-norm hidden state after each of them, so
``hidden[0]`` is the state at the last prompt position and pairs start at the response.

Bounds and policy (all enforced inside :meth:`RolloutBuffer.add`):

* at most ``max_tokens`` tokens AND ``max_bytes`` bytes (tokens + hidden states) are held;
  the oldest sequences are evicted first; a single sequence longer than the whole budget keeps
  its first tokens (the start of the response);
* only the current RL step and the previous one are kept: a sequence tagged with a newer step
  evicts everything older than ``step - 1``; one tagged older than ``current - 1`` is dropped;
* adding never waits on the trainer: the lock is taken with a short timeout (a contended add
  drops the sequence and counts it) and is held only for O(1) bookkeeping (amortised: each
  sequence is evicted once); evicted tensors are released after the lock is let go.

Tensors stay on the device the engine produced them on (no copy, no host sync on the
generation path).
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from longtail_api.drafterstatus import BufferStats
from longtail_workers.drafter.pairs import sequence_from_result
from longtail_workers.engine.interface import GenerationResult

DROP_STALE = "stale_step"
DROP_CONTENDED = "lock_contended"
DROP_TOO_SHORT = "too_short"
EVICT_CAPACITY = "capacity"
EVICT_OLD_STEP = "old_step"


@dataclass(frozen=True)
class CapturedSequence:
    """One finished response, aligned with ``drafter/pairs.py`` (see the module text)."""

    tokens: torch.Tensor
    """``[N]`` int64: ``x_{P-1}, y_0 .. y_{N-2}``."""
    hidden: torch.Tensor
    """``[N, H]`` target state after reading ``tokens[i]`` (post final norm)."""
    start_position: int
    """Absolute position of ``tokens[0]`` (``P - 1``)."""
    policy_version: int
    step: int
    request_id: str | None = None
    seq_id: int = -1
    """Capture order, assigned by the buffer (monotonic per buffer); picks the held-out slice."""

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def bytes_per_token(self) -> int:
        return int(self.tokens.element_size() + self.hidden.shape[1] * self.hidden.element_size())

    @property
    def nbytes(self) -> int:
        return self.num_tokens * self.bytes_per_token

    def truncated(self, n: int) -> CapturedSequence:
        """The first ``n`` tokens (pairs keep starting at the response)."""
        return replace(self, tokens=self.tokens[:n], hidden=self.hidden[:n])


@dataclass(frozen=True)
class BufferSnapshot:
    """An immutable view of the buffer at one moment (the trainer's input)."""

    sequences: tuple[CapturedSequence, ...]
    version: int
    """Changes whenever the buffer's content changes; equal versions mean equal content."""

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.sequences)


def captured_from_result(
    result: GenerationResult, *, policy_version: int, step: int
) -> CapturedSequence | None:
    """Align one engine result (generated with hidden states); None when it has no pair."""
    if result.hidden_states is None:
        raise ValueError(
            f"result {result.request_id!r} has no hidden_states; generate with "
            "GenerationRequest(return_hidden_states=True) when capturing for the drafter"
        )
    if len(result.output_token_ids) < 2:
        return None  # one state, no (input, next state) pair
    tokens, hidden, start = sequence_from_result(
        result.prompt_token_ids, result.output_token_ids, result.hidden_states
    )
    return CapturedSequence(
        tokens=tokens,
        hidden=hidden.detach(),
        start_position=start,
        policy_version=policy_version,
        step=step,
        request_id=result.request_id,
    )


class RolloutBuffer:
    """Bounded, step-tagged store of captured sequences (see the module text)."""

    def __init__(self, max_tokens: int, max_bytes: int, *, lock_timeout_s: float = 0.005) -> None:
        if max_tokens < 2:
            raise ValueError(f"max_tokens={max_tokens}; must be >= 2 (one training pair)")
        if max_bytes < 1:
            raise ValueError(f"max_bytes={max_bytes}; must be >= 1")
        self.max_tokens = max_tokens
        self.max_bytes = max_bytes
        self.lock_timeout_s = lock_timeout_s
        self._lock = threading.Lock()
        self._items: deque[CapturedSequence] = deque()
        self._tokens = 0
        self._bytes = 0
        self._current_step: int | None = None
        self._version = 0
        self._ids = itertools.count()
        self.dropped: Counter[str] = Counter()
        """Sequences not stored, by reason (stale_step, lock_contended, too_short)."""
        self.evicted: Counter[str] = Counter()
        """Sequences removed after being stored, by reason (capacity, old_step)."""
        self.added_tokens = 0
        """Tokens ever stored (monotonic; a Prometheus counter)."""

    # --- writing (the generation path) ------------------------------------------------------

    def add(self, seq: CapturedSequence) -> int:
        """Store ``seq`` (evicting as needed); tokens stored, 0 when dropped. Never blocks long."""
        if not self._lock.acquire(timeout=self.lock_timeout_s):
            self.dropped[DROP_CONTENDED] += 1  # Counter += is not atomic; a count may be lost
            return 0
        released: list[CapturedSequence] = []  # freed after the lock is let go
        try:
            return self._add_locked(seq, released)
        finally:
            self._lock.release()
            released.clear()

    def _add_locked(self, seq: CapturedSequence, released: list[CapturedSequence]) -> int:
        if self._current_step is None or seq.step > self._current_step:
            self._current_step = seq.step
            while self._items and self._items[0].step < seq.step - 1:
                released.append(self._pop_oldest(EVICT_OLD_STEP))
        elif seq.step < self._current_step - 1:
            self.dropped[DROP_STALE] += 1
            return 0
        fits = min(self.max_tokens, self.max_bytes // max(1, seq.bytes_per_token))
        if fits < 2:
            self.dropped[DROP_TOO_SHORT] += 1
            return 0
        if seq.num_tokens > fits:
            seq = seq.truncated(fits)
        while self._items and (
            self._tokens + seq.num_tokens > self.max_tokens
            or self._bytes + seq.nbytes > self.max_bytes
        ):
            released.append(self._pop_oldest(EVICT_CAPACITY))
        seq = replace(seq, seq_id=next(self._ids))
        self._items.append(seq)
        self._tokens += seq.num_tokens
        self._bytes += seq.nbytes
        self.added_tokens += seq.num_tokens
        self._version += 1
        return seq.num_tokens

    def _pop_oldest(self, reason: str) -> CapturedSequence:
        old = self._items.popleft()
        self._tokens -= old.num_tokens
        self._bytes -= old.nbytes
        self.evicted[reason] += 1
        self._version += 1
        return old

    def add_results(
        self, results: Sequence[GenerationResult], *, policy_version: int, step: int
    ) -> int:
        """The engine hook: capture every result of one ``generate`` call; returns tokens kept."""
        kept = 0
        for result in results:
            seq = captured_from_result(result, policy_version=policy_version, step=step)
            if seq is None:
                self.dropped[DROP_TOO_SHORT] += 1
                continue
            kept += self.add(seq)
        return kept

    def clear(self) -> None:
        """Drop everything (e.g. the worker's policy was replaced by an unrelated one)."""
        with self._lock:
            released = list(self._items)
            self._items.clear()
            self._tokens = self._bytes = 0
            self._version += 1
        released.clear()

    # --- reading (the trainer, the status endpoint) -----------------------------------------

    def snapshot(self) -> BufferSnapshot:
        """The current content (references only; the tensors are never modified)."""
        with self._lock:
            return BufferSnapshot(tuple(self._items), self._version)

    @property
    def version(self) -> int:
        return self._version

    @property
    def num_tokens(self) -> int:
        return self._tokens

    @property
    def num_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def stats(self) -> BufferStats:
        """The ``buffer`` of the worker's status."""
        with self._lock:
            return BufferStats(
                tokens=self._tokens,
                bytes=self._bytes,
                sequences=len(self._items),
                max_tokens=self.max_tokens,
                max_bytes=self.max_bytes,
                steps=tuple(sorted({s.step for s in self._items})),
                policy_versions=tuple(sorted({s.policy_version for s in self._items})),
                dropped=dict(self.dropped),
                evicted=dict(self.evicted),
            )
