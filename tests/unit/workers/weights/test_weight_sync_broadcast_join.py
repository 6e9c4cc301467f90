"""A rollout worker joining a running job's broadcast weight sync (#52), real processes and gloo
groups on loopback: two receivers take versions 1 and 2 (one group, kept), a third registers in
the middle of version 3's broadcast (the test opens its gate from inside the trainer's tensor
stream), version 3 still goes out to the first two on their kept group, the joiner takes it
over HTTP (the generate call naming it), version 4 goes to all three in one new membership
epoch (a fresh group, one attempt, nobody dropped) and version 5 reuses that group. The first
two are not stalled beyond that one epoch change: the version with the join costs them no more
than the group build the trainer measured for it plus a steady version's time, with room for a
loaded machine (half the phase timeout) but none for a member waited for or a retry. The join
after a version's broadcast (no mid-broadcast registration) is in
``test_weight_sync_broadcast.py``; the cost of an epoch change is measured by
``bench/broadcast_epoch.py``."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch
from broadcast_harness import PHASE_TIMEOUT_S, Cluster, expected_sha, go, policy
from broadcast_harness import cluster as cluster  # the fixture

import longtail_workers.weights.broadcast as broadcast_module
from longtail_workers.weights.membership import attempt_group
from longtail_workers.weights.pieces import canonical_layout, metas_of
from longtail_workers.weights.store import publish_state_dict
from longtail_workers.weights.sync import Published, SyncPhases

A, B, JOINER = "rollout-0", "rollout-1", "rollout-2"
REGISTER_S = 5.0
"""How long the trainer's stream waits for the joiner to register (under the receivers' own
gloo timeout, so the two already receiving version 3 do not time out meanwhile)."""


def publish_with_join(cluster: Cluster, version: int, gate: str) -> Published:
    """Publish ``version``; halfway through the tensor stream (buckets already on the wire)
    open ``gate`` and wait until the joiner is live in the trainer's roster."""
    state = policy(version)
    layout, _ = canonical_layout(metas_of(state))
    halfway = len(layout) // 2

    def tensors() -> Iterator[torch.Tensor]:
        for i, meta in enumerate(layout):
            if i == halfway:
                (cluster.tmp / gate).touch()
                deadline = time.monotonic() + REGISTER_S
                while JOINER not in cluster.broadcast.roster.live():
                    if time.monotonic() > deadline:
                        pytest.fail(f"{JOINER} did not register in {REGISTER_S}s mid-broadcast")
                    time.sleep(0.01)
            yield state[meta.name]

    return cluster.store.publish_stream(version, layout, tensors)


def test_a_worker_joining_mid_broadcast_gets_the_current_version_and_one_new_epoch(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds: dict[int, float] = {}  # attempt -> the trainer's time building its fresh group

    def timed_build(store, n, rank, size, device, timeout_s):  # type: ignore[no-untyped-def]
        t0 = time.monotonic()
        try:
            return attempt_group(store, n, rank, size, device, timeout_s)
        finally:
            builds[n] = time.monotonic() - t0

    monkeypatch.setattr(broadcast_module, "attempt_group", timed_build)
    cluster.spawn(A)
    cluster.spawn(B)
    cluster.spawn(JOINER, "--start-after", str(cluster.tmp / "gate"))
    cluster.wait_live([A, B])
    deadline = time.monotonic() + 60
    while not (cluster.tmp / f"{JOINER}.waiting").exists():  # started, not registered
        if time.monotonic() > deadline:
            pytest.fail(f"{JOINER} did not start in 60s:\n{cluster.logs()}")
        time.sleep(0.1)
    took: dict[int, float] = {}
    phases: dict[int, SyncPhases] = {}
    for version in (1, 2, 3, 4, 5):
        t0 = time.monotonic()
        if version == 3:
            published = publish_with_join(cluster, version, "gate")
        else:
            published = publish_state_dict(cluster.store, version, policy(version))
        took[version] = time.monotonic() - t0
        assert published.phases is not None
        phases[version] = published.phases
        members = [A, B] if version <= 3 else [A, B, JOINER]
        got = phases[version]
        assert (got.receivers, got.dropped, got.attempts) == (members, [], 1), (version, got)
        for name in members:
            event = cluster.wait_version(name, version)
            assert event["via"] == "broadcast" and event["sha"] == expected_sha(version), name
        if version == 3:  # registered too late for it: the generate call pulls it over HTTP
            assert JOINER in cluster.broadcast.roster.live()
            cluster.want(JOINER, 3)
            event = cluster.wait_version(JOINER, 3)
            assert event["via"] == "http" and event["sha"] == expected_sha(3)
    # Attempt n carried version n. The join mid-broadcast did not touch version 3's kept group;
    # version 4 is the one epoch change (a fresh group, attempt 4's); version 5 keeps it.
    assert [go(cluster, n).group for n in (1, 2, 3, 4, 5)] == [1, 1, 1, 4, 4]
    assert [go(cluster, n).members for n in (3, 4)] == [[A, B], [A, B, JOINER]]
    assert sorted(builds) == [1, 4], builds  # two group builds in five versions
    assert [e["version"] for e in cluster.events(JOINER)] == [0, 3, 4, 5]
    for name in (A, B):
        assert [e["version"] for e in cluster.events(name)] == [0, 1, 2, 3, 4, 5]
    # Not stalled beyond one epoch change: the version with the new member took the others no
    # longer than its group build plus a steady version (2 or 3 members on a kept group), with
    # room for a loaded machine but none for a phase timeout (a member waited for, a retry).
    steady = max(took[2], took[5])
    assert builds[4] < PHASE_TIMEOUT_S, builds
    assert took[4] - builds[4] < steady + PHASE_TIMEOUT_S / 2, (took, builds)
