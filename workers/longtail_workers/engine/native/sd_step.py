"""One speculative step of the torch engine's running batch, whatever drafts it.

Called by :class:`~longtail_workers.engine.native.torch_engine.TorchEngine` for the steps the SD
policy marks as speculative, after the history proposals (if the strategy uses them) were staged
(``history_drafts.py``). By the strategy's drafter:

* ``learned``: the learned drafter catches up, drafts and the target verifies (``specdec.py``);
* ``hybrid``: the same, with the history's tokens for the rows whose match was long enough;
* ``history``: the target verifies the staged proposals; the drafter does not run, so its
  cache falls behind, and a later ``learned`` or ``hybrid`` step first catches it up
  (:meth:`SpeculativeDecoder.catch_up` when a row has more pending pairs than one step feeds).

The step function is captured per (drafter, bucket, depth, sampling flags) on CUDA
(``graphs.py``); its results come back in the step's one device->host copy.
"""

from __future__ import annotations

import torch

from longtail_api.policies import DrafterKind
from longtail_workers.engine.native.graphs import StepGraphs
from longtail_workers.engine.native.history_drafts import HistoryDrafts, speculate_history
from longtail_workers.engine.native.rows import RowState
from longtail_workers.engine.native.specdec import DraftObserver, DraftTrace, SpeculativeDecoder
from longtail_workers.engine.native.steps import HostStep, StepOutput, StepShape, pack, unpack
from longtail_workers.engine.rejection import AcceptanceRule
from longtail_workers.engine.target import TargetModel


def speculative_step(
    target: TargetModel,
    rows: RowState,
    graphs: StepGraphs,
    shape: StepShape,
    bucket: int,
    kind: DrafterKind,
    k: int,
    width: int,
    *,
    sd: SpeculativeDecoder | None,
    drafts: HistoryDrafts | None,
    rule: AcceptanceRule,
    observer: DraftObserver | None,
) -> HostStep:
    """Run one step of depth ``k`` drafted by ``kind`` over rows ``[0, bucket)`` (``width``:
    the drafter's catch-up width, the deepest strategy + 1); the host's copy of its results.
    The rows' SD counters are updated; the tokens are not applied yet."""
    n = len(rows)
    if kind != "history":
        assert sd is not None, f"a {kind} step needs a learned drafter"
        if int(rows.pending_pairs().max()) > width:
            sd.catch_up(rows, shape)  # SD just switched on (or was off): the long feed, eagerly
    if kind != "learned":
        assert drafts is not None, f"a {kind} step needs staged history drafts"
    observe = observer is not None and kind != "history"
    contexts = [s.tokens for s in rows.seqs] if observe else []
    key = ("sd", kind, bucket, k, shape.any_top_p, shape.any_greedy)

    def step() -> tuple[StepOutput, torch.Tensor]:
        if kind == "history":
            assert drafts is not None
            out = speculate_history(target, rows, drafts, bucket, k, shape, rule)
        else:
            assert sd is not None
            hybrid = drafts.view(bucket, k) if kind == "hybrid" and drafts is not None else None
            out = sd.speculate(rows, bucket, k, width, shape, observe, hybrid)
        return out, pack(out)  # packed inside the graph: one launch fewer per step

    out, packed = step() if observe else graphs.run(key, step)
    host = unpack(packed, n)
    if kind != "history":
        rows.caught_up(0, n)  # a history step feeds the drafter nothing
    if observer is not None and out.draft_logits is not None and out.drafts is not None:
        prompts = [len(s.prompt) for s in rows.seqs]
        observer(DraftTrace(contexts, prompts, out.draft_logits[:n], out.drafts[:n]))
    for b, seq in enumerate(rows.seqs):
        seq.spec_steps += 1
        seq.drafted += k
        seq.accepted += int(host.accepted[b])
    return host
