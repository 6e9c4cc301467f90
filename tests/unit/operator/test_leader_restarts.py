"""Issue #48, items 1 and 2, in unit scope: the Lease across a restart and a stop.

``leader.py`` and the start-up in ``handlers.py`` against ``fakelease.FakeApi`` (the Lease calls
over plain HTTP through the real Kubernetes client; down = a refused port):

- item 1: a container restarted after losing the Lease (the operator exits 1 on losing it) is
  the same candidate as its predecessor (the pod's name) and takes the Lease back at once,
  instead of waiting out the lease duration as a new identity; after a failed try (no answer,
  or a 403 while a restarted API server fills its RBAC caches) the elector tries again within
  ``RETRY_AFTER_FAILURE_S``, so it holds the Lease within a fraction of a second of the API
  server's return (a retry period of 5 s here: the old wait);
- item 2: a standby whose start-up kopf cancels (SIGTERM) stops campaigning, so a Lease the
  leader releases just after is not taken by a process on its way out; and
  ``python -m longtail_operator`` releases the Lease on the way out whatever kopf ran.

The same with real operator processes and kube-apiserver:
``tests/integration/test_operator_restarts.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import kopf
import pytest
from fakelease import FakeApi
from kubernetes import client, config

from longtail_operator import __main__ as entry
from longtail_operator import handlers, leader
from longtail_operator.kube import Kube
from longtail_operator.leader import LeaderElector
from longtail_operator.settings import Settings

NS, LEASE = "ops", "longtail-operator-leader"


@pytest.fixture
def api() -> Iterator[FakeApi]:
    fake = FakeApi()
    yield fake
    fake.close()


@pytest.fixture(autouse=True)
def fresh_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry point's state, its job-loop pool and exit flag, per test (the other unit
    tests share the module's)."""
    monkeypatch.setattr(handlers, "_state", {})
    monkeypatch.setattr(handlers, "_exiting", type(handlers._exiting)())
    monkeypatch.setattr(handlers, "_job_loops", ThreadPoolExecutor(max_workers=2))


def kube_of(api: FakeApi, tmp_path: Path) -> Kube:
    path = api.kubeconfig(tmp_path / "kubeconfig")
    made = config.new_client_from_config(config_file=str(path))  # type: ignore[no-untyped-call]
    return Kube(cast(client.ApiClient, made))


def settings(lease_s: float, renew_s: float, retry_s: float, **kw: Any) -> Settings:
    return Settings(
        operator_namespace=NS,
        lease_duration_s=lease_s,
        renew_deadline_s=renew_s,
        retry_period_s=retry_s,
        metrics_port=0,
        network_policy=False,
        **kw,
    )


def campaign(kube: Kube, cfg: Settings, pod: str, monkeypatch: pytest.MonkeyPatch) -> LeaderElector:
    """The elector ``python -m longtail_operator`` starts in pod ``pod``."""
    monkeypatch.setenv("POD_NAME", pod)
    return LeaderElector(kube, handlers.lease_config(cfg), on_lost=lambda: None).start()


def as_identity(kube: Kube, cfg: Settings, identity: str) -> LeaderElector:
    """An elector with exactly this identity (the retry tests: no dependence on
    :func:`handlers.lease_config`)."""
    lease = replace(handlers.lease_config(cfg), identity=identity)
    return LeaderElector(kube, lease, on_lost=lambda: None).start()


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout, f"no {what} within {timeout:.0f} s"
        time.sleep(0.02)
    return time.monotonic() - t0


def test_a_pod_is_one_candidate_across_its_restarted_containers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = Settings(operator_namespace=NS)
    monkeypatch.setenv("POD_NAME", "longtail-operator-7d9f8-x2x4z")
    first, restarted = handlers.lease_config(cfg), handlers.lease_config(cfg)
    assert first.identity == restarted.identity == "longtail-operator-7d9f8-x2x4z"
    monkeypatch.delenv("POD_NAME")  # not in a pod: each process is its own candidate
    a, b = handlers.lease_config(cfg), handlers.lease_config(cfg)
    assert (
        a.identity != b.identity and a.identity.rpartition("_")[0] == b.identity.rpartition("_")[0]
    )


