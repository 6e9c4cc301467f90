"""A failing experiment tracker is a condition of the RLJob (``TrackerUnavailable``), not only a
trainer log line and a metric: True with the trainer's error while its records wait in the
buffer, False again once the tracker takes them; jobs without ``spec.tracking`` never get it."""

from __future__ import annotations

import dataclasses

from optest import all_pods, example, observed, spec_of

from longtail_api.workerapi import TrainerStatus
from longtail_operator.derive import plan
from longtail_operator.model import Plan
from longtail_operator.settings import Settings

SETTINGS = Settings()
TRACKED = {"mlflow": {"trackingUri": "http://mlflow.team:5000"}}


def conds(p: Plan) -> dict[str, tuple[str, str, str]]:
    return {c.type: (c.status, c.reason, c.message) for c in p.status.conditions}


def test_a_failing_tracker_is_a_condition_until_it_takes_the_records_again() -> None:
    manifest = example(tracking=TRACKED)
    pods = all_pods(spec_of(manifest))
    down = {"mlflow": "ConnectError: connection refused (12 record(s) buffered)"}
    t = TrainerStatus(7, 20, "running", 7, 3, tracking_failing=down)
    p = plan(observed(manifest, pods, trainer=t), SETTINGS)
    status, reason, message = conds(p)["TrackerUnavailable"]
    assert (status, reason) == ("True", "TrackerFailing")
    assert "mlflow: ConnectError: connection refused (12 record(s) buffered)" in message
    [event] = [e for e in p.events if e.reason == "TrackerFailing"]
    assert event.type == "Warning"
    silent = plan(observed(manifest, pods, trainer=None, previous=p.status), SETTINGS)
    assert conds(silent)["TrackerUnavailable"][:2] == ("True", "TrackerFailing")  # kept
    healthy = dataclasses.replace(t, tracking_failing={})
    back = plan(observed(manifest, pods, trainer=healthy, previous=p.status), SETTINGS)
    assert conds(back)["TrackerUnavailable"][:2] == ("False", "TrackersAnswer")


def test_a_job_without_trackers_never_gets_the_condition() -> None:
    manifest = example()
    pods = all_pods(spec_of(manifest))
    t = TrainerStatus(7, 20, "running", 7, 3)
    assert "TrackerUnavailable" not in conds(plan(observed(manifest, pods, trainer=t), SETTINGS))
    tracked = example(tracking=TRACKED)
    quiet = plan(observed(tracked, all_pods(spec_of(tracked)), trainer=t), SETTINGS)
    assert conds(quiet)["TrackerUnavailable"][:2] == ("False", "TrackersAnswer")
