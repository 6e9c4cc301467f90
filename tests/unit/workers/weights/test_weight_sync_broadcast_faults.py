"""Broadcast weight sync under faults (#33), real processes and gloo groups on loopback: a
receiver SIGKILLed mid-broadcast (the version reaches the other within the phase timeout; the
restarted worker catches up over HTTP and is in the next broadcast), a receiver restarted
between two versions (the kept group is not used: a fresh one, no wait), the trainer restarted
between two versions (every receiver reconnects and receives the next one), the trainer
SIGKILLed mid-broadcast (no receiver loads any of the half-sent version; a new trainer on the
same ports sends it and every receiver takes it), a receiver that
registered and then stops (SIGSTOP: named and dropped within the timeout, the others get the
version), and a bucket corrupted in flight (refused, the previous version kept, the version then
fetched over HTTP). Faults are injected by the test receiver (``ws_receiver.py``), not by
product flags."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path

import pytest
from broadcast_harness import PHASE_TIMEOUT_S, Cluster, Processes, expected_sha, go, policy
from broadcast_harness import cluster as cluster  # the fixture
from httpcall import free_port

from longtail_workers.weights.membership import STALE_S
from longtail_workers.weights.store import publish_state_dict

A, B = "rollout-0", "rollout-1"


def test_a_receiver_killed_mid_broadcast_is_dropped_and_rejoins_after_an_http_catch_up(
    cluster: Cluster,
) -> None:
    victim = cluster.spawn(A, "--kill-at", "1:5")  # dies receiving bucket 5 of version 1
    cluster.spawn(B)
    cluster.wait_live([A, B])
    t0 = time.monotonic()
    phases = publish_state_dict(cluster.store, 1, policy(1)).phases
    took = time.monotonic() - t0
    assert victim.wait(timeout=10) == -signal.SIGKILL
    assert phases is not None
    assert (phases.receivers, phases.dropped, phases.attempts) == ([B], [A], 2)
    # Lost mid-broadcast: the broken attempt ends at once (the group is dropped), the loss is
    # known when A's beat stops (STALE_S), and the retry to B is quick.
    assert took < PHASE_TIMEOUT_S + STALE_S, took
    event = cluster.wait_version(B, 1)
    assert event["via"] == "broadcast" and event["sha"] == expected_sha(1)

    cluster.spawn(A)  # restarted, as longtail run or the operator would
    cluster.want(A, 1)
    event = cluster.wait_version(A, 1)
    assert event["via"] == "http" and event["sha"] == expected_sha(1)
    cluster.wait_live([A, B])
    phases = publish_state_dict(cluster.store, 2, policy(2)).phases
    assert phases is not None and (phases.receivers, phases.dropped) == ([A, B], [])
    for name in (A, B):
        event = cluster.wait_version(name, 2)
        assert event["via"] == "broadcast" and event["sha"] == expected_sha(2)


def test_a_receiver_restarted_between_versions_gets_a_fresh_group_not_the_kept_one(
    cluster: Cluster,
) -> None:
    first = cluster.spawn(A)
    cluster.spawn(B)
    cluster.wait_live([A, B])
    assert publish_state_dict(cluster.store, 1, policy(1)).phases.receivers == [A, B]
    assert cluster.wait_version(A, 1)["via"] == "broadcast"
    first.kill()  # between versions: the trainer keeps attempt 1's group for [A, B]
    first.wait(timeout=10)
    (cluster.tmp / f"{A}.jsonl").unlink()  # the events of the new process only
    cluster.spawn(A)  # the same name, a new process that holds no group
    cluster.want(A, 1)
    assert cluster.wait_version(A, 1)["via"] == "http"
    cluster.wait_live([A, B])
    t0 = time.monotonic()
    phases = publish_state_dict(cluster.store, 2, policy(2)).phases
    assert (phases.receivers, phases.dropped, phases.attempts) == ([A, B], [], 1)
    assert time.monotonic() - t0 < PHASE_TIMEOUT_S  # no wait on the dead process's group
    assert go(cluster, 2).group == 2  # A acknowledged holding no group: a fresh one
    for name in (A, B):
        event = cluster.wait_version(name, 2)
        assert event["via"] == "broadcast" and event["sha"] == expected_sha(2)


def test_a_restarted_trainer_is_rejoined_by_every_receiver_and_broadcasts_again(
    cluster: Cluster,
) -> None:
    cluster.spawn(A)
    cluster.spawn(B)
    cluster.wait_live([A, B])
    assert publish_state_dict(cluster.store, 1, policy(1)).phases.receivers == [A, B]
    for name in (A, B):
        assert cluster.wait_version(name, 1)["via"] == "broadcast"
    cluster.restart_trainer()  # a new store: the receivers reconnect (backoff) and register
    cluster.wait_live([A, B])
    phases = publish_state_dict(cluster.store, 2, policy(2)).phases
    assert (phases.receivers, phases.dropped, phases.attempts) == ([A, B], [], 1)
    assert go(cluster, 1).group == 1  # the new store counts attempts from 1: a fresh group
    for name in (A, B):
        event = cluster.wait_version(name, 2)
        assert event["via"] == "broadcast" and event["sha"] == expected_sha(2)


def test_a_trainer_killed_mid_broadcast_leaves_the_receivers_on_their_version_and_a_new_one_goes_on(
    tmp_path: Path,
) -> None:
    procs = Processes(tmp_path)
    port, http_port = free_port(), free_port()
    addr, url = f"127.0.0.1:{port}", f"http://127.0.0.1:{http_port}"
    trainer = ["--port", str(port), "--http-port", str(http_port), "--out", str(tmp_path)]
    trainer += ["--wait", A, B]
    try:
        first = procs.start("trainer-1", "ws_trainer.py", *trainer, "--publish", "1", "2",
                            "--die-at", "2:10")  # fmt: skip
        procs.receiver(A, addr, url)
        procs.receiver(B, addr, url)
        for name in (A, B):
            assert procs.wait_version(name, 1)["via"] == "broadcast"
        assert first.wait(timeout=60) == -signal.SIGKILL, procs.logs()  # mid version 2
        procs.start("trainer-2", "ws_trainer.py", *trainer, "--publish", "2")
        for name in (A, B):  # they reconnect to the new store and take the resent version
            event = procs.wait_version(name, 2, timeout_s=60)
            assert event["via"] == "broadcast" and event["sha"] == expected_sha(2)
            # nothing of the half-sent attempt was ever loaded: initial, 1, then the new 2
            assert [e["version"] for e in procs.events(name)] == [0, 1, 2], procs.logs()
        text = (tmp_path / "trainer.jsonl").read_text()
        published = [json.loads(line) for line in text.splitlines()]
        assert published == [
            {"version": 1, "receivers": [A, B], "dropped": []},
            {"version": 2, "receivers": [A, B], "dropped": []},
        ], published
    finally:
        procs.close()


def test_a_receiver_that_stops_answering_is_named_and_dropped_within_the_timeout(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    stuck = cluster.spawn(A)
    cluster.spawn(B)
    cluster.wait_live([A, B])
    os.kill(stuck.pid, signal.SIGSTOP)  # registered, still counted live: announced, never acks
    try:
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="longtail_workers.weights.broadcast"):
            phases = publish_state_dict(cluster.store, 1, policy(1)).phases
        assert time.monotonic() - t0 < PHASE_TIMEOUT_S + 2
        assert phases is not None and (phases.receivers, phases.dropped) == ([B], [A])
        assert any(A in r.getMessage() and "dropped" in r.getMessage() for r in caplog.records)
        event = cluster.wait_version(B, 1)
        assert event["via"] == "broadcast" and event["sha"] == expected_sha(1)
    finally:
        os.kill(stuck.pid, signal.SIGCONT)


def test_a_bucket_corrupted_in_flight_is_refused_and_the_version_fetched_over_http(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.spawn(A, "--corrupt-at", "1:3")
    cluster.spawn(B)
    cluster.wait_live([A, B])
    with caplog.at_level(logging.WARNING, logger="longtail_workers.weights.broadcast"):
        phases = publish_state_dict(cluster.store, 1, policy(1)).phases
    assert phases is not None and (phases.receivers, phases.dropped) == ([B], [A])
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refusals and "bucket(s) [3]" in refusals[0] and A in refusals[0]
    assert cluster.wait_version(B, 1)["sha"] == expected_sha(1)
    time.sleep(0.5)  # A would have loaded a kept broadcast within its 50 ms poll
    assert [e["version"] for e in cluster.events(A)] == [0]  # the previous version, whole
    cluster.want(A, 1)
    event = cluster.wait_version(A, 1)
    assert event["via"] == "http" and event["sha"] == expected_sha(1)
