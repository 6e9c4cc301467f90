"""The RLJob's ``status.weightSync``: the resolved transport, and each rollout worker's held
policy version copied from the trainer's status (which books it from the generate replies)."""

from __future__ import annotations

from optest import all_pods, example, observed, spec_of

from longtail_api.status import RLJobStatus, WeightSyncStatus
from longtail_api.wirecodec import to_wire
from longtail_api.workerapi import TrainerStatus
from longtail_operator.derive import plan
from longtail_operator.observe import parse_status
from longtail_operator.settings import Settings

SETTINGS = Settings()


def test_held_versions_and_transport_land_in_status_and_survive_a_trainer_restart() -> None:
    manifest = example()
    pods = all_pods(spec_of(manifest))
    held = {"tiny-rollout-0": 4, "tiny-rollout-1": 3}
    t = TrainerStatus(4, 10, "running", 5, -1, worker_policy_versions=held)
    p = plan(observed(manifest, pods, trainer=t), SETTINGS)
    assert p.status.weight_sync == WeightSyncStatus("http", held)  # CPU example: auto -> http
    stored = to_wire(p.status)["weightSync"]
    assert stored == {"transport": "http", "workerPolicyVersions": held}
    assert parse_status(to_wire(p.status)).weight_sync == p.status.weight_sync
    # A restarted trainer has called no worker yet: the last known versions stay.
    fresh = TrainerStatus(4, 10, "running", 5, -1)
    again = plan(observed(manifest, pods, trainer=fresh, previous=p.status), SETTINGS)
    assert again.status.weight_sync.worker_policy_versions == held


def test_gpu_roles_resolve_auto_to_broadcast() -> None:
    manifest = example(trainer__resources__gpus=1, rollout__resources__gpus=1)
    p = plan(observed(manifest, [], previous=RLJobStatus()), SETTINGS)
    assert p.status.weight_sync.transport == "broadcast"
