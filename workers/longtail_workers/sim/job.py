"""From an RLJob spec and a length model to the simulator's inputs (:class:`JobShape`, lengths).

Called by ``longtail simulate`` (and the docs' projections). Two pieces:

* :func:`shape_from_job`: the job's rollout workers, GPUs, prompts x group, SD policy, harvest and
  trainer world, plus the inputs a spec does not hold (running batch, prompt length, accepted
  length, weight-sync seconds). Strategies the engine cannot run (tree drafting: ``verifyTokens``
  differs from ``draftDepth``, which ``SpecDecodePolicy`` rejects) are dropped, with a note.
  ``drafter`` projects the job with every strategy drafted by one kind (``longtail simulate
  --drafter``); without it the strategies' own kinds are simulated.
* :func:`lognormal_lengths`: a parametric long tail: each prompt group draws a log-normal
  difficulty and each answer a log-normal length around it (half of the log-variance each), with
  the overall p99/median set by ``p99_ratio``; lengths are capped at ``max_new_tokens`` and the
  longest ``cap_fraction`` of answers are set to the cap (public reasoning-RL runs report 1-5%
  truncated). Seeded, so a run repeats. :func:`parse_lengths` reads
  ``lognormal:median=M,p99_ratio=R,cap_fraction=F[,seed=S]`` into a :class:`LognormalModel`
  (the lengths of a finished run are read by ``sim/runs.py``).
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

from longtail_api.policies import DrafterKind
from longtail_api.spec import RLJobSpec
from longtail_workers.sim.drafters import DEFAULT_HISTORY, HistoryAcceptance
from longtail_workers.sim.step import JobShape

Z99 = 2.3263478740408408
"""The standard normal's 99th percentile: log(p99/median) = Z99 x sigma."""


def shape_from_job(
    spec: RLJobSpec,
    *,
    max_running: int,
    prompt_tokens: int,
    accepted_length: float,
    weight_sync_s: float | None = None,
    drafter: DrafterKind | None = None,
    history: HistoryAcceptance = DEFAULT_HISTORY,
) -> tuple[JobShape, list[str]]:
    """The job's :class:`JobShape` and notes on what was adapted. Trainer replicas are the
    trainer's GPUs (replicas x GPUs per pod; pods on CPU), as a roofline profile's trainer
    seconds per token are for one GPU. ``drafter``: every strategy drafted by this kind instead
    of its own; ``history``: what history and hybrid steps' rows gain."""
    notes: list[str] = []
    sd = spec.speculative
    if drafter is not None and any(s.drafter != drafter for s in sd.strategies):
        notes.append(f"every strategy drafted by {drafter} (--drafter), not the job's own")
        sd = dataclasses.replace(
            sd, strategies=[dataclasses.replace(s, drafter=drafter) for s in sd.strategies]
        )
    if spec.rollout.engine == "vllm" and any(s.drafter != "learned" for s in sd.strategies):
        notes.append(
            "the job's rollout engine is vllm, which drafts with the learned drafter only "
            "(docs/vllm.md): history and hybrid steps are projected as the torch engine runs them"
        )
    chain = [s for s in sd.strategies if s.verify_tokens in (None, s.draft_depth)]
    if len(chain) < len(sd.strategies):
        dropped = [s.draft_depth for s in sd.strategies if s not in chain]
        notes.append(f"dropped tree-drafting strategies (draftDepth {dropped}): chain only")
        if not chain:
            raise ValueError("speculative.strategies: no chain strategy left to simulate")
        sd = dataclasses.replace(sd, strategies=chain, selector=dataclasses.replace(
            sd.selector, fixed_index=min(sd.selector.fixed_index, len(chain) - 1)))  # fmt: skip
    shape = JobShape(
        rollout_workers=spec.rollout.replicas,
        gpus_per_worker=max(1, spec.rollout.resources.gpus),
        prompts=spec.algorithm.prompts_per_step,
        group=spec.algorithm.group_size,
        max_running=max_running,
        prompt_tokens=prompt_tokens,
        speculative=sd,
        harvest=spec.harvest,
        accepted_length=accepted_length,
        trainer_replicas=spec.trainer.replicas * max(1, spec.trainer.resources.gpus),
        weight_sync_s=weight_sync_s,
        history=history,
    )
    return shape, notes


def lognormal_lengths(
    prompts: int,
    group: int,
    *,
    median: float,
    p99_ratio: float,
    cap: int,
    cap_fraction: float,
    seed: int = 0,
) -> list[int]:
    """``prompts x group`` response lengths in request order (see the module text)."""
    if median < 1 or p99_ratio <= 1 or not 0 <= cap_fraction < 1 or cap < 1:
        raise ValueError(
            f"lognormal lengths: median={median} (>= 1), p99_ratio={p99_ratio} (> 1), "
            f"cap_fraction={cap_fraction} (0 <= f < 1), cap={cap} (>= 1)"
        )
    sigma = math.log(p99_ratio) / Z99
    part = sigma / math.sqrt(2.0)  # half of the log-variance per group, half per answer
    rng = random.Random(seed)
    lengths: list[int] = []
    for _ in range(prompts):
        group_median = median * math.exp(rng.gauss(0.0, part))
        lengths += [
            min(cap, max(1, round(group_median * math.exp(rng.gauss(0.0, part)))))
            for _ in range(group)
        ]
    n_cap = math.ceil(cap_fraction * len(lengths))
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i])[:n_cap]:
        lengths[i] = cap
    return lengths


@dataclass(frozen=True)
class LognormalModel:
    """The parametric long tail of :func:`lognormal_lengths`, as ``--lengths`` gives it."""

    median: float
    """Median response length, tokens."""
    p99_ratio: float
    """p99 / median of the lengths (public reasoning-RL runs: about 10)."""
    cap: int
    """``maxNewTokens``: no answer is longer."""
    cap_fraction: float
    """Share of answers set to the cap (truncated)."""
    seed: int = 0
    """Seed of the draw."""

    def lengths(self, prompts: int, group: int) -> list[int]:
        """``prompts x group`` lengths in request order."""
        return lognormal_lengths(prompts, group, median=self.median, p99_ratio=self.p99_ratio,
                                 cap=self.cap, cap_fraction=self.cap_fraction,
                                 seed=self.seed)  # fmt: skip


def parse_lengths(text: str, cap: int) -> LognormalModel:
    """``lognormal:median=M,p99_ratio=R,cap_fraction=F[,seed=S]`` -> the length model."""
    kind, _, args = text.partition(":")
    if kind != "lognormal":
        raise ValueError(
            f"--lengths {text!r}: expected lognormal:median=...,p99_ratio=... or run:DIR"
        )
    try:
        kv = {k.strip(): float(v) for k, v in (a.split("=", 1) for a in args.split(",") if a)}
    except ValueError as exc:
        raise ValueError(f"--lengths {text!r}: write key=number pairs ({exc})") from exc
    unknown = set(kv) - {"median", "p99_ratio", "cap_fraction", "seed"}
    if unknown or "median" not in kv:
        raise ValueError(
            f"--lengths {text!r}: need median=; known keys: median, p99_ratio, cap_fraction, seed"
        )
    model = LognormalModel(
        median=kv["median"],
        p99_ratio=kv.get("p99_ratio", 10.0),
        cap=cap,
        cap_fraction=kv.get("cap_fraction", 0.02),
        seed=int(kv.get("seed", 0)),
    )
    model.lengths(1, 1)  # check the values now, with the message naming them
    return model
