"""The trainer's rollout membership follows the job's live ``spec.rollout.replicas`` (issue #52).

In a pod the trainer's ``--rollout`` list is derived once from the job's config file
(``longtail_workers.podenv.rollout_workers``); ``trainer/membership.py`` re-reads that file (the
mounted ConfigMap, which Kubernetes rewrites in place after an edit) at each step start, so
:meth:`~longtail_workers.trainer.dispatch.RolloutPool.revive` adds the workers a raised
``replicas`` names (taken once they answer) and drops those a lowered one no longer names. At
start the trainer runs with the workers that answer (:func:`wait_for_rollout`) instead of
waiting for pods Kueue did not admit. Against stub rollout workers (``test_elastic_pool.py``'s:
a real HTTP server on loopback, no model) reached under their pod names: name resolution maps
``<job>-rollout-<i>.<service>`` to the stub's loopback port, as the headless Service would.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_elastic_pool import StubWorker, reqs

from longtail_api.podenv import Peer, PodEnv
from longtail_workers.local.launcher import free_port
from longtail_workers.podenv import rollout_workers
from longtail_workers.trainer.dispatch import RolloutPool
from longtail_workers.trainer.membership import (
    STARTING,
    SpecMembership,
    spec_membership,
    wait_for_rollout,
)

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "01-tiny-arith.yaml"
JOB, SERVICE, PORT = "tiny", "tiny-rollout.ns.svc", 9200
ENV = PodEnv(job_name=JOB, peers={"rollout": Peer(SERVICE, PORT)})
NAMES = [f"{JOB}-rollout-{i}" for i in range(3)]


def write_spec(path: Path, replicas: int) -> None:
    """The job file as the operator renders it, with ``replicas`` rollout workers; replaced in
    one rename, as the kubelet swaps a ConfigMap volume's contents."""
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["spec"]["rollout"]["replicas"] = replicas
    tmp = path.with_suffix(".new")
    tmp.write_text(yaml.safe_dump(raw))
    os.replace(tmp, path)


