"""The history drafter's side of a speculative step: host proposals into a static buffer.

Used by :class:`~longtail_workers.engine.native.torch_engine.TorchEngine` for ``history`` and
``hybrid`` strategies. Before the step the host asks the :class:`HistoryIndex` for every live
row's proposal (from the committed tokens the engine copied back after the previous step: no
device read), pads it to the step's depth ``k`` by repeating its last token (a padded draft is a
guess like any other, verified losslessly, just rarely accepted), and copies the ``[n, k]``
drafts and a per-row flag into a static device buffer in one host->device copy (from pinned
memory on CUDA, non-blocking: the step gains no synchronisation; the next write to the pinned
buffer comes after the step's results were copied back, so after this copy finished).

The step functions read the buffer, so they can be captured (``graphs.py``):
:func:`speculate_history` verifies the proposals with no drafter forward at all (the learned
drafter's cache falls behind and is caught up by the next learned step, ``specdec.py``); a
``hybrid`` step (:meth:`SpeculativeDecoder.speculate`) drafts with the learned drafter and
takes the history's tokens for the rows whose flag is set (a match of at least
``speculative.history.hybridMinMatch`` tokens).
"""

from __future__ import annotations

import torch

from longtail_workers.engine.native.batch import SequenceState
from longtail_workers.engine.native.history import HistoryIndex
from longtail_workers.engine.native.rows import RowState
from longtail_workers.engine.native.steps import StepOutput, StepShape
from longtail_workers.engine.native.verify import verify
from longtail_workers.engine.rejection import AcceptanceRule
from longtail_workers.engine.target import TargetModel


class HistoryDrafts:
    """The static ``[R, K]`` draft buffer of history proposals (see the module text)."""

    def __init__(self, capacity: int, depth: int, device: torch.device) -> None:
        self.depth = depth
        # Columns 0..K-1: drafts; column K: 1 where the row drafts from history.
        self.buffer = torch.zeros(capacity, depth + 1, dtype=torch.long, device=device)  # [R, K+1]
        pin = device.type == "cuda"
        self._host = torch.zeros(capacity, depth + 1, dtype=torch.long, pin_memory=pin)

    def stage(
        self, index: HistoryIndex, seqs: list[SequenceState], k: int, min_match: int
    ) -> list[bool]:
        """Fill rows ``[0, len(seqs))`` with their proposals of depth ``k``; per row, whether
        its match reached ``min_match`` (the rows a hybrid step drafts from history)."""
        host = self._host.numpy()  # [R, K+1] view
        used: list[bool] = []
        for b, seq in enumerate(seqs):
            assert seq.history is not None, "admitted without a history answer"
            tokens, match = index.propose(seq.history, k)
            use = match >= min_match and match > 0
            fill = tokens[-1] if tokens else seq.output[-1]
            host[b, :k] = tokens + [fill] * (k - len(tokens))
            host[b, self.depth] = use
            used.append(use)
        n = len(seqs)
        self.buffer[:n].copy_(self._host[:n], non_blocking=True)
        return used

    def view(self, bucket: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(drafts [B, k], use [B] bool)`` of rows ``[0, bucket)`` (views: capturable)."""
        return self.buffer[:bucket, :k], self.buffer[:bucket, self.depth] > 0


@torch.no_grad()
def speculate_history(
    target: TargetModel,
    rows: RowState,
    drafts: HistoryDrafts,
    bucket: int,
    k: int,
    shape: StepShape,
    rule: AcceptanceRule,
) -> StepOutput:
    """One speculative step of rows ``[0, bucket)`` verifying the staged history drafts
    (deterministic: ``q`` one-hot). No drafter runs; capturable."""
    return verify(target, rows, drafts.view(bucket, k)[0], None, shape, rule)
