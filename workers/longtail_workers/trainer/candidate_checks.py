"""The trainer's own checks of drafter candidates at the merge: verified weights, held-out scores.

A candidate's ``tokens`` and ``heldout_top1`` are what its worker says (``CandidateInfo``); a
buggy or forged worker can say anything (issue #32: a useless drafter with ``tokens=1e9`` was
merged at ~100% weight). :class:`CandidateChecks` is the :class:`~.registry.MergeGate` the step
driver (``driver.py``) passes to ``DrafterRegistry.merge_candidates``; it trusts only what the
trainer can check:

- weight: ``min(self-reported tokens, verified tokens)``. :class:`WindowLedger` counts the answer
  tokens the trainer handed out while each drafter version was the latest (the window of the
  candidates trained from it): per rollout worker, the output tokens of the answers it returned
  (its capture is its training data); for every other worker (the trainer's own harvest,
  ``trainer``, and the dedicated drafter workers, which train on the answers of completed steps),
  the output tokens of the steps completed in that window. A candidate with no verified token
  is refused.
- score: :class:`HeldoutSample` keeps the hidden states of a sample of the last step's answers
  under the policy just trained (what the next rollout drafts against; at most ``max_pairs``
  pairs, spread over the prompts) and scores drafters with the spot trainer's top-1 metric
  (``spot/windows.top1_over``). A candidate, and the merge, are refused when they score below the
  current version on it, by the rule of the workers' own quality gate
  (``spot/trainer.WindowVerdict``: judged from 256 pairs on). The merge's score is the published
  ``heldout_top1`` (no longer an estimate).

The sample is not strictly held out: a rollout worker may have trained on some of these answers
(with the previous policy's hidden states). That favours the candidates a little over the current
version; a useless candidate still scores far below it. A sharded trainer cannot run the policy's
forward pass from rank 0 alone, so it weighs candidates by verified tokens only (no sample).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from longtail_api.policies import DrafterTrainingSpec
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.registry import Admitted, Refusal, StoredCandidate
from longtail_workers.engine.interface import GenerationResult
from longtail_workers.engine.target import response_states
from longtail_workers.spot.buffer import captured_from_result
from longtail_workers.spot.sequences import SampleTokens
from longtail_workers.spot.trainer import WindowVerdict
from longtail_workers.spot.windows import Window, top1_over, windows_of
from longtail_workers.wire.rollout import GenerateReply

log = logging.getLogger(__name__)


@dataclass
class _Window:
    """What the trainer handed out while one drafter version was the latest."""

    by_worker: dict[str, int] = field(default_factory=dict)
    """Output tokens each rollout worker generated."""
    served: int = 0
    """Output tokens of the steps completed (the data of sample-trained windows)."""


class WindowLedger:
    """Tokens handed out per drafter version (see the module text); thread-safe."""

    def __init__(self, keep_versions: int = 4) -> None:
        self.keep_versions = keep_versions
        self._windows: OrderedDict[int | None, _Window] = OrderedDict()
        self._rollout_workers: set[str] = set()
        self._lock = threading.Lock()

    def _window(self, base: int | None) -> _Window:
        """Call under the lock."""
        if base not in self._windows:
            self._windows[base] = _Window()
            while len(self._windows) > self.keep_versions:
                self._windows.popitem(last=False)
        return self._windows[base]

    def record_rollout(self, base: int | None, replies: Sequence[GenerateReply]) -> None:
        """A rollout (or eval) while ``base`` was the latest: each reply's worker generated it."""
        with self._lock:
            window = self._window(base)
            for reply in replies:
                tokens = sum(len(s.output_token_ids) for s in reply.samples)
                window.by_worker[reply.worker] = window.by_worker.get(reply.worker, 0) + tokens
                self._rollout_workers.add(reply.worker)

    def record_step(self, base: int | None, samples: Sequence[SampleTokens]) -> None:
        """A step's answers, the data of windows trained from ``base`` (the latest after the
        step's merge) by the trainer's harvest and the drafter workers."""
        with self._lock:
            self._window(base).served += sum(len(s.output_token_ids) for s in samples)

    def verified(self, base: int | None, worker: str) -> tuple[int, str]:
        """The tokens the trainer can vouch for ``worker``'s window from ``base``, and what they
        are (for log lines and refusals)."""
        name = "the initial drafter" if base is None else f"version {base}"
        with self._lock:
            window = self._windows.get(base, _Window())
            if worker in self._rollout_workers:
                return window.by_worker.get(worker, 0), (
                    f"answer tokens {worker} generated while {name} was the latest"
                )
            return (
                window.served,
                f"answer tokens of the steps completed while {name} was the latest",
            )


