"""One rollout worker's share of a step, simulated event by event (pure Python, no torch).

Called by ``sim/step.py`` once per rollout worker. The worker runs continuous batching as the
engine does: before every decode step it admits waiting answers (in dealt order) up to
``max_running`` and pays their prefill at the profile's prefill rate; the prefill samples each
admitted answer's first token, as the engines do; then one decode step advances every running
sequence. Whether that step speculates is decided by the job's own adaptive policy,
:class:`SpecDecodePolicy` (the one decision function; its latch and strategy choice are not
re-implemented here). A speculative step of depth k costs what ``LatencyModel.speculative_s``
says (the engine-measured step, or k draft steps plus one verify of k+1 positions).

Accepted length follows ``engine/stats.py``: tokens one sequence gains in one speculative step,
accepted drafts plus the correction/bonus token (1: every draft rejected), capped at k+1. A
fractional mean is applied deterministically: the worker carries a credit, adds the gain every
speculative step and advances every running sequence by the whole tokens of its credit (e.g.
2.5 gives 2, 3, 2, 3, ...). A sequence never advances past its response length (the engine
truncates at the stop token or ``max_new_tokens``). The context of a step is the prompt plus
the running sequences' mean generated tokens.

KV cache: with a capacity (``kv_tokens``, from the profile), an answer is admitted only while
the running answers' tokens (prompt + generated) and its own fit; when the running answers grow
past the capacity, the most recently admitted one is preempted as vLLM does (recompute): it goes
back to the front of the queue and, when admitted again, prefills its prompt and the tokens it
had generated, then continues.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from longtail_api.policies import SpeculativeSpec
from longtail_workers.engine.sd_policy import SpecDecodePolicy
from longtail_workers.sim.latency import LatencyModel

SegmentKind = Literal["prefill", "decode", "speculative", "idle", "harvest"]
"""What a worker does in a timeline segment."""


@dataclass(frozen=True)
class Segment:
    """A stretch of one worker's timeline (seconds from the start of the rollout)."""

    worker: int
    """Rollout worker index."""
    start: float
    """Start, seconds from the rollout's start."""
    end: float
    """End, seconds from the rollout's start."""
    kind: SegmentKind
    """What the worker does: prefill, plain decode, speculative decode, idle, or harvested
    (training the drafter)."""


@dataclass
class WorkerRun:
    """The outcome of one worker's rollout."""

    worker: int
    """Rollout worker index."""
    answers: int
    """Answers dealt to it."""
    done_s: float
    """When its last answer finished, seconds from the rollout's start."""
    tokens: int
    """Response tokens it generated."""
    decode_steps: int = 0
    """Plain decode steps."""
    speculative_steps: int = 0
    """Speculative steps."""
    preempted: int = 0
    """Answers taken out of a full KV cache and queued again (their prefill is paid again)."""
    segments: list[Segment] = field(default_factory=list)
    """Its busy timeline (idle and harvest segments are added by the step)."""


class _Running:
    """The running batch as one progress counter: every running answer advances by the same
    tokens in a step (a plain step 1, a speculative step the worker's whole credit), so an answer
    is ``(progress at admission, length)`` and finishes when the progress has grown by its length
    (a heap of those points). A step costs O(log n) instead of a pass over every answer, which
    keeps a 64-worker, 32K-token step to seconds."""

    def __init__(self) -> None:
        self.progress = 0
        self.credit = 0.0  # fractional accepted length carried to the next speculative step
        self.ends: list[tuple[int, int, int]] = []  # heap of (end progress, start, id)
        self.alive: dict[int, tuple[int, int]] = {}  # id -> (start, length), admission order
        self.start_sum = 0  # sum of the running answers' start progress (for the context)
        self._ids = 0

    def __len__(self) -> int:
        return len(self.alive)

    def admit(self, length: int, first: int) -> None:
        """An answer of ``length`` tokens of which ``first`` are generated once its prefill is
        done (1: the prefill's sampled token; more for an answer resumed after preemption)."""
        start = self.progress - first
        heapq.heappush(self.ends, (start + length, start, self._ids))
        self.alive[self._ids] = (start, length)
        self._ids += 1
        self.start_sum += start

    def mean_generated(self) -> float:
        return self.progress - self.start_sum / len(self.alive)

    def advance(self, whole: int) -> int:
        """Every running answer gains ``whole`` tokens (none past its length); returns the
        tokens emitted and retires the finished answers."""
        self.progress += whole
        emitted = whole * len(self.alive)
        while self.ends and self.ends[0][0] <= self.progress:
            end, start, i = heapq.heappop(self.ends)
            if self.alive.pop(i, None) is None:
                continue  # preempted earlier; its entry was left in the heap
            emitted -= self.progress - end  # it stopped at its length
            self.start_sum -= start
        return emitted

    def preempt_newest(self) -> tuple[int, int]:
        """Take the most recently admitted answer out (vLLM's recompute preemption); returns its
        ``(length, tokens generated so far)`` to queue it again."""
        i = next(reversed(self.alive))
        start, length = self.alive.pop(i)
        self.start_sum -= start
        return length, self.progress - start

    def gain(self, accepted_length: float) -> int:
        """Whole tokens of a speculative step: the credit grows by the accepted length and its
        whole part is spent (2.5 gives 2, 3, 2, 3, ...)."""
        self.credit += accepted_length
        whole = math.floor(self.credit + 1e-9)
        self.credit -= whole
        return whole


