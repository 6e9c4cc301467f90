"""The merge of one window's drafter candidates: checks, gate, token-weighted averaging.

Called by :meth:`longtail_workers.drafter.registry.DrafterRegistry.merge_candidates` at the step
boundary, when every harvested worker has submitted the drafter it trained from the same
published version ``d``: :class:`MergeWindow` checks each candidate (``vetting.py``), lets the
trainer's :class:`~.candidates.MergeGate` weigh and judge them, averages the admitted ones
(:func:`merge_state_dicts`) and judges the merge; every candidate or merge it refuses goes to
the registry's ``refuse`` (``refusals.py``); the registry publishes what it returns. The merged
version ``d+1`` is::

    theta_{d+1} = sum_i n_i * theta_i / sum_i n_i        (n_i = worker i's tokens)

where ``n_i`` is, at the trainer, the smaller of the pairs worker ``i`` says it trained on and
the answer tokens the trainer handed out in that window (``trainer/candidate_checks.py``): a
worker's self-report alone never sets its weight.

over the trainable weights only (``fc`` and the decoder layer; the shared embedding and LM head
are never part of a drafter checkpoint, so a merge can never touch them).

Why averaging is acceptable here: every candidate starts from the same weights ``theta_d``,
takes at most ``max_steps_per_window`` small AdamW steps, on rollouts of the same policy (the
same data distribution). The candidates therefore stay in a small neighbourhood of ``theta_d``
where the loss is close to linear, and the average of the weights is the average of the
updates: one round of local-SGD/FedAvg, which behaves like a larger-batch step; weighting by
tokens gives each worker's data its share, as one big batch would.

Limits: the argument weakens as windows get long (many steps, high learning rate), because the
candidates drift apart and the loss between them is no longer flat, so the average can be worse
than each part. Workers that trained on different policy versions, or from different base
versions, must not be merged (the registry refuses the latter). Optimizer moments are not
merged: each worker keeps its own, which then belong to slightly different weights. Held-out
accuracy of the merge is not the average of the parts: the trainer measures it on its own
held-out sample and refuses to publish a merge that scores below the current version (without
the trainer's checks the registry records the token-weighted mean of the candidates' numbers
and marks it an estimate in the version's metadata).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn

from longtail_workers.drafter.candidates import Admitted, MergeGate, StoredCandidate
from longtail_workers.drafter.checkpoint import DrafterMismatchError, load_drafter
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.refusals import Refusal
from longtail_workers.drafter.vetting import (
    CandidateRejected,
    DrafterReference,
    check_candidate_dir,
    check_finite,
)


def merge_state_dicts(
    parts: Sequence[tuple[Mapping[str, torch.Tensor], int]],
) -> dict[str, torch.Tensor]:
    """Token-weighted average of ``[(state_dict, tokens), ...]`` (see the module text).

    Computed in float64 and cast back to each tensor's dtype. Parts with 0 tokens get weight 0.
    Raises ``ValueError`` when there is nothing to merge or the state dicts do not match.
    """
    if not parts:
        raise ValueError("merge_state_dicts: no candidates to merge")
    bad = [n for _, n in parts if n < 0]
    if bad:
        raise ValueError(f"merge_state_dicts: token counts must be >= 0, got {bad}")
    total = sum(n for _, n in parts)
    if total == 0:
        raise ValueError(
            "merge_state_dicts: every candidate trained on 0 tokens; nothing to merge "
            "(publish the base version again instead)"
        )
    first = parts[0][0]
    for i, (state, _) in enumerate(parts[1:], start=1):
        if set(state) != set(first):
            diff = sorted(set(state) ^ set(first))
            raise ValueError(f"merge_state_dicts: candidate {i} has different weights: {diff}")
        shapes = [k for k in first if state[k].shape != first[k].shape]
        if shapes:
            raise ValueError(f"merge_state_dicts: candidate {i} has other shapes for {shapes}")
    merged = {}
    for key, ref in first.items():
        acc = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        for state, n in parts:
            if n:
                acc += state[key].to(device=ref.device, dtype=torch.float64) * (n / total)
        merged[key] = acc.to(ref.dtype)
    return merged


@dataclass(frozen=True)
class Merged:
    """A window's merge, ready to publish."""

    drafter: EagleDrafter
    """The token-weighted average of the admitted candidates (finite)."""
    admitted: list[Admitted]
    heldout_top1: float | None
    """The trainer's score of the merge, else the candidates' token-weighted own numbers."""
    estimate: bool
    """``heldout_top1`` is the candidates' numbers, not a measurement of the merge."""


