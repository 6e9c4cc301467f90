"""The trainer's rollout pool under elastic rollout (issue #52): workers that leave and return.

:class:`~longtail_workers.trainer.dispatch.RolloutPool` against stub rollout workers (a real
HTTP server on loopback answering ``/healthz`` and ``POST /v1/generate`` with one sample per
request, no model): every worker down, the pool waits for one to answer again, bounded by
``wait_s`` (the job's ``rollout.belowMinGraceSeconds``) and by a stop; a worker answering other
requests than it was sent is treated as failed and its shard re-dispatched; the outcome says who
answered each request and how many workers the step had (the step row's ``answer_workers`` and
``rollout_workers``); a worker back between steps takes prompts from the next step only. And
``longtail run``'s harvest coordinator follows the workers present. The same with real workers
and real processes: ``tests/e2e_local/test_elastic_rollout.py``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from longtail_api.harvest import DRAFTER_TRAIN
from longtail_api.harvestloop import Assignment
from longtail_api.policies import HarvestSpec
from longtail_api.wirecodec import from_wire, to_wire
from longtail_api.workerapi import TrainerStatus
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.local.coordinator import Coordinator
from longtail_workers.local.launcher import free_port
from longtail_workers.trainer.dispatch import RolloutAborted, RolloutFailed, RolloutPool
from longtail_workers.wire.rollout import GenerateCall, GenerateReply, Sample


class StubWorker:
    """A rollout worker's HTTP surface on a fixed port: answers each request with one token;
    ``wrong_ids`` answers with other ids; :meth:`stop` and :meth:`start` take it away and back."""

    def __init__(self, name: str, port: int, wrong_ids: bool = False) -> None:
        self.name, self.port, self.wrong_ids = name, port, wrong_ids
        self.url = f"http://127.0.0.1:{port}"
        self.calls: list[GenerateCall] = []
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> StubWorker:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                """Quiet: the stub's requests are the test's own, asserted on instead."""

            def _send(self, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._send({"ok": True})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                call = from_wire(GenerateCall, json.loads(body), "body")
                stub.calls.append(call)
                samples = [
                    Sample(("x" if stub.wrong_ids else "") + str(r.request_id), [1], [2], [-0.1])
                    for r in call.requests
                ]
                self._send(to_wire(GenerateReply(stub.name, call.policy_version, -1, samples)))

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@pytest.fixture
def stubs() -> Iterator[list[StubWorker]]:
    workers = [StubWorker(f"rollout-{i}", free_port()) for i in range(2)]
    yield workers
    for w in workers:
        w.stop()


def reqs(step: int, n: int) -> list[GenerationRequest]:
    return [GenerationRequest([1, 2], 4, request_id=f"s{step}-p{i}-g0") for i in range(n)]


def test_a_lost_worker_shrinks_the_step_and_a_returning_one_gets_prompts_from_the_next(
    stubs: list[StubWorker],
) -> None:
    _, w1 = (w.start() for w in stubs)
    pool = RolloutPool({w.name: w.url for w in stubs}, timeout_s=10)
    out = pool.run(reqs(1, 4), step=1, policy_version=0, stop=threading.Event())
    assert out.workers_present == 2 and sorted(set(out.answered_by)) == ["rollout-0", "rollout-1"]
    assert [s.request_id for s in out.samples] == [f"s1-p{i}-g0" for i in range(4)]
    w1.stop()  # lost: connection refused
    out = pool.run(reqs(2, 4), step=2, policy_version=0, stop=threading.Event())
    assert out.workers_present == 1 and out.answered_by == ["rollout-0"] * 4
    assert out.redispatched == 2 and set(out.failed_workers) == {"rollout-1"}
    assert [s.request_id for s in out.samples] == [f"s2-p{i}-g0" for i in range(4)]
    w1.start()  # back between steps: nothing is sent to it before the next step's revive
    assert [c.step for c in w1.calls] == [1]
    assert pool.revive() == ["rollout-1"]
    out = pool.run(reqs(3, 4), step=3, policy_version=0, stop=threading.Event())
    assert out.workers_present == 2 and "rollout-1" in out.answered_by
    assert [c.step for c in w1.calls] == [1, 3]


def test_with_every_worker_down_the_pool_waits_for_one_to_answer_again(
    stubs: list[StubWorker],
) -> None:
    w0 = stubs[0].start()
    pool = RolloutPool({w0.name: w0.url}, timeout_s=10, wait_s=60)
    pool.down[w0.name] = "lost"  # restarting: down since the last step
    w0.stop()
    threading.Timer(1.5, w0.start).start()  # back while the step waits for it
    out = pool.run(reqs(1, 3), step=1, policy_version=0, stop=threading.Event())
    assert out.answered_by == ["rollout-0"] * 3 and out.workers_present == 1


def test_the_wait_for_a_worker_is_bounded_and_stoppable(stubs: list[StubWorker]) -> None:
    w0 = stubs[0]  # never started: refused
    pool = RolloutPool({w0.name: w0.url}, timeout_s=10, wait_s=1.0)
    pool.down[w0.name] = "lost"
    with pytest.raises(RolloutFailed, match=r"none answered within 1s.*belowMinGraceSeconds"):
        pool.run(reqs(1, 2), step=1, policy_version=0, stop=threading.Event())
    stop = threading.Event()
    pool.wait_s = 600.0
    threading.Timer(0.5, stop.set).start()
    with pytest.raises(RolloutAborted):
        pool.run(reqs(1, 2), step=1, policy_version=0, stop=stop)


def test_a_worker_answering_other_requests_is_failed_and_its_shard_redispatched(
    stubs: list[StubWorker],
) -> None:
    w0 = stubs[0].start()
    bad = StubWorker("rollout-1", stubs[1].port, wrong_ids=True).start()
    stubs[1] = bad  # stopped by the fixture
    pool = RolloutPool({w0.name: w0.url, bad.name: bad.url}, timeout_s=10)
    out = pool.run(reqs(1, 4), step=1, policy_version=0, stop=threading.Event())
    assert "answered request 'xs1-p1-g0' where 's1-p1-g0' was asked" in out.failed_workers[bad.name]
    assert out.answered_by == ["rollout-0"] * 4 and out.redispatched == 2
    assert [s.request_id for s in out.samples] == [f"s1-p{i}-g0" for i in range(4)]


def test_the_harvest_loop_tracks_the_workers_present() -> None:
    """``longtail run``'s harvest coordinator: a worker lost past its restarts is no target
    (its status is not even asked), a restarted one starts over in its role."""
    asked: list[str] = []

    def http(url: str, body: object, timeout_s: float, method: str, token: object = None) -> object:
        asked.append(url)
        if url.startswith("http://trainer"):
            return to_wire(TrainerStatus(0, 5, "running", 0, -1))
        raise ConnectionRefusedError(url)  # the workers: restarting, their idleness unknown

    workers = {"rollout-0": "http://w0", "rollout-1": "http://w1"}
    coord = Coordinator(HarvestSpec(), "http://trainer", workers, http=http)
    coord.poll_once()
    assert set(coord.loop.assignments) == {"rollout-0", "rollout-1"}
    coord.present(["rollout-0"])
    asked.clear()
    coord.poll_once()
    assert set(coord.loop.assignments) == {"rollout-0"}
    assert not [u for u in asked if u.startswith("http://w1")], asked
    coord.loop.assignments["rollout-0"] = Assignment(DRAFTER_TRAIN, 0.0, "")
    coord.restarted("rollout-0")
    coord.poll_once()
    assert coord.assigned == {"rollout-0": "rollout"}  # forgotten: its role's own activity
