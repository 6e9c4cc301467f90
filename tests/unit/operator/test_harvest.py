"""The harvest loop over real loopback HTTP workers: decide once, retry with backoff, ack,
GPU-seconds; idleness from a fake source, and from a loopback Prometheus API; the trainer pod as
a target only when ``trainer`` is eligible, harvested with the rollout state it reports."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fakeworker import FakeTrainer, FakeWorker
from optest import all_pods, example, spec_of

from longtail_api.policies import HarvestSpec, PrometheusSourceSpec
from longtail_operator.clients import WorkerClient
from longtail_operator.harvester import Harvester
from longtail_operator.metrics import OperatorMetrics
from longtail_operator.settings import Settings
from longtail_operator.sources import (
    Observation,
    PrometheusSource,
    WorkerStatusSource,
    WorkerTarget,
    parse_samples,
)
from longtail_operator.targets import harvest_targets

SPEC = HarvestSpec(idle_seconds=1.0)


class FakeSource:
    """Idleness set by the test (the 'fake metrics source' of the issue)."""

    def __init__(self) -> None:
        self.obs: dict[str, Observation] = {}
        self.last_error: str | None = None

    def trainer_report(self, t: WorkerTarget) -> Observation | None:
        return None

    def observe(self, targets: Sequence[WorkerTarget]) -> dict[str, Observation]:
        return {t.name: self.obs[t.name] for t in targets if t.name in self.obs}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def workers() -> Iterator[list[FakeWorker]]:
    ws = [FakeWorker(f"w{i}") for i in range(3)]
    yield ws
    for w in ws:
        w.close()


def targets(ws: list[FakeWorker], gpus: int = 2) -> list[WorkerTarget]:
    return [WorkerTarget(w.name, "rollout", w.host, w.port, gpus, uid=w.name) for w in ws]


def test_idle_worker_switched_once_and_acknowledged(workers: list[FakeWorker]) -> None:
    clock, src, metrics = Clock(), FakeSource(), OperatorMetrics()
    h = Harvester("job", WorkerClient(timeout=2.0), metrics, clock=clock)
    src.obs = {
        "w0": Observation(busy=True, idle_seconds=None, observed="rollout"),
        "w1": Observation(busy=False, idle_seconds=5.0, observed="rollout"),
        "w2": Observation(busy=False, idle_seconds=0.2, observed="rollout"),  # not long enough
    }
    assert h.step(SPEC, targets(workers), src)
    assert workers[1].role_requests == ["drafter-train"] and workers[1].observed == "drafter-train"
    assert workers[0].role_requests == [] and workers[2].role_requests == []
    snap = h.snapshot()
    assert [w.assigned_role for w in snap.workers] == ["rollout", "drafter-train", "rollout"]
    assert snap.unacknowledged == ()
    # Same observations again: the decision is not sent twice.
    src.obs["w1"] = Observation(busy=False, idle_seconds=6.0, observed="drafter-train")
    clock.t += 10.0
    h.step(SPEC, targets(workers), src)
    assert workers[1].role_requests == ["drafter-train"]
    assert h.gpu_seconds == pytest.approx(20.0)  # 10 s x 2 GPUs, reported as training
    assert h.snapshot().harvested_gpus == 2 and h.snapshot().training_workers == 1
    # The tail ends (nobody generates): everyone goes back to rollout.
    src.obs["w0"] = Observation(busy=False, idle_seconds=0.0, observed="rollout")
    h.step(SPEC, targets(workers), src)
    assert workers[1].role_requests == ["drafter-train", "rollout"]
    text = metrics.exposition().decode()
    assert (
        'longtail_operator_role_switches_total{result="acknowledged",role="drafter-train"} 1.0'
        in text
    )
    assert "longtail_operator_role_switch_seconds_count" in text


def test_refused_switch_retried_with_backoff_and_surfaced(workers: list[FakeWorker]) -> None:
    clock, src = Clock(), FakeSource()
    h = Harvester("job", WorkerClient(), clock=clock, retry_initial_s=1.0, retry_max_s=4.0)
    workers[1].refuse = "no rollout data captured yet"
    src.obs = {
        "w0": Observation(busy=True, idle_seconds=None, observed="rollout"),
        "w1": Observation(busy=False, idle_seconds=5.0, observed="rollout"),
    }
    ts = targets(workers[:2])
    h.step(SPEC, ts, src)
    snap = h.snapshot()
    assert snap.unacknowledged == ("w1",)
    assert "no rollout data captured yet" in (snap.workers[1].message or "")
    clock.t += 0.5  # before the 1 s backoff: not re-sent
    h.step(SPEC, ts, src)
    assert len(workers[1].role_requests) == 1
    clock.t += 0.6
    h.step(SPEC, ts, src)
    assert len(workers[1].role_requests) == 2  # retried after 1 s; next wait 2 s
    clock.t += 1.5
    h.step(SPEC, ts, src)
    assert len(workers[1].role_requests) == 2
    workers[1].refuse = None
    clock.t += 1.0
    h.step(SPEC, ts, src)
    assert len(workers[1].role_requests) == 3 and h.snapshot().unacknowledged == ()


def test_worker_status_source_over_http(workers: list[FakeWorker]) -> None:
    workers[0].set_generating(True)
    src = WorkerStatusSource(WorkerClient())
    down = WorkerTarget("gone", "rollout", "127.0.0.1", 1, 1)
    obs = src.observe([*targets(workers[:2]), down])
    assert obs["w0"].busy and obs["w0"].idle_seconds is None
    assert not obs["w1"].busy and obs["w1"].observed == "rollout"
    assert "gone" not in obs and "ConnectionRefused" in src.errors["gone"]


def test_a_worker_failing_its_status_polls_is_logged_and_shown_unreachable(
    workers: list[FakeWorker], caplog: pytest.LogCaptureFixture
) -> None:
    src = WorkerStatusSource(WorkerClient(timeout=1.0))
    down = WorkerTarget("w9", "rollout", "127.0.0.1", 1, 1, uid="w9")  # nothing listens
    ts = [*targets(workers[:1]), down]
    h = Harvester(job="tiny", namespace="ns", client=WorkerClient(timeout=1.0))
    for _ in range(2):  # a blip or two is not "unreachable"
        h.step(SPEC, ts, src)
        assert h.snapshot().unreachable == ()
    with caplog.at_level("WARNING", logger="longtail_operator.harvester"):
        h.step(SPEC, ts, src)
    [line] = h.snapshot().unreachable
    assert line.startswith("w9: ") and "ConnectionRefused" in line
    assert "ns/tiny: worker w9 does not answer its status polls" in caplog.text
    h.step(SPEC, ts[:1], src)  # the pod is gone (deleted or replaced): no longer listed
    assert h.snapshot().unreachable == () and "w9" not in src.failures


class _Prom(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.queries.append(self.path)  # type: ignore[attr-defined]
        body = {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [
                    {"metric": {"pod": "w0"}, "value": [0, "93.5"]},
                    {"metric": {"pod": "w1"}, "value": [0, "2.0"]},
                    {"metric": {"pod": "w3", "pod_uid": "old"}, "value": [0, "0.0"]},
                    {"metric": {"pod": "w4", "pod_uid": "u4"}, "value": [0, "0.0"]},
                ],
            },
        }
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_prometheus_source_reads_dcgm_busy_percent_and_trusts_a_series_only_for_its_pod() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Prom)
    server.queries = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        spec = HarvestSpec(
            source="prometheus", prometheus=PrometheusSourceSpec(url=url), idle_seconds=30.0
        )
        clock = Clock()
        src = PrometheusSource(spec, "team-a", clock=clock)
        ts = [
            WorkerTarget(n, "rollout", None, 0, 1, uid=f"u{n[1]}")
            for n in ("w0", "w1", "w2", "w3", "w4")
        ]
        first = src.observe(ts)
        assert first["w0"].busy and not first["w1"].busy
        # w1's series has no pod UID: its window (30 s) may still hold an earlier pod's
        # samples under the same name, so its idleness counts only once the pod was a target
        # that long. w4's series names its UID: trusted at once. w3's names another pod (the
        # one deleted before): no sample. w2: no series.
        assert first["w1"].idle_seconds is None and first["w4"].idle_seconds == 0.0
        assert "w2" not in first and "w3" not in first
        clock.t += 12.0
        assert src.observe(ts)["w1"].idle_seconds is None
        clock.t += 30.0
        later = src.observe(ts)
        assert later["w1"].idle_seconds == 12.0 and later["w4"].idle_seconds == 42.0
        # w1 recreated (same name, new UID): it starts over.
        ts[1] = WorkerTarget("w1", "rollout", None, 0, 1, uid="u1-new")
        assert src.observe(ts)["w1"].idle_seconds is None
        query = server.queries[0]  # type: ignore[attr-defined]
        assert "team-a" in query and "%5B30s%5D" in query  # $namespace and $window substituted
        assert src.last_error is None
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_prometheus_source_down_or_misconfigured_observes_nothing_and_says_why() -> None:
    spec = HarvestSpec(
        source="prometheus", prometheus=PrometheusSourceSpec(url="http://127.0.0.1:9")
    )
    src = PrometheusSource(spec, "team-a", timeout=1.0)
    assert src.observe([WorkerTarget("w0", "rollout", None, 0, 1)]) == {}
    assert src.last_error is not None and src.last_error.startswith("Prometheus query failed")
    exported = {
        "status": "success",
        "data": {"result": [{"metric": {"exported_pod": "w0", "pod": ""}, "value": [0, "1"]}]},
    }
    with pytest.raises(ValueError, match=r"exported_pod.*honorLabels.*docs/observability.md"):
        parse_samples(exported)
    with pytest.raises(ValueError, match=r"Prometheus answered error: bad query"):
        parse_samples({"status": "error", "error": "bad query"})


def test_trainer_pod_is_a_target_only_when_eligible() -> None:
    settings = Settings(trainer_port=8300, worker_port=8200)
    default = spec_of(example())
    pods = all_pods(default)
    assert {t.role for t in harvest_targets(default, pods, set(), settings)} == {"rollout"}
    both = spec_of(example(harvest__eligibleRoles=["rollout", "trainer"]))
    targets = harvest_targets(both, all_pods(both), set(), settings)
    (trainer,) = [t for t in targets if t.role == "trainer"]
    assert trainer.name == "tiny-trainer-0" and trainer.port == 8300
    assert {t.role for t in targets} == {"rollout", "trainer"}
    gone = harvest_targets(both, all_pods(both), {"tiny-trainer-0"}, settings)
    assert "trainer" not in {t.role for t in gone}


@pytest.fixture
def trainer() -> Iterator[FakeTrainer]:
    t = FakeTrainer()
    yield t
    t.close()


def test_trainer_harvested_while_it_waits_for_the_rollout(
    workers: list[FakeWorker], trainer: FakeTrainer
) -> None:
    clock = Clock()
    spec = HarvestSpec(idle_seconds=0.0, eligible_roles=["rollout", "trainer"])
    h = Harvester("job", WorkerClient(), clock=clock)
    src = WorkerStatusSource(WorkerClient())
    tt = WorkerTarget("tiny-trainer-0", "trainer", trainer.host, trainer.port, 4, uid="t")
    ts = [*targets(workers[:1], gpus=1), tt]
    # Between rollouts the trainer is busy (updating the policy): it does not make the idle
    # rollout worker harvestable, and it is not harvested itself.
    h.step(spec, ts, src)
    assert trainer.role_requests == [] and workers[0].role_requests == []
    # A rollout: the worker generates, the trainer waits and is switched to drafter-train.
    trainer.set_rollout(True)
    workers[0].set_generating(True)
    h.step(spec, ts, src)
    assert trainer.role_requests == ["drafter-train"] and workers[0].role_requests == []
    clock.t += 5.0
    h.step(spec, ts, src)
    assert h.gpu_seconds == pytest.approx(20.0)  # 5 s x the trainer's 4 GPUs
    snap = h.snapshot()
    assert snap.harvested_gpus == 4 and snap.training_workers == 1
    row = next(w for w in snap.workers if w.role == "trainer")
    assert (row.assigned_role, row.observed_role) == ("drafter-train", "drafter-train")
    # The rollout ends: the trainer went back to train by itself; the loop follows.
    workers[0].set_generating(False)
    trainer.set_rollout(False)
    h.step(spec, ts, src)
    assert trainer.role_requests == ["drafter-train", "train"]
    assert h.snapshot().unacknowledged == () and workers[0].role_requests == []


def test_trainer_not_harvested_unless_eligible(
    workers: list[FakeWorker], trainer: FakeTrainer
) -> None:
    h = Harvester("job", WorkerClient())
    spec = HarvestSpec(idle_seconds=0.0)  # eligibleRoles: [rollout]
    ts = [WorkerTarget("tiny-trainer-0", "trainer", trainer.host, trainer.port, 4)]
    trainer.set_rollout(True)
    h.step(spec, ts, WorkerStatusSource(WorkerClient()))
    assert trainer.role_requests == []


def test_trainer_pod_read_for_the_rollout_state_when_not_a_target(
    workers: list[FakeWorker], trainer: FakeTrainer
) -> None:
    settings = Settings(trainer_port=8300, worker_port=8200)
    default = spec_of(example())  # eligibleRoles: [rollout]
    (pod0,) = harvest_targets(default, all_pods(default), set(), settings, roles={"trainer"})
    assert (pod0.name, pod0.role, pod0.port) == ("tiny-trainer-0", "trainer", 8300)
    h = Harvester("job", WorkerClient(), clock=Clock())
    src = WorkerStatusSource(WorkerClient())
    tt = WorkerTarget("tiny-trainer-0", "trainer", trainer.host, trainer.port, 4, uid="t")
    spec = HarvestSpec(idle_seconds=0.0)
    # Nobody generates but the trainer says a rollout runs: the idle worker is harvested.
    trainer.set_rollout(True)
    h.step(spec, targets(workers[:1], gpus=1), src, tt)
    assert workers[0].role_requests == ["drafter-train"] and trainer.role_requests == []
    # The trainer says it ended while the other worker still generates: back to rollout.
    trainer.set_rollout(False)
    workers[1].set_generating(True)
    h.step(spec, targets(workers[:2], gpus=1), src, tt)
    assert workers[0].role_requests == ["drafter-train", "rollout"]
    assert trainer.role_requests == [] and "tiny-trainer-0" not in h.assignments
    assert [w.name for w in h.snapshot().workers] == ["w0", "w1"]