class HeldoutSample:
    """Hidden states of a sample of answers under the current policy; scores drafters on it."""

    def __init__(
        self, training: DrafterTrainingSpec, *, max_pairs: int = 4096, batch: int = 8
    ) -> None:
        if max_pairs < 1 or batch < 1:
            raise ValueError(f"max_pairs={max_pairs}, batch={batch}; both must be >= 1")
        self.window_tokens = training.window_tokens
        self.pack_tokens = 2 * training.window_tokens  # the spot trainer's default packing
        self.max_pairs, self.batch = max_pairs, batch
        self.windows: list[Window] = []
        self.pairs = 0
        """Pairs in the sample (0: nothing to score on yet)."""

    def refresh(
        self, model: torch.nn.Module, samples: Sequence[SampleTokens], policy_version: int
    ) -> int:
        """Replace the sample with answers of ``samples`` (spread over the prompts: the i-th
        answer of every prompt before the (i+1)-th), their states computed with ``model``
        (no grad); returns its pairs."""
        picked: list[tuple[Sequence[int], Sequence[int]]] = []
        pairs = 0
        for s in sorted(samples, key=_answer_index):
            if len(s.output_token_ids) >= 2 and len(s.prompt_token_ids) >= 1:
                if pairs >= self.max_pairs:
                    break
                picked.append((s.prompt_token_ids, s.output_token_ids))
                pairs += len(s.output_token_ids) - 1
        seqs = []
        for lo in range(0, len(picked), self.batch):
            part = picked[lo : lo + self.batch]
            states = response_states(model, part)
            for (prompt, output), hidden in zip(part, states, strict=True):
                result = GenerationResult(None, list(prompt), list(output), [], "stop", hidden)
                seq = captured_from_result(result, policy_version=policy_version, step=0)
                if seq is not None:
                    seqs.append(seq)
        self.windows = windows_of(seqs, self.window_tokens)
        self.pairs = sum(w.num_pairs for w in self.windows)
        return self.pairs

    def score(self, drafter: EagleDrafter) -> tuple[float | None, int]:
        """``(top-1, pairs)`` of ``drafter`` on the sample (None: no sample)."""
        was_training = drafter.training
        drafter.eval()
        try:
            device = drafter.fc.weight.device
            return top1_over(drafter, self.windows, self.pack_tokens, device)
        finally:
            drafter.train(was_training)


def _answer_index(sample: SampleTokens) -> tuple[int, str]:
    """Sort key spreading a step's answers over its prompts (request ids ``sS-pP-gG``)."""
    rid = sample.request_id or ""
    group = rid.rpartition("-g")[2]
    return (int(group) if group.isdigit() else 0, rid)


@dataclass(frozen=True)
class _Judged:
    """Scores one merge's :meth:`CandidateChecks.admit` computed, for its ``judge_merge``."""

    current: EagleDrafter | None
    """The current version it scored."""
    current_top1: float | None
    """Its held-out top-1."""
    pairs: int
    """Pairs of the sample."""
    lone: float | None = None
    """The score of the only candidate admitted (None: none, or several)."""