def test_a_restarted_container_takes_its_own_lease_back_at_once(
    api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.up()
    kube, cfg = kube_of(api, tmp_path), settings(30.0, 20.0, 0.2)
    first = campaign(kube, cfg, "op-0", monkeypatch)
    wait_until(first.acting, 10, "Lease for the first container")
    first.stop(release=False)  # it exits without releasing (lost the Lease, or killed)
    standby = campaign(kube, cfg, "op-1", monkeypatch)  # another pod: waits the lease out
    restarted = campaign(kube, cfg, "op-0", monkeypatch)
    try:
        took = wait_until(restarted.acting, 10, "Lease for the restarted container")
        print(f"restarted container holds its Lease after {took:.2f} s (lease duration 30 s)")
        assert api.holder(NS, LEASE) == "op-0" and not standby.acting()
    finally:
        standby.stop()
        restarted.stop()
    assert api.holder(NS, LEASE) is None  # released on a clean stop


def test_the_lease_is_taken_within_a_fraction_of_a_second_of_the_api_servers_return(
    api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger=leader.__name__)
    api.put_lease(NS, LEASE, "op-0")  # held by this pod's container that exited in the outage
    kube, cfg = kube_of(api, tmp_path), settings(10.0, 8.0, 5.0)
    restarted = as_identity(kube, cfg, "op-0")  # the API server is down
    try:
        time.sleep(1.6)
        api.up()
        took = wait_until(restarted.acting, 15, "Lease after the API server's return")
        print(f"Lease held {took:.2f} s after the API server's return (retry period 5 s)")
        assert took < 2.5  # the next try after a refused one comes within RETRY_AFTER_FAILURE_S
    finally:
        restarted.stop()
    said = [r.getMessage() for r in caplog.records if r.name == leader.__name__]
    failed = [line for line in said if " failed: " in line]
    assert len(failed) == 1, failed  # the first failed try, not one line per try
    assert any("succeeded after" in line for line in said), said
    retries = [r.getMessage() for r in caplog.records if r.name.startswith("urllib3")]
    assert not retries, retries[:3]  # the elector retries, not urllib3 (3 warnings per try)


def test_a_forbidden_try_while_the_api_server_starts_is_retried_soon(
    api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.put_lease(NS, LEASE, "op-0")
    api.forbidden = 2  # RBAC not ready yet: seen against the real kube-apiserver after a restart
    api.up()
    kube, cfg = kube_of(api, tmp_path), settings(10.0, 8.0, 5.0)
    restarted = as_identity(kube, cfg, "op-0")
    try:
        took = wait_until(restarted.acting, 15, "Lease after two 403s")
        print(f"Lease held {took:.2f} s after two 403s (retry period 5 s)")
        assert took < 3.5  # two waits of RETRY_AFTER_FAILURE_S, not of the retry period
    finally:
        restarted.stop()


def test_a_standby_stopped_during_start_up_never_takes_the_lease(
    api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.up()
    api.put_lease(NS, LEASE, "op-leader")
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.setenv("POD_NAME", "op-standby")
    handlers.configure(settings(3.0, 2.0, 0.1))

    async def sigterm_during_start_up() -> None:
        task = asyncio.ensure_future(handlers.startup(settings=kopf.OperatorSettings()))
        await asyncio.sleep(0.6)  # campaigning: several tries, the Lease held by the leader
        assert not task.done() and handlers._state.get("elector") is not None
        task.cancel()  # what kopf does to a start-up on SIGTERM (it then runs no cleanup)
        with pytest.raises(asyncio.CancelledError):
            await task
        api.put_lease(NS, LEASE, None)  # the leader, stopped at the same time, released it
        await asyncio.sleep(1.0)  # ten retry periods

    asyncio.run(sigterm_during_start_up())
    assert api.holder(NS, LEASE) is None, "a standby on its way out took the Lease"
    assert all(holder != "op-standby" for _, holder in api.writes), api.writes


def test_the_entry_point_releases_the_lease_whatever_kopf_ran(
    api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.up()
    env = {
        "KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig")),
        "POD_NAME": "op-0",
        "LONGTAIL_OPERATOR_OPERATOR_NAMESPACE": NS,
        "LONGTAIL_OPERATOR_METRICS_PORT": "0",
        "LONGTAIL_OPERATOR_NETWORK_POLICY": "false",
        "LONGTAIL_OPERATOR_RETRY_PERIOD_S": "0.2",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    def kopf_that_crashes_after_start_up(**_: Any) -> None:
        asyncio.run(handlers.startup(settings=kopf.OperatorSettings()))
        assert (api.holder(NS, LEASE) or "").startswith("op-0")  # acting
        raise RuntimeError("kopf crashed: no cleanup handler ran")

    monkeypatch.setattr(entry.kopf, "run", kopf_that_crashes_after_start_up)
    with pytest.raises(RuntimeError, match="no cleanup handler ran"):
        entry.main()
    assert api.holder(NS, LEASE) is None, "the process exited holding the Lease"