def _add(segments: list[Segment], worker: int, start: float, end: float, kind: SegmentKind) -> None:
    """Append a segment, merging it into the previous one of the same kind (an empty one, e.g.
    the prefill of empty prompts, is dropped)."""
    if end <= start:
        return
    if segments and segments[-1].kind == kind and abs(segments[-1].end - start) < 1e-12:
        last = segments.pop()
        start = last.start
    segments.append(Segment(worker, start, end, kind))


def simulate_worker(
    worker: int,
    lengths: Sequence[int],
    latency: LatencyModel,
    speculative: SpeculativeSpec,
    *,
    max_running: int,
    prompt_tokens: int,
    accepted_length: float,
    kv_tokens: int | None = None,
) -> WorkerRun:
    """Generate ``lengths`` (response tokens per answer, in dealt order) on one worker;
    ``kv_tokens``: the KV cache's capacity in tokens (None: unbounded)."""
    policy = SpecDecodePolicy(speculative)
    policy.reset()  # a worker's latch starts off at every rollout
    waiting: deque[tuple[int, int]] = deque((n, 0) for n in lengths)  # (length, generated)
    running = _Running()
    run = WorkerRun(worker=worker, answers=len(lengths), done_s=0.0, tokens=0)
    t = 0.0

    def kv_used() -> float:
        return len(running) * (prompt_tokens + running.mean_generated()) if running else 0.0

    while waiting or running:
        admitted, prefill, used = 0, 0, kv_used()
        while waiting and len(running) < max_running:
            length, done = waiting[0]
            need = prompt_tokens + done + 1
            if kv_tokens is not None and running and used + need > kv_tokens:
                break  # the cache is full: wait for answers to finish
            waiting.popleft()
            running.admit(length, first=done + 1)  # the prefill samples the next token
            admitted, prefill, used = admitted + 1, prefill + prompt_tokens + done, used + need
        if admitted:
            dt = latency.prefill_s(prefill)
            _add(run.segments, worker, t, t + dt, "prefill")
            t += dt
            run.tokens += admitted
            running.advance(0)  # retire answers of one token
            if not running:
                continue
        n = len(running)
        context = prompt_tokens + running.mean_generated()
        if policy.observe(n):
            choice = policy.choose(n)
            depth = choice.draft_depth
            dt = latency.speculative_s(n, context, depth)
            emitted = running.advance(running.gain(min(accepted_length, depth + 1.0)))
            policy.record(choice, emitted, dt)
            run.speculative_steps += 1
            kind: SegmentKind = "speculative"
        else:
            dt = latency.decode_s(n, context)
            emitted = running.advance(1)
            run.decode_steps += 1
            kind = "decode"
        _add(run.segments, worker, t, t + dt, kind)
        t += dt
        run.tokens += emitted
        while kv_tokens is not None and len(running) > 1 and kv_used() > kv_tokens:
            waiting.appendleft(running.preempt_newest())
            run.preempted += 1
    run.done_s = t
    return run