@dataclass(frozen=True)
class MergeWindow:
    """The merge of the candidates trained from ``base`` (see the module text)."""

    base: int | None
    target: nn.Module
    target_id: str
    reference: DrafterReference | None
    """The job's drafter (None: the first loadable candidate stands for it)."""
    refuse: Callable[[Refusal], None]

    def merge(
        self,
        found: list[StoredCandidate],
        gate: MergeGate | None,
        current: Callable[[], EagleDrafter | None],
    ) -> Merged | None:
        """Merge ``found`` (each worker's newest candidate); None when nothing may be published.
        ``current``: the version the candidates must not draft worse than (loaded only for a
        ``gate``). Without a gate the self-reported tokens weigh the candidates and
        ``heldout_top1`` is their weighted mean."""
        usable = self._usable(found)
        if not usable:
            return None
        merged = load_drafter(usable[0][0].path, self.target, target_id=self.target_id)
        now = None
        if gate is not None:
            now = current()
            admitted, refused = gate.admit(self.base, usable, merged, now)
            for refusal in refused:
                self.refuse(refusal)
        else:
            admitted = [Admitted(c, w, c.tokens, c.heldout_top1) for c, w in usable]
        if not admitted:
            return None
        workers, n = "+".join(a.candidate.worker for a in admitted), len(admitted)
        merged.load_state_dict(merge_state_dicts([(a.weights, a.tokens) for a in admitted]))
        try:
            check_finite(merged.trainable_state_dict(), f"merge of base {self.base}")
        except CandidateRejected as exc:
            self.refuse(Refusal("merge", "malformed", workers, str(exc), n))
            return None
        heldout = weighted_mean([(a.heldout_top1, a.tokens) for a in admitted])
        estimate = n > 1
        if gate is not None:
            score, worse = gate.judge_merge(merged, now)
            if worse is not None:
                self.refuse(replace(worse, worker=workers, candidates=n))
                return None
            if score is not None:
                heldout, estimate = score, False
        return Merged(merged, admitted, heldout, estimate)

    def _usable(self, cands: list[StoredCandidate]) -> list[tuple[StoredCandidate, dict[str, Any]]]:
        """``(candidate, weights)`` of every candidate that trained and passes the checks."""
        reference, usable = self.reference, []
        for cand in cands:
            source = f"candidate {cand.id} (base {cand.base_version})"
            if cand.tokens == 0:
                why = f"{source} says tokens=0: trained on nothing, it has no weight in a merge"
                self.refuse(Refusal("merge", "empty", cand.worker, why))
                continue
            try:
                if reference is None:  # the first loadable candidate stands for the job's drafter
                    found = load_drafter(cand.path, self.target, target_id=self.target_id)
                    reference = DrafterReference.of(found)
                usable.append((cand, check_candidate_dir(cand.path, reference, source)))
            except (DrafterMismatchError, SafetensorError, OSError) as exc:
                self.refuse(Refusal("merge", "malformed", cand.worker, str(exc)))
        return usable


def weighted_mean(values: list[tuple[float | None, int]]) -> float | None:
    """Token-weighted mean of the known values (None: none known)."""
    known = [(v, n) for v, n in values if v is not None and n > 0]
    total = sum(n for _, n in known)
    return sum(v * n for v, n in known) / total if total else None
