"""Issue #32, item 9: the settings of leader election and of the operator's own namespace.

How the Lease behaves between real processes is tested against the real control plane
(``tests/integration/test_operator_ha.py``); here: the typed settings, their checks (client-go's
ordering of the three timings), where the operator's namespace comes from, and the Lease
timestamps' wire format.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from datetime import UTC, datetime, timedelta, timezone

import pytest

from longtail_operator import handlers, leader
from longtail_operator.settings import Settings, SettingsError, from_env


def test_leader_election_is_on_by_default_with_client_go_timings() -> None:
    s = Settings()
    assert s.leader_election is True
    assert (s.lease_duration_s, s.renew_deadline_s, s.retry_period_s) == (15.0, 10.0, 2.0)
    assert (s.lease_name, s.token_key_secret) == (
        "longtail-operator-leader",
        "longtail-operator-token-key",
    )


def test_lease_timings_from_env_and_their_order_checked() -> None:
    s = from_env(
        {
            "LONGTAIL_OPERATOR_LEADER_ELECTION": "false",
            "LONGTAIL_OPERATOR_LEASE_DURATION_S": "30",
            "LONGTAIL_OPERATOR_RENEW_DEADLINE_S": "20",
            "LONGTAIL_OPERATOR_RETRY_PERIOD_S": "0.5",
        }
    )
    assert s.leader_election is False and s.lease_duration_s == 30.0
    assert s.renew_deadline_s == 20.0 and s.retry_period_s == 0.5
    # The leader must give up before a standby may take over: deadline < duration.
    with pytest.raises(SettingsError, match=r"RENEW_DEADLINE_S=15.0.*retry period < renew"):
        from_env({"LONGTAIL_OPERATOR_RENEW_DEADLINE_S": "15"})
    with pytest.raises(SettingsError, match=r"RETRY_PERIOD_S=0.0"):
        from_env({"LONGTAIL_OPERATOR_RETRY_PERIOD_S": "0"})


def test_operator_namespace_from_env_then_pod_namespace_then_default() -> None:
    assert from_env({}).operator_namespace == "default"  # not in a pod: as kubectl
    assert from_env({"POD_NAMESPACE": "lt-system"}).operator_namespace == "lt-system"
    both = {"POD_NAMESPACE": "lt-system", "LONGTAIL_OPERATOR_OPERATOR_NAMESPACE": "ops"}
    assert from_env(both).operator_namespace == "ops"
    with pytest.raises(SettingsError, match="OPERATOR_NAMESPACE: must not be empty"):
        from_env({"LONGTAIL_OPERATOR_OPERATOR_NAMESPACE": " "})


def test_the_token_key_never_comes_from_the_environment_nor_shows_in_repr() -> None:
    assert from_env({"LONGTAIL_OPERATOR_TOKEN_KEY": "x" * 64}).token_key == b""
    assert "kkkk" not in repr(Settings(token_key=b"k" * 32))


def test_outside_a_pod_each_process_is_its_own_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAME", raising=False)  # in a pod: the pod's name (test_leader_restarts)
    cfg = Settings(operator_namespace="lt-system", lease_duration_s=9, renew_deadline_s=6)
    a, b = handlers.lease_config(cfg), handlers.lease_config(cfg)
    assert a.identity != b.identity  # two processes on one host are two candidates
    assert (a.namespace, a.name, a.lease_duration_s, a.renew_deadline_s) == (
        "lt-system",
        "longtail-operator-leader",
        9,
        6,
    )


def test_lease_timestamps_are_rfc3339_micro_in_utc() -> None:
    plus2 = timezone(timedelta(hours=2))
    stamp = leader.micro_time(datetime(2026, 1, 2, 5, 4, 5, tzinfo=plus2))
    assert stamp == "2026-01-02T03:04:05.000000Z"  # six digits even at 0 us (MicroTime)
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", leader.micro_time(datetime.now(UTC))
    )


class _NeverRaised:
    """kopf's flag of a daemon that kopf cancels without raising it (what it does on exit)."""

    def __bool__(self) -> bool:
        return False


def test_a_cancelled_daemon_ends_its_job_loop_and_a_finished_loop_ends_the_daemon() -> None:
    ended = threading.Event()

    def job_loop(fenced: object) -> None:
        while not fenced:
            time.sleep(0.01)
        ended.set()

    async def cancel_it() -> None:
        task = asyncio.ensure_future(handlers.in_thread(_NeverRaised(), job_loop))  # type: ignore[arg-type]
        await asyncio.sleep(0.2)
        assert not ended.is_set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    assert ended.wait(5.0), "the job loop's thread kept running after its daemon was cancelled"

    calls: list[int] = []
    # The RLJob is gone: the loop returns by itself, and the daemon returns too (no restart).
    asyncio.run(asyncio.wait_for(handlers.in_thread(_NeverRaised(), calls.append), 5.0))  # type: ignore[arg-type]
    assert len(calls) == 1
