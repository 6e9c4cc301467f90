"""One rollout worker's share of a step, simulated event by event (pure Python, no torch).

Called by ``sim/step.py`` once per rollout worker. The worker runs continuous batching as the
engine does: before every decode step it admits waiting answers (in dealt order) up to
``max_running`` and pays their prefill at the profile's prefill rate; the prefill samples each
admitted answer's first token, as the engines do; then one decode step advances every running
sequence. Whether that step speculates is decided by the job's own adaptive policy,
:class:`SpecDecodePolicy` (the one decision function; its latch and strategy choice are not
re-implemented here). A speculative step of depth k costs what ``LatencyModel.speculative_s``
says (the engine-measured step, or k draft steps plus one verify of k+1 positions), by the
drafter kind of the strategy the policy picked (``LatencyModel.speculative_step_s``: a
``history`` step runs no drafter forward and pays every row's host proposal instead, a
``hybrid`` one pays both); the kind also sets what the rows gain (``sim/drafters.py``).

Accepted length follows ``engine/stats.py``: tokens one sequence gains in one speculative step,
accepted drafts plus the correction/bonus token (1: every draft rejected), capped at k+1. Each
answer has its own (a replayed run's per-answer figure, or the job's mean for all); a
fractional one is applied deterministically: the answer carries a credit, adds its accepted
length every speculative step and advances by the whole tokens of its credit (e.g. 2.5 gives
2, 3, 2, 3, ...). A sequence never advances past its response length (the engine
truncates at the stop token or ``max_new_tokens``). The context of a step is the running
answers' mean length (prompt + generated), or, for an engine that pads every row to the
longest (``EngineProfile.padded_context``: the torch engine), the longest running answer's: a
batch that holds one 80-token prompt among 11-token ones decodes at context 80 and more.

When speculation switches on (the step before did not speculate), the drafter first reads every
running row's response so far (the engine's catch-up, ``engine/native/specdec.py``): that step costs
the profile's ``drafter_catch_up_tokens_per_s`` on top. A history step feeds the learned drafter
nothing, so it does not keep the drafter's cache live: the next ``learned`` or ``hybrid`` step
first reads what the history steps since its last step committed (all the running rows'
responses if no learned step ran since speculation switched on).

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
from typing import Literal, NamedTuple

from longtail_api.policies import SpeculativeSpec
from longtail_workers.engine.sd_policy import SpecDecodePolicy
from longtail_workers.sim.drafters import DEFAULT_HISTORY, HistoryAcceptance
from longtail_workers.sim.latency import LatencyModel

SegmentKind = Literal["overhead", "prefill", "decode", "speculative", "idle", "harvest"]
"""What a worker does in a timeline segment (``overhead``: the generate call's transport,
capture and the engine's warm-up, :class:`CallOverhead`)."""


@dataclass(frozen=True)
class CallOverhead:
    """What one worker's generate call costs beyond its engine steps (the profile's
    ``overheads``, ``sim/step.py`` fills it in; zero: not modelled)."""

    call_s: float = 0.0
    """Once per call, charged at its end: the reply's way back, capture, transport."""
    step_s: float = 0.0
    """Per engine step: the engine's work between the steps it times."""
    warmup_s: float = 0.0
    """Once, at the start: the first call of a fresh engine (the job's first step)."""


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


class _Queued(NamedTuple):
    """A waiting answer: its length, the tokens it had generated before a preemption (0 for a
    new one), its accepted length and its prompt's length."""

    length: int
    done: int
    rate: float
    prompt: int


class _Answer:
    """One running answer: where the common progress stood at its start, its length, its
    prompt's, the extra tokens its speculative steps gained beyond one a step, and its own
    acceptance."""

    __slots__ = ("credit", "extra", "length", "prompt", "rate", "start")

    def __init__(self, start: int, length: int, rate: float, prompt: int) -> None:
        self.start, self.length, self.rate, self.prompt = start, length, rate, prompt
        self.extra = 0
        self.credit = 0.0  # fractional accepted length carried to its next speculative step

    def end(self) -> int:
        """The common progress at which it is complete."""
        return self.start + self.length - self.extra

    def offset(self) -> int:
        """Its tokens (prompt + generated) less the common progress."""
        return self.prompt + self.extra - self.start


class _Running:
    """The running batch as one progress counter: every step gives every running answer one
    token (a speculative step gives each its extra accepted tokens on top), so an answer
    finishes when the progress reaches ``start + length - extra`` (a heap of those points, with
    stale entries skipped). A plain step costs O(log n), a speculative one O(n log n) over the
    (few) answers still running, which keeps a 64-worker, 32K-token step to seconds. The
    longest running answer is kept the same way (a max-heap of offsets, stale entries
    skipped)."""

    def __init__(self) -> None:
        self.progress = 0
        self.heap: list[tuple[int, int]] = []  # (end progress, id); stale when it moved
        self.longest: list[tuple[int, int]] = []  # (-offset, id); stale when it moved
        self.alive: dict[int, _Answer] = {}  # id -> answer, in admission order
        self.offset_sum = 0  # sum over running answers of their offset (context mean)
        self.prompt_sum = 0  # sum over running answers of their prompt tokens
        self._ids = 0

    def __len__(self) -> int:
        return len(self.alive)

    def admit(self, length: int, first: int, rate: float, prompt: int) -> None:
        """An answer of ``length`` tokens to a ``prompt``-token prompt, of which ``first`` are
        generated once its prefill is done (1: the prefill's sampled token; more for an answer
        resumed after preemption), gaining ``rate`` tokens per speculative step on average."""
        answer = _Answer(self.progress - first, length, rate, prompt)
        self.alive[self._ids] = answer
        heapq.heappush(self.heap, (answer.end(), self._ids))
        heapq.heappush(self.longest, (-answer.offset(), self._ids))
        self._ids += 1
        self.offset_sum += answer.offset()
        self.prompt_sum += prompt

    def kv_tokens(self) -> float:
        """Tokens the running answers hold in the KV cache (prompt + generated, all rows)."""
        return len(self) * self.mean_tokens() if len(self) else 0.0

    def mean_tokens(self) -> float:
        """Mean tokens (prompt + generated) of the running answers."""
        return self.progress + self.offset_sum / len(self.alive)

    def generated_tokens(self) -> float:
        """Response tokens of the running answers, all together."""
        return len(self.alive) * self.progress + self.offset_sum - self.prompt_sum

    def longest_tokens(self) -> int:
        """Tokens (prompt + generated) of the longest running answer."""
        while True:
            neg, i = self.longest[0]
            a = self.alive.get(i)
            if a is not None and a.offset() == -neg:
                return self.progress - neg
            heapq.heappop(self.longest)  # retired, preempted or grown since: stale

    def advance(
        self, speculative_cap: float | None = None, mix: tuple[float, float] = (0.0, 1.0)
    ) -> int:
        """One step: every running answer gains one token, or with ``speculative_cap`` (depth
        + 1) the whole tokens of its credit of ``min(rate, cap)``, its rate being ``share x
        length + (1 - share) x its own`` for ``mix`` = (share of rows drafted from history, their
        accepted length; ``HistoryAcceptance.mix``); none goes past its length. Returns the
        tokens emitted and retires the finished answers."""
        emitted = len(self.alive)
        if speculative_cap is not None:
            share, history = mix
            for i, a in self.alive.items():
                rate = a.rate if share == 0 else share * history + (1 - share) * a.rate
                a.credit += min(rate, speculative_cap)
                whole = math.floor(a.credit + 1e-9)
                a.credit -= whole
                if whole > 1:
                    a.extra += whole - 1
                    self.offset_sum += whole - 1
                    emitted += whole - 1
                    heapq.heappush(self.heap, (a.end(), i))
                    heapq.heappush(self.longest, (-a.offset(), i))
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
            self.offset_sum -= a.offset()
            self.prompt_sum -= a.prompt
        return over

    def preempt_newest(self) -> _Queued:
        """Take the most recently admitted answer out (vLLM's recompute preemption); returns it
        as queued again, with the tokens it had generated."""
        i = next(reversed(self.alive))
        a = self.alive.pop(i)
        self.offset_sum -= a.offset()
        self.prompt_sum -= a.prompt
        return _Queued(a.length, self.progress - a.start + a.extra, a.rate, a.prompt)


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
    prompts: Sequence[int],
    accepted_length: float,
    kv_tokens: int | None = None,
    accepted: Sequence[float] | None = None,
    padded: bool = False,
    overhead: CallOverhead = CallOverhead(),
    history: HistoryAcceptance = DEFAULT_HISTORY,
) -> WorkerRun:
    """Generate ``lengths`` (response tokens per answer, in dealt order) on one worker;
    ``prompts``: each answer's prompt length, same order; ``kv_tokens``: the KV
    cache's capacity in tokens (None: unbounded); ``accepted``: each answer's own accepted
    length (default: ``accepted_length`` for all); ``padded``: a step's context is the longest
    running answer's, not the mean (``EngineProfile.padded_context``); ``overhead``: what the
    call costs beyond the engine's steps; ``history``: what the history drafter's rows gain."""
    rates = list(accepted) if accepted is not None else [accepted_length] * len(lengths)
    if len(rates) != len(lengths) or len(prompts) != len(lengths):
        raise ValueError(
            f"{len(rates)} accepted lengths and {len(prompts)} prompt lengths for "
            f"{len(lengths)} answers: give one per answer"
        )
    policy = SpecDecodePolicy(speculative)
    policy.reset()  # a worker's latch starts off at every rollout
    waiting = deque(_Queued(n, 0, r, p) for n, r, p in zip(lengths, rates, prompts, strict=True))
    running = _Running()
    run = WorkerRun(worker=worker, answers=len(lengths), done_s=0.0, tokens=0)
    t = overhead.warmup_s
    _add(run.segments, worker, 0.0, t, "overhead")
    behind: float | None = None  # response tokens the learned drafter has not read (None: all)

    while waiting or running:
        admitted, prefill = _admit(waiting, running, max_running, kv_tokens)
        if admitted:
            dt = latency.prefill_s(prefill)
            _add(run.segments, worker, t, t + dt, "prefill")
            t += dt
            run.tokens += admitted  # the prefill samples each admitted answer's first token
            running.retire()  # answers of one token are done
            if not running:
                continue
        n = len(running)
        context = running.longest_tokens() if padded else running.mean_tokens()
        if policy.observe(n):
            choice = policy.choose(n)
            depth, drafter = choice.draft_depth, choice.drafter
            dt = latency.speculative_step_s(drafter, n, context, depth)
            if drafter != "history":  # the learned drafter first reads what it has not read
                dt += latency.catch_up_s(_catch_up_tokens(running, speculative, behind))
                behind = 0.0
            emitted = running.advance(speculative_cap=depth + 1.0, mix=history.mix(drafter))
            if drafter == "history" and behind is not None:
                behind += emitted  # committed without the learned drafter reading them
            policy.record(choice, emitted, dt)  # the engine's own step time, as it records it
            dt += overhead.step_s
            run.speculative_steps += 1
            kind: SegmentKind = "speculative"
        else:
            dt = latency.decode_s(n, context) + overhead.step_s
            emitted = running.advance()
            behind = None  # plain steps feed no drafter: a switch on reads everything again
            run.decode_steps += 1
            kind = "decode"
        _add(run.segments, worker, t, t + dt, kind)
        t += dt
        run.tokens += emitted
        while kv_tokens is not None and len(running) > 1 and running.kv_tokens() > kv_tokens:
            waiting.appendleft(running.preempt_newest())
            run.preempted += 1
    _add(run.segments, worker, t, t + overhead.call_s, "overhead")
    run.done_s = t + overhead.call_s
    return run