@pytest.fixture
def stubs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[StubWorker]]:
    """Three rollout pods (not started), each reachable as ``<pod>.<service>:PORT``."""
    workers = [StubWorker(name, free_port()) for name in NAMES]
    ports = {f"{w.name}.{SERVICE}": w.port for w in workers}
    real: Callable[..., Any] = socket.getaddrinfo

    def resolve(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in ports:  # the pod's DNS name: its stub on loopback
            return real("127.0.0.1", ports[host], *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    yield workers
    for w in workers:
        w.stop()


def pod_pool(spec: Path, replicas: int) -> RolloutPool:
    """The pool a trainer pod builds (``trainer/setup.py``): its start list, and the
    membership that follows ``spec``."""
    environ = {**ENV.to_env(), "LONGTAIL_CONFIG": str(spec)}
    workers = rollout_workers(ENV, replicas)
    membership = spec_membership(str(spec), workers, environ)
    assert isinstance(membership, SpecMembership)
    return RolloutPool(workers, timeout_s=10, membership=membership)


def step(pool: RolloutPool, n: int) -> tuple[set[str], int]:
    """One step as the driver runs it (revive, then the rollout): who answered, how many."""
    pool.revive()
    out = pool.run(reqs(n, 6), step=n, policy_version=0, stop=threading.Event())
    assert [s.request_id for s in out.samples] == [f"s{n}-p{i}-g0" for i in range(6)]
    return set(out.answered_by), out.workers_present


def test_raising_replicas_adds_a_worker_that_takes_prompts_once_it_answers(
    stubs: list[StubWorker], tmp_path: Path
) -> None:
    spec = tmp_path / "rljob.yaml"
    write_spec(spec, 2)
    w0, w1, w2 = stubs
    w0.start(), w1.start()
    pool = pod_pool(spec, 2)
    assert step(pool, 1) == ({w0.name, w1.name}, 2)
    write_spec(spec, 3)  # the user raised replicas; the operator has not made the pod yet
    assert step(pool, 2) == ({w0.name, w1.name}, 2)
    assert pool.down == {w2.name: "not yet live (new in spec.rollout.replicas)"}
    assert w2.calls == []
    w2.start()  # the new pod is up: it takes prompts from the next step
    assert step(pool, 3) == (set(NAMES), 3)
    assert [c.step for c in w2.calls] == [3]


def test_lowering_replicas_drops_a_worker_at_the_next_step(
    stubs: list[StubWorker], tmp_path: Path
) -> None:
    spec = tmp_path / "rljob.yaml"
    write_spec(spec, 3)
    for w in stubs:
        w.start()
    pool = pod_pool(spec, 3)
    assert step(pool, 1) == (set(NAMES), 3)
    write_spec(spec, 2)  # its pod is still there: only the spec says it is gone
    assert step(pool, 2) == (set(NAMES[:2]), 2)
    assert list(pool.workers) == NAMES[:2] and not pool.down
    assert [c.step for c in stubs[2].calls] == [1]


def test_an_unreadable_spec_keeps_the_workers_and_a_hand_given_list_stays_fixed(
    stubs: list[StubWorker], tmp_path: Path
) -> None:
    spec = tmp_path / "rljob.yaml"
    write_spec(spec, 2)
    for w in stubs[:2]:
        w.start()
    pool = pod_pool(spec, 2)
    spec.write_text("spec: {rollout: {replicas: -1}}\n")  # no valid RLJob
    assert step(pool, 1) == (set(NAMES[:2]), 2)
    environ = {**ENV.to_env(), "LONGTAIL_CONFIG": str(spec)}
    listed = {"rollout-0": stubs[0].url}  # --rollout on the command line: not the pods' names
    assert spec_membership(str(spec), listed, environ) is None
    assert spec_membership(str(spec), rollout_workers(ENV, 2), ENV.to_env()) is None  # no pod


def test_the_trainer_starts_with_the_workers_that_answer(
    stubs: list[StubWorker], tmp_path: Path
) -> None:
    """Kueue admitted two of three rollout pods: the run starts with them (minReplicas 2) and
    the third joins at the first step start after it answers."""
    spec = tmp_path / "rljob.yaml"
    write_spec(spec, 3)
    w0, w1, w2 = stubs
    w0.start(), w1.start()
    pool = pod_pool(spec, 3)
    live = wait_for_rollout(pool, 2, 300.0, 120.0, threading.Event())
    assert live == NAMES[:2] and pool.down == {w2.name: STARTING}
    assert step(pool, 1) == ({w0.name, w1.name}, 2)
    w2.start()
    assert step(pool, 2) == (set(NAMES), 3)


def test_below_the_minimum_the_start_waits_the_grace_then_runs_with_those_there(
    stubs: list[StubWorker], tmp_path: Path
) -> None:
    spec = tmp_path / "rljob.yaml"
    write_spec(spec, 3)
    stubs[0].start()
    pool = pod_pool(spec, 3)
    live = wait_for_rollout(pool, 3, 0.5, 120.0, threading.Event())
    assert live == NAMES[:1] and set(pool.down) == set(NAMES[1:])
    # A grace longer than the start's timeout: the timeout ends the wait, with those there.
    assert wait_for_rollout(pod_pool(spec, 3), 3, 600.0, 1.0, threading.Event()) == NAMES[:1]
    stubs[0].stop()  # none answers: the start fails, naming them
    with pytest.raises(TimeoutError, match=rf"after 1s: {', '.join(NAMES)} \(0 of the 3"):
        wait_for_rollout(pod_pool(spec, 3), 3, 600.0, 1.0, threading.Event())


def test_a_fixed_list_waits_for_every_worker_and_the_wait_is_bounded(
    stubs: list[StubWorker],
) -> None:
    w0, w1, _ = stubs
    w0.start()
    pool = RolloutPool({w.name: w.url for w in (w0, w1)}, timeout_s=10)  # longtail run's list
    with pytest.raises(TimeoutError, match=rf"not healthy after 1s: {w1.name} \(1 of the 2"):
        wait_for_rollout(pool, 2, None, 1.0, threading.Event())
    threading.Timer(0.5, w1.start).start()
    assert wait_for_rollout(pool, 2, None, 120.0, threading.Event()) == [w0.name, w1.name]
