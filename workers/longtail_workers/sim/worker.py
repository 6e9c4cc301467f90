"""One rollout worker's share of a step, simulated event by event (pure Python, no torch).

Called by ``sim/step.py`` once per rollout worker. The worker runs continuous batching as the
engine does: before every decode step it admits waiting answers (in dealt order) up to
``max_running`` and pays their prefill at the profile's prefill rate (prefill emits no token
here); then one decode step advances every running sequence. Whether that step speculates is
decided by the job's own adaptive policy, :class:`SpecDecodePolicy` (the one decision function;
its latch and strategy choice are not re-implemented here). A speculative step of depth k costs
k draft steps plus one verify of k+1 positions (``LatencyModel.speculative_s``).

Accepted length follows ``engine/stats.py``: tokens one sequence gains in one speculative step,
accepted drafts plus the correction/bonus token (1: every draft rejected), capped at k+1. A
fractional mean is applied deterministically: each sequence carries a credit, adds the gain
every speculative step and advances by the whole tokens of its credit (e.g. 2.5 gives 2, 3, 2,
3, ...). A sequence never advances past its response length (the engine truncates at the stop
token or ``max_new_tokens``). The context of a step is the prompt plus the running sequences'
mean generated tokens.
"""

from __future__ import annotations

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
    segments: list[Segment] = field(default_factory=list)
    """Its busy timeline (idle and harvest segments are added by the step)."""


class _Seq:
    """One answer in flight: tokens generated, tokens to go, fractional acceptance credit."""

    __slots__ = ("credit", "generated", "length")

    def __init__(self, length: int) -> None:
        self.length = length
        self.generated = 0
        self.credit = 0.0

    def advance(self, gain: float) -> int:
        """Add ``gain`` tokens of credit; emit its whole tokens (at most to the length)."""
        self.credit += gain
        whole = math.floor(self.credit + 1e-9)
        self.credit -= whole
        step = min(whole, self.length - self.generated)
        self.generated += step
        return step


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
) -> WorkerRun:
    """Generate ``lengths`` (response tokens per answer, in dealt order) on one worker."""
    policy = SpecDecodePolicy(speculative)
    policy.reset()  # a worker's latch starts off at every rollout
    waiting = deque(lengths)
    running: list[_Seq] = []
    run = WorkerRun(worker=worker, answers=len(lengths), done_s=0.0, tokens=0)
    t, generated = 0.0, 0  # generated: sum over running sequences, for the mean context
    while waiting or running:
        admitted = 0
        while waiting and len(running) < max_running:
            running.append(_Seq(waiting.popleft()))
            admitted += 1
        if admitted:
            dt = latency.prefill_s(admitted * prompt_tokens)
            _add(run.segments, worker, t, t + dt, "prefill")
            t += dt
        n = len(running)
        context = prompt_tokens + generated / n
        if policy.observe(n):
            choice = policy.choose(n)
            depth = choice.draft_depth
            dt = latency.speculative_s(n, context, depth)
            gain = min(accepted_length, depth + 1.0)
            emitted = sum(s.advance(gain) for s in running)
            policy.record(choice, emitted, dt)
            run.speculative_steps += 1
            kind: SegmentKind = "speculative"
        else:
            dt = latency.decode_s(n, context)
            emitted = sum(s.advance(1.0) for s in running)
            run.decode_steps += 1
            kind = "decode"
        _add(run.segments, worker, t, t + dt, kind)
        t += dt
        run.tokens += emitted
        generated += emitted
        finished = [s for s in running if s.generated >= s.length]
        if finished:
            running = [s for s in running if s.generated < s.length]
            generated -= sum(s.generated for s in finished)
    run.done_s = t
    return run
