"""The RLJob's ``status.drafter.unpublished``: why no online drafter version was published yet,
copied from the trainer's ``drafterMerges`` (issue #48, item 8: before, only ``longtail run``'s
closing warning hinted at it, in words that were wrong for quality-gate refusals)."""

from __future__ import annotations

from optest import all_pods, example, observed, spec_of

from longtail_api.drafterstatus import DrafterMergeStatus
from longtail_api.wirecodec import to_wire
from longtail_api.workerapi import TrainerStatus
from longtail_operator.derive import plan
from longtail_operator.observe import parse_status
from longtail_operator.settings import Settings

SETTINGS = Settings()
WHY = "every candidate (3) scored below the initial drafter's held-out top-1 0.412 (best 0.398)"


def test_the_reason_no_drafter_version_was_published_reaches_the_job_status() -> None:
    manifest = example()
    pods = all_pods(spec_of(manifest))
    merges = DrafterMergeStatus(3, 0, {"worse": 3}, WHY)
    t = TrainerStatus(4, 10, "running", 5, -1, drafter_merges=merges)
    p = plan(observed(manifest, pods, trainer=t), SETTINGS)
    assert p.status.drafter.unpublished == WHY
    assert to_wire(p.status)["drafter"]["unpublished"] == WHY
    assert parse_status(to_wire(p.status)).drafter.unpublished == WHY
    # Once a version is published the trainer reports no reason, and the status drops it.
    done = TrainerStatus(5, 10, "running", 6, 1, drafter_merges=DrafterMergeStatus(4, 1))
    later = plan(observed(manifest, pods, trainer=done, previous=p.status), SETTINGS)
    assert later.status.drafter.unpublished is None
    assert to_wire(later.status)["drafter"]["unpublished"] is None  # pruned by the reconcile
