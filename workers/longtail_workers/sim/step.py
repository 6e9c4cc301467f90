"""One simulated RL step of a job shape on an engine profile: rollout, harvest, trainer, sync.

Called by ``longtail simulate`` (and the projections in docs/performance.md) through
:func:`simulate_step` and :func:`compare`. The step:

1. **Dispatch.** ``prompts x group`` answers are dealt to the rollout workers in whole groups,
   round-robin, by :func:`longtail_workers.shards.shard_round_robin` (the real dispatch's
   function). Each worker then runs on its own (``sim/worker.py``).
2. **Harvest.** A worker with no running or waiting answers while others still generate is
   idle. Whether it is harvested is the job's own rule, :func:`longtail_api.harvest.decide`,
   asked at the rollout's end with the worker's whole idle time: a worker idle for at least
   ``harvest.idleSeconds`` trains the drafter from ``idleSeconds`` after it ran dry until the
   rollout ends. Polling granularity is ignored (idleness is seen the moment it reaches the
   threshold), and so are trainer GPUs even when ``trainer`` is an eligible role.
3. **Trainer.** The update's tokens (prompt + response of every answer) x the profile's trainer
   seconds per token, divided by the trainer replicas; then the weight sync: the shape's
   seconds (``longtail simulate`` charges the job's transport phase by phase, ``sim/sync.py``,
   or takes ``--weight-sync-s``), or the profile's flat HTTP figure when the shape has none;
   then the merge of the drafter candidates: one per harvested worker, or as many as the
   replayed run's step merged (whether a window's training passes the worker's quality gate
   and is submitted is the run's outcome, like its accepted length).
4. **Overheads** (a profile's ``overheads``, measured through the real code paths; left out
   when a profile has none): every worker's generate call costs ``call_s`` beyond its engine
   steps and every engine step ``engine_step_s``; the first step of a run also pays the
   engine's and the update's warm-up.

GPU-seconds are worker seconds x GPUs per rollout worker. The accepted length is an input and
stays fixed over the step (the drafter's improvement during harvest is not modelled); so are the
history drafter's (``JobShape.history``, used by the steps whose strategy drafts from history).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from longtail_api.harvest import DRAFTER_TRAIN, WorkerView, decide
from longtail_api.policies import HarvestSpec, SpeculativeSpec
from longtail_api.profile import EngineProfile
from longtail_workers.shards import shard_round_robin
from longtail_workers.sim.drafters import DEFAULT_HISTORY, HistoryAcceptance
from longtail_workers.sim.latency import LatencyModel
from longtail_workers.sim.worker import CallOverhead, Segment, WorkerRun, simulate_worker


@dataclass(frozen=True)
class JobShape:
    """What the simulator needs of an RLJob (plus the inputs a spec does not hold)."""

    rollout_workers: int
    """Rollout worker replicas (``spec.rollout.replicas``)."""
    gpus_per_worker: int
    """GPUs per rollout worker (``spec.rollout.resources.gpus``; 1 for a CPU worker)."""
    prompts: int
    """Prompts per step (``spec.algorithm.promptsPerStep``)."""
    group: int
    """Answers per prompt (``spec.algorithm.groupSize``)."""
    max_running: int
    """Most sequences one worker decodes at once (continuous batching's running batch)."""
    prompt_tokens: int
    """Prompt length, tokens (every answer's prompt)."""
    speculative: SpeculativeSpec
    """The job's adaptive SD policy (``spec.speculative``)."""
    harvest: HarvestSpec
    """The job's harvest settings (``spec.harvest``)."""
    accepted_length: float = 1.0
    """Mean accepted length of a speculative step (accepted drafts + 1, see ``sim/worker.py``)."""
    trainer_replicas: int = 1
    """Trainer data-parallel replicas the update's tokens are split over."""
    weight_sync_s: float | None = None
    """Seconds to move the new weights to the rollout workers after the update (``longtail
    simulate``: the transport's charge, ``sim/sync.py``; None: the profile's flat figure)."""
    history: HistoryAcceptance = DEFAULT_HISTORY
    """What the rows of history and hybrid steps gain (``sim/drafters.py``; learned steps use
    :attr:`accepted_length`)."""

    def __post_init__(self) -> None:
        for name in ("rollout_workers", "gpus_per_worker", "prompts", "group", "max_running",
                     "trainer_replicas"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 1")
        if self.prompt_tokens < 0 or (self.weight_sync_s or 0.0) < 0:
            raise ValueError(
                f"prompt_tokens={self.prompt_tokens}, weight_sync_s={self.weight_sync_s}: "
                "must be >= 0"
            )
        if not self.accepted_length >= 1.0:
            raise ValueError(
                f"accepted_length={self.accepted_length!r}: must be >= 1 (accepted drafts + "
                "the bonus token; 1 means every draft is rejected)"
            )

    def baseline(self) -> JobShape:
        """The same job without speculative decoding and without harvest."""
        return dataclasses.replace(
            self,
            speculative=dataclasses.replace(self.speculative, enabled=False),
            harvest=dataclasses.replace(self.harvest, enabled=False),
        )


@dataclass(frozen=True)
class StepResult:
    """One simulated step (seconds; GPU-seconds are rollout-worker GPUs)."""

    source: str
    """The profile's source (``measured`` or ``roofline``): print it with every figure."""
    step_s: float
    """Rollout + trainer + weight sync + drafter merge."""
    rollout_s: float
    """Dispatch to the last answer."""
    first_done_s: float
    """When the first worker ran dry (start of the tail)."""
    tail_s: float
    """First worker done -> last worker done."""
    trainer_s: float
    """The policy update."""
    weight_sync_s: float
    """Publishing the weights."""
    merge_s: float
    """Merging the drafter candidates of the harvested workers after the update."""
    idle_gpu_s: float
    """GPU-seconds rollout workers spent without answers while others generated."""
    harvested_gpu_s: float
    """Of those, GPU-seconds spent training the drafter."""
    drafter_train_tokens: float
    """Drafter training tokens the harvested time buys (profile rate x harvested seconds)."""
    response_tokens: int
    """Response tokens generated."""
    preempted: int
    """Answers preempted by a full KV cache (and prefilled again later)."""
    workers: list[WorkerRun]
    """Per-worker outcomes."""
    segments: list[Segment]
    """Every worker's timeline, idle and harvest included (for a plot)."""


def _tail_segments(
    run: WorkerRun, rollout_s: float, harvest: HarvestSpec
) -> tuple[list[Segment], float, float]:
    """Idle/harvest segments of a worker after it ran dry; (segments, idle s, harvested s)."""
    idle = rollout_s - run.done_s
    if idle <= 0:
        return [], 0.0, 0.0
    name = f"rollout-{run.worker}"
    view = WorkerView(name, "rollout", "rollout", idle_seconds=idle, pending_work=False)
    harvested = decide(harvest, True, [view]).get(name) == DRAFTER_TRAIN
    if not harvested:
        return [Segment(run.worker, run.done_s, rollout_s, "idle")], idle, 0.0
    start = run.done_s + harvest.idle_seconds
    segs = [Segment(run.worker, run.done_s, start, "idle")] if start > run.done_s else []
    segs.append(Segment(run.worker, start, rollout_s, "harvest"))
    return segs, idle, rollout_s - start


def simulate_step(
    shape: JobShape,
    lengths: Sequence[int],
    profile: EngineProfile,
    accepted: Sequence[float] | None = None,
    prompts: Sequence[int] | None = None,
    first: bool = False,
    merges: int | None = None,
) -> StepResult:
    """Simulate one step; ``lengths``: response tokens of the ``prompts x group`` answers, in
    request order (the answers of prompt i are ``lengths[i*group:(i+1)*group]``);
    ``accepted``: each answer's own accepted length, in the same order (default: the shape's);
    ``prompts``: each prompt's length, in order (default: the shape's ``prompt_tokens``);
    ``first``: the run's first step (it pays the warm-ups); ``merges``: drafter candidates
    merged after the update (default: one per harvested worker)."""
    n = shape.prompts * shape.group
    if len(lengths) != n:
        raise ValueError(
            f"got {len(lengths)} response lengths for prompts x group = {shape.prompts} x "
            f"{shape.group} = {n} answers: give one length per answer"
        )
    if any(x < 1 for x in lengths):
        raise ValueError(f"response lengths must be >= 1 token, got min {min(lengths)}")
    if accepted is not None and (len(accepted) != n or min(accepted) < 1.0):
        raise ValueError(f"accepted lengths: give {n}, each >= 1 (accepted drafts + 1)")
    if prompts is not None and (len(prompts) != shape.prompts or min(prompts) < 0):
        raise ValueError(f"prompt lengths: give {shape.prompts} (one per prompt), each >= 0")
    per_answer = [shape.prompt_tokens] * n if prompts is None else [
        prompts[i // shape.group] for i in range(n)
    ]  # fmt: skip
    latency = LatencyModel(profile)
    extra = profile.overheads
    overhead = CallOverhead() if extra is None else CallOverhead(
        call_s=extra.call_s, step_s=extra.engine_step_s,
        warmup_s=extra.engine_warmup_s if first else 0.0,
    )  # fmt: skip
    runs = [
        simulate_worker(
            w,
            [lengths[i] for i in shard],
            latency,
            shape.speculative,
            max_running=shape.max_running,
            prompts=[per_answer[i] for i in shard],
            accepted_length=shape.accepted_length,
            kv_tokens=profile.kv_cache_tokens,
            accepted=None if accepted is None else [accepted[i] for i in shard],
            padded=profile.padded_context,
            overhead=overhead,
            history=shape.history,
        )
        for w, shard in enumerate(shard_round_robin(n, shape.rollout_workers, shape.group))
    ]
    rollout_s = max(r.done_s for r in runs)
    first_done_s = min(r.done_s for r in runs)
    segments: list[Segment] = []
    idle_s = harvested_s = 0.0
    harvested_workers = 0
    for r in runs:
        tail, idle, harvested = _tail_segments(r, rollout_s, shape.harvest)
        segments += r.segments + tail
        idle_s += idle
        harvested_s += harvested
        harvested_workers += harvested > 0
    tokens = sum(r.tokens for r in runs)
    update_tokens = tokens + sum(per_answer)  # every sequence's prompt goes through too
    trainer_s = update_tokens * profile.trainer_seconds_per_token / shape.trainer_replicas
    if first and extra is not None:
        trainer_s += extra.trainer_warmup_s
    sync_s = profile.weight_sync_s if shape.weight_sync_s is None else shape.weight_sync_s
    candidates = harvested_workers if merges is None else merges
    merge_s = 0.0
    if candidates and extra is not None:
        merge_s = extra.merge_s + (candidates - 1) * extra.merge_candidate_s
    return StepResult(
        source=profile.source,
        step_s=rollout_s + trainer_s + sync_s + merge_s,
        rollout_s=rollout_s,
        first_done_s=first_done_s,
        tail_s=rollout_s - first_done_s,
        trainer_s=trainer_s,
        weight_sync_s=sync_s,
        merge_s=merge_s,
        idle_gpu_s=idle_s * shape.gpus_per_worker,
        harvested_gpu_s=harvested_s * shape.gpus_per_worker,
        drafter_train_tokens=harvested_s * profile.drafter_train_tokens_per_s,
        response_tokens=tokens,
        preempted=sum(r.preempted for r in runs),
        workers=runs,
        segments=segments,
    )


def compare(
    shape: JobShape,
    lengths: Sequence[int],
    profile: EngineProfile,
    accepted: Sequence[float] | None = None,
    prompts: Sequence[int] | None = None,
    first: bool = False,
    merges: int | None = None,
) -> tuple[StepResult, StepResult]:
    """(baseline, Longtail): the same step without and with SD + harvest (``accepted``: per
    answer, ``prompts``: per prompt, ``first``: a run's first step, ``merges``: the Longtail
    arm's merged drafter candidates, see :func:`simulate_step`)."""
    return (
        simulate_step(shape.baseline(), lengths, profile, prompts=prompts, first=first),
        simulate_step(shape, lengths, profile, accepted, prompts, first, merges),
    )
