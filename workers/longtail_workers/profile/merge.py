"""The trainer's drafter merge after an update, timed through the real registry and checks.

Called by :mod:`longtail_workers.profile.main`. In a step whose rollout workers trained the
drafter in the tail, the trainer merges their candidates after the policy update
(``trainer/driver.py``'s ``_merge_drafters``): it computes the held-out sample (the policy's
forward over up to ``max_pairs`` answer tokens of the step, ``trainer/candidate_checks.py``),
scores the current version, every candidate and the merge on it, averages the weights and
publishes the new version (files written, fsynced, renamed). On a small model on CPU that is a
third of a step (docs/performance.md), so the simulator charges it in every step that harvested.

:func:`merge_costs` runs that path on a scratch :class:`~longtail_workers.drafter.registry.
DrafterRegistry`: the profiled drafter published as version 0, candidates of the same weights
(each scores what the current version does, so none is refused and the merge publishes, the
full path), the step's answers of the given lengths with random tokens; after one untimed
merge, with one and with two candidates, median of ``repeats``: the fixed part and the part
each candidate adds.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from longtail_api.policies import DrafterTrainingSpec
from longtail_workers.drafter.candidates import CandidateInfo
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.registry import DrafterRegistry
from longtail_workers.trainer.candidate_checks import CandidateChecks, HeldoutSample, WindowLedger


@dataclass(frozen=True)
class Answer:
    """One answer of the step (``spot.sequences.SampleTokens``)."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]


@dataclass(frozen=True)
class MergeCosts:
    """What :func:`merge_costs` measured (seconds)."""

    merge_s: float
    """A merge of one candidate: the held-out sample, scoring, averaging, publishing."""
    per_candidate_s: float
    """Each further candidate: loading, checking and scoring it."""


def step_answers(
    rows: Sequence[tuple[int, int]], vocab: int, group: int, gen: torch.Generator
) -> list[Answer]:
    """Answers of ``(prompt, response)`` tokens with random ids, ``group`` answers a prompt."""
    out = []
    for i, (p, r) in enumerate(rows):
        ids = torch.randint(0, vocab, (p + r,), generator=gen).tolist()
        out.append(Answer(f"s1-p{i // group}-g{i % group}", ids[:p], ids[p:]))
    return out


def _one_merge(
    model: nn.Module, drafter: EagleDrafter, target_id: str, answers: Sequence[Answer],
    candidates: int, training: DrafterTrainingSpec, scratch: Path,
) -> float:  # fmt: skip
    """Seconds of one merge of ``candidates`` candidates (the sample computed in it)."""
    registry = DrafterRegistry(scratch)
    registry.publish(drafter, policy_version=0)
    ledger = WindowLedger()
    ledger.record_step(0, answers)  # the tokens that vouch for the windows' weights
    sample = HeldoutSample(training)
    checks = CandidateChecks(ledger, sample)
    checks.refresh_when_needed(lambda: sample.refresh(model, answers, policy_version=1))
    for i in range(candidates):
        info = CandidateInfo(f"drafter-{i}", 0, policy_version=1, tokens=1000, steps=10)
        registry.submit_candidate(drafter, info)
    t0 = time.perf_counter()
    published = registry.merge_candidates(model, target_id=target_id, gate=checks)
    seconds = time.perf_counter() - t0
    if published is None:
        raise RuntimeError(
            f"profiling the drafter merge: {candidates} candidate(s) of the current weights were "
            f"refused ({dict(registry.rejected)}); the merge path was not timed"
        )
    return seconds


def merge_costs(
    model: nn.Module,
    drafter: EagleDrafter,
    rows: Sequence[tuple[int, int]],
    repeats: int,
    gen: torch.Generator,
    training: DrafterTrainingSpec | None = None,
    group: int = 8,
) -> MergeCosts:
    """Time the merge of one and of two candidates on a step of ``rows`` answers (module text)."""
    training = training or DrafterTrainingSpec()
    vocab = int(model.get_output_embeddings().out_features)  # type: ignore[operator]
    answers = step_answers(rows, vocab, group, gen)
    target_id = drafter.info.identifier  # the registry checks every candidate against it
    times: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="longtail-profile-merge-") as tmp:
        _one_merge(model, drafter, target_id, answers, 1, training, Path(tmp) / "warm-up")
        for r in range(max(1, repeats)):
            for n in (1, 2):
                times[n].append(_one_merge(model, drafter, target_id, answers, n, training,
                                           Path(tmp) / f"{r}-{n}"))  # fmt: skip
    one, two = statistics.median(times[1]), statistics.median(times[2])
    return MergeCosts(merge_s=one, per_candidate_s=max(0.0, two - one))