def _admit(
    waiting: deque[_Queued], running: _Running, max_running: int, kv_tokens: int | None
) -> tuple[int, int]:
    """Move answers from the front of ``waiting`` into ``running`` while a slot is free and
    (with a capacity) the KV cache holds them; returns (answers admitted, tokens to prefill)."""
    admitted, prefill, used = 0, 0, running.kv_tokens()
    while waiting and len(running) < max_running:
        q = waiting[0]
        need = q.prompt + q.done + 1
        if kv_tokens is not None and running and used + need > kv_tokens:
            break  # the cache is full: wait for answers to finish
        waiting.popleft()
        running.admit(q.length, first=q.done + 1, rate=q.rate, prompt=q.prompt)
        admitted, prefill, used = admitted + 1, prefill + q.prompt + q.done, used + need
    return admitted, prefill


def _catch_up_tokens(
    running: _Running, speculative: SpeculativeSpec, behind: float | None
) -> float:
    """Response tokens the learned drafter reads before its step: every running row's response
    so far when it has read none of it (``behind`` None: speculation just switched on), else
    the ``behind`` tokens committed since its last step (history steps; 0 after its own step),
    at most ``drafterContextWindow`` a row."""
    tokens = running.generated_tokens()
    if behind is not None:
        tokens = min(tokens, behind)
    window = speculative.drafter_context_window
    return tokens if window is None else min(tokens, float(len(running) * window))
