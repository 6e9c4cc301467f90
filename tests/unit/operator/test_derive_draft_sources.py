"""The RLJob's ``status.drafter`` by draft source (``learned``, ``history``): the accepted
length and token share of each, copied from the trainer's status of its last completed step
(issue #49), and kept when a trainer has no completed step to report yet."""

from __future__ import annotations

from optest import all_pods, example, observed, spec_of

from longtail_api.wirecodec import to_wire
from longtail_api.workerapi import TrainerStatus
from longtail_operator.derive import plan
from longtail_operator.observe import parse_status
from longtail_operator.settings import Settings

SETTINGS = Settings()
LENGTHS = {"learned": 2.0, "history": 3.5}
SHARES = {"learned": 0.25, "history": 0.5}


def test_the_split_by_draft_source_reaches_the_job_status() -> None:
    manifest = example()
    pods = all_pods(spec_of(manifest))
    t = TrainerStatus(4, 10, "running", 5, 1, accepted_length=2.9, figures_step=4,
                      accepted_length_by_source=LENGTHS, sd_fraction_by_source=SHARES)  # fmt: skip
    p = plan(observed(manifest, pods, trainer=t), SETTINGS)
    assert p.status.drafter.acceptance_length_by_source == LENGTHS
    assert p.status.drafter.sd_fraction_by_source == SHARES
    wire = to_wire(p.status)["drafter"]
    assert wire["acceptanceLengthBySource"] == LENGTHS and wire["sdFractionBySource"] == SHARES
    assert parse_status(to_wire(p.status)).drafter.acceptance_length_by_source == LENGTHS
    # A restarted trainer with no completed step yet: the last figures stay.
    starting = TrainerStatus(4, 10, "running", 5, 1)
    again = plan(observed(manifest, pods, trainer=starting, previous=p.status), SETTINGS)
    assert again.status.drafter.acceptance_length_by_source == LENGTHS
    # A completed step in which nothing speculated: no figure is left over from before.
    plain = TrainerStatus(5, 10, "running", 6, 1, figures_step=5)
    later = plan(observed(manifest, pods, trainer=plain, previous=p.status), SETTINGS)
    assert later.status.drafter.sd_fraction_by_source == {}