class CandidateChecks:
    """The trainer's :class:`~.registry.MergeGate` (see the module text)."""

    def __init__(
        self,
        ledger: WindowLedger,
        sample: HeldoutSample | None,
        initial: EagleDrafter | None = None,
    ) -> None:
        self.ledger = ledger
        """Tokens handed out per drafter version: the candidates' verified weights."""
        self.sample = sample
        """The held-out sample (None: a sharded trainer, candidates are not scored)."""
        self.initial = initial
        """The job's initial drafter: the current version before the first publish."""
        self._pending: Callable[[], object] | None = None
        self._judged: _Judged | None = None
        """What the last :meth:`admit` scored."""

    def refresh_when_needed(self, refresh: Callable[[], object]) -> None:
        """Keep ``refresh`` (which rebuilds :attr:`sample` from the step just trained) and run
        it the first time a candidate is scored; a later call replaces it unrun. The sample is
        a forward pass of the policy over up to ``max_pairs`` answer tokens, a quarter of a
        small model's step on CPU (docs/performance.md), and most steps of a job without
        harvest bring no candidate to score."""
        self._pending = refresh

    def initial_drafter(self) -> EagleDrafter | None:
        return self.initial

    def admit(
        self,
        base: int | None,
        usable: Sequence[tuple[StoredCandidate, dict[str, torch.Tensor]]],
        scratch: EagleDrafter,
        current: EagleDrafter | None,
    ) -> tuple[list[Admitted], list[Refusal]]:
        """Verified weight and held-out score of each candidate; refuse those with no verified
        token or scoring below ``current``."""
        base_top1, pairs = self._score(current)
        self._judged = _Judged(current, base_top1, pairs)
        admitted: list[Admitted] = []
        refused: list[Refusal] = []
        for cand, weights in usable:
            verified, what = self.ledger.verified(base, cand.worker)
            tokens = min(cand.tokens, verified)
            if tokens <= 0:
                refused.append(Refusal("merge", "unverified", cand.worker, (
                    f"candidate {cand.id} claims {cand.tokens} tokens, but the trainer "
                    f"counts 0 {what}; it has nothing the trainer can weigh it by"
                )))  # fmt: skip
                continue
            scratch.load_state_dict(weights)
            top1, _ = self._score(scratch)
            if not WindowVerdict(top1, base_top1, pairs).keep:
                assert top1 is not None and base_top1 is not None  # a refusal has both scores
                refused.append(Refusal("merge", "worse", cand.worker, (
                    f"candidate {cand.id} scores held-out top-1 {top1:.3f} on the "
                    f"trainer's sample ({pairs} pairs), below {base_top1:.3f} of the current "
                    f"version ({_version_name(base)}); merging it would make drafting worse; "
                    "dropped, never scored again"
                ), top1=top1, bar=base_top1))  # fmt: skip
                continue
            if tokens < cand.tokens:
                log.info("drafter candidate of %s claims %d tokens, weighed by the %d %s",
                         cand.worker, cand.tokens, tokens, what)  # fmt: skip
            admitted.append(Admitted(cand, weights, tokens, top1))
        if len(admitted) == 1:  # the merge of one candidate is its weights, bit for bit
            self._judged = _Judged(current, base_top1, pairs, admitted[0].heldout_top1)
        return admitted, refused

    def judge_merge(
        self, merged: EagleDrafter, current: EagleDrafter | None
    ) -> tuple[float | None, Refusal | None]:
        """The merge's held-out score, and a refusal when it scores below ``current``. Scores
        :meth:`admit` just computed are reused (the current version's; a lone candidate's,
        whose merge is its own weights: the token-weighted average of one state dict, computed
        in float64, casts back to the same values), so that a merge scores each drafter once."""
        judged, self._judged = self._judged, None
        if judged is None or judged.current is not current:
            judged = _Judged(current, *self._score(current))
        top1, pairs = judged.lone, judged.pairs
        if top1 is None:
            top1, pairs = self._score(merged)
        base_top1 = judged.current_top1
        if not WindowVerdict(top1, base_top1, pairs).keep:
            assert top1 is not None and base_top1 is not None  # a refusal has both scores
            return top1, Refusal("merge", "worse", "", (
                f"the merge scores held-out top-1 {top1:.3f} on the trainer's sample ({pairs} "
                f"pairs), below {base_top1:.3f} of the current version; not published, the "
                "workers keep drafting with the current version"
            ), top1=top1, bar=base_top1)  # fmt: skip
        return top1, None

    def _score(self, drafter: EagleDrafter | None) -> tuple[float | None, int]:
        if drafter is None or self.sample is None:
            return None, 0
        refresh, self._pending = self._pending, None
        if refresh is not None:
            refresh()
        return self.sample.score(drafter)


def _version_name(base: int | None) -> str:
    return "the initial drafter" if base is None else f"version {base}"
