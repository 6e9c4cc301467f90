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
accepted drafts plus the correction/bonus token (1: every draft rejected), capped at k+1. Each
answer has its own (a replayed run's per-answer figure, or the job's mean for all); a
fractional one is applied deterministically: the answer carries a credit, adds its accepted
length every speculative step and advances by the whole tokens of its credit (e.g. 2.5 gives
2, 3, 2, 3, ...). A sequence never advances past its response length (the engine
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


class _Answer:
    """One running answer: where the common progress stood at its start, its length, the extra
    tokens its speculative steps gained beyond one a step, and its own acceptance."""

    __slots__ = ("credit", "extra", "length", "rate", "start")

    def __init__(self, start: int, length: int, rate: float) -> None:
        self.start, self.length, self.rate = start, length, rate
        self.extra = 0
        self.credit = 0.0  # fractional accepted length carried to its next speculative step

    def end(self) -> int:
        """The common progress at which it is complete."""
        return self.start + self.length - self.extra


class _Running:
    """The running batch as one progress counter: every step gives every running answer one
    token (a speculative step gives each its extra accepted tokens on top), so an answer
    finishes when the progress reaches ``start + length - extra`` (a heap of those points, with
    stale entries skipped). A plain step costs O(log n), a speculative one O(n log n) over the
    (few) answers still running, which keeps a 64-worker, 32K-token step to seconds."""

    def __init__(self) -> None:
        self.progress = 0
        self.heap: list[tuple[int, int]] = []  # (end progress, id); stale when it moved
        self.alive: dict[int, _Answer] = {}  # id -> answer, in admission order
        self.generated_sum = 0  # sum over running answers of extra - start (context mean)
        self._ids = 0

    def __len__(self) -> int:
        return len(self.alive)

    def admit(self, length: int, first: int, rate: float) -> None:
        """An answer of ``length`` tokens of which ``first`` are generated once its prefill is
        done (1: the prefill's sampled token; more for an answer resumed after preemption),
        gaining ``rate`` tokens per speculative step on average."""
        answer = _Answer(self.progress - first, length, rate)
        self.alive[self._ids] = answer
        heapq.heappush(self.heap, (answer.end(), self._ids))
        self._ids += 1
        self.generated_sum -= answer.start

    def mean_generated(self) -> float:
        return self.progress + self.generated_sum / len(self.alive)

    def advance(self, speculative_cap: float | None = None) -> int:
        """One step: every running answer gains one token, or with ``speculative_cap`` (depth
        + 1) the whole tokens of its credit of ``min(rate, cap)``; none goes past its length.
        Returns the tokens emitted and retires the finished answers."""
        emitted = len(self.alive)
        if speculative_cap is not None:
            for i, a in self.alive.items():
                a.credit += min(a.rate, speculative_cap)
                whole = math.floor(a.credit + 1e-9)
                a.credit -= whole
                if whole > 1:
                    a.extra += whole - 1
                    self.generated_sum += whole - 1
                    emitted += whole - 1
                    heapq.heappush(self.heap, (a.end(), i))
        self.progress += 1
        return emitted - self.retire()

    def retire(self) -> int:
        """Retire the answers the progress has reached; returns the tokens they were credited
        past their length (to take off what a step emitted)."""
        over = 0
        while self.heap and self.heap[0][0] <= self.progress:
            end, i = heapq.heappop(self.heap)
            a = self.alive.get(i)
            if a is None or a.end() != end:
                continue  # preempted or finished earlier, or its end moved: a stale entry
            del self.alive[i]
            over += self.progress - end
            self.generated_sum -= a.extra - a.start
        return over

    def preempt_newest(self) -> tuple[int, int, float]:
        """Take the most recently admitted answer out (vLLM's recompute preemption); returns its
        ``(length, tokens generated so far, rate)`` to queue it again."""
        i = next(reversed(self.alive))
        a = self.alive.pop(i)
        self.generated_sum -= a.extra - a.start
        return a.length, self.progress - a.start + a.extra, a.rate


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
    accepted: Sequence[float] | None = None,
) -> WorkerRun:
    """Generate ``lengths`` (response tokens per answer, in dealt order) on one worker;
    ``kv_tokens``: the KV cache's capacity in tokens (None: unbounded); ``accepted``: each
    answer's own accepted length (default: ``accepted_length`` for all)."""
    rates = list(accepted) if accepted is not None else [accepted_length] * len(lengths)
    if len(rates) != len(lengths):
        raise ValueError(f"{len(rates)} accepted lengths for {len(lengths)} answers")
    policy = SpecDecodePolicy(speculative)
    policy.reset()  # a worker's latch starts off at every rollout
    # (length, tokens generated before a preemption, accepted length)
    waiting: deque[tuple[int, int, float]] = deque(
        (n, 0, r) for n, r in zip(lengths, rates, strict=True)
    )
    running = _Running()
    run = WorkerRun(worker=worker, answers=len(lengths), done_s=0.0, tokens=0)
    t = 0.0

    def kv_used() -> float:
        return len(running) * (prompt_tokens + running.mean_generated()) if running else 0.0

    while waiting or running:
        admitted, prefill, used = 0, 0, kv_used()
        while waiting and len(running) < max_running:
            length, done, rate = waiting[0]
            need = prompt_tokens + done + 1
            if kv_tokens is not None and running and used + need > kv_tokens:
                break  # the cache is full: wait for answers to finish
            waiting.popleft()
            running.admit(length, first=done + 1, rate=rate)  # the prefill samples a token
            admitted, prefill, used = admitted + 1, prefill + prompt_tokens + done, used + need
        if admitted:
            dt = latency.prefill_s(prefill)
            _add(run.segments, worker, t, t + dt, "prefill")
            t += dt
            run.tokens += admitted
            running.retire()  # answers of one token are done
            if not running:
                continue
        n = len(running)
        context = prompt_tokens + running.mean_generated()
        if policy.observe(n):
            choice = policy.choose(n)
            depth = choice.draft_depth
            dt = latency.speculative_s(n, context, depth)
            emitted = running.advance(speculative_cap=depth + 1.0)
            policy.record(choice, emitted, dt)
            run.speculative_steps += 1
            kind: SegmentKind = "speculative"
        else:
            dt = latency.decode_s(n, context)
            emitted = running.advance()
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
