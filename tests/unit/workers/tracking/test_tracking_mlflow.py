"""Experiment tracking against a real MLflow tracking server (``mlflow server``).

One server per module (SQLite backend store and artifact store in a temporary directory, on
127.0.0.1 and a free port), started by the fixture: a run's realistic step rows go through the
trainer's :class:`~longtail_workers.tracking.sink.Tracker` and are read back through MLflow's
client and its REST API; then the server is stopped in the middle of a run and started again.
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tracking_helpers import step_rows, tracked_spec

from longtail_workers.tracking import sink
from longtail_workers.tracking.backends import RunIds
from longtail_workers.tracking.sink import open_tracker

pytestmark = pytest.mark.slow
START_TIMEOUT_S = 300.0
"""An MLflow server imports for tens of seconds on a loaded two-core machine."""


class MlflowServer:
    """``mlflow server`` as a child process; :meth:`stop` and :meth:`start` keep its port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
               "--port", str(self.port), "--workers", "1",
               "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
               "--artifacts-destination", str(self.root / "artifacts")]  # fmt: skip
        log = (self.root / "server.log").open("ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.root / "server.log").read_text()[-3000:]
                pytest.fail(f"mlflow server did not start (exit {self.proc.poll()}):\n{tail}")
            time.sleep(0.3)

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    srv.start()
    yield srv
    srv.stop()


def rest(server: MlflowServer, path: str, **params: Any) -> Any:
    answer = httpx.get(f"{server.url}/api/2.0/mlflow/{path}", params=params, timeout=30.0)
    answer.raise_for_status()
    return answer.json()


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f} s (max {max(values):.3f} s)"


def metric_steps(server: MlflowServer, run_id: str, key: str) -> dict[int, float]:
    body = rest(server, "metrics/get-history", run_id=run_id, metric_key=key, max_results=25000)
    return {int(m["step"]): float(m["value"]) for m in body.get("metrics", [])}


def test_the_server_receives_the_run_its_params_metrics_and_artifacts(
    server: MlflowServer, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    spec = tracked_spec({"mlflow": {"trackingUri": server.url, "experiment": "tracking-test"}})
    rows = step_rows(8)
    report = tmp_path / "report"
    report.mkdir()
    (report / "summary.md").write_text("# run\n")
    (report / "reward_accuracy.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    tracker = open_tracker(spec, tmp_path, tmp_path / "checkpoints")
    tracker.params(spec)
    for row in rows:
        tracker.step(row)
    tracker.artifact(report, "report")
    assert tracker.close("complete", 120)

    run_id = RunIds(tmp_path / "checkpoints").get("mlflow")
    assert run_id is not None
    run = rest(server, "runs/get", run_id=run_id)["run"]
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["algorithm.groupSize"] == "8" and params["model.path"] == "builtin:tiny"
    assert run["info"]["status"] == "FINISHED"
    assert metric_steps(server, run_id, "reward/mean") == pytest.approx(
        {r.step: r.reward_mean for r in rows}
    )
    assert set(metric_steps(server, run_id, "response_length/p99")) == set(range(1, 9))
    client = MlflowClient(tracking_uri=server.url)
    exp = client.get_experiment(run["info"]["experiment_id"])
    assert exp.name == "tracking-test"
    files = {f.path for f in client.list_artifacts(run_id, "report")}
    assert files == {"report/summary.md", "report/reward_accuracy.png"}
    (tmp_path / "got").mkdir()
    local = client.download_artifacts(run_id, "report/summary.md", str(tmp_path / "got"))
    assert Path(local).read_text() == "# run\n"

    # A resumed trainer continues the same MLflow run.
    again = open_tracker(spec, tmp_path, tmp_path / "checkpoints")
    again.step(step_rows(9)[8])
    assert again.close("complete", 120)
    assert RunIds(tmp_path / "checkpoints").get("mlflow") == run_id
    assert sorted(metric_steps(server, run_id, "reward/mean")) == list(range(1, 10))


def test_a_server_stopped_mid_run_loses_nothing_and_stalls_no_step(
    server: MlflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sink, "RETRY_MAX_S", 2.0)  # retry soon after the server is back
    spec = tracked_spec({"mlflow": {"trackingUri": server.url}})
    rows = iter(step_rows(5000))
    tracker = open_tracker(spec, tmp_path, tmp_path / "checkpoints")
    tracker.params(spec)
    step_s: dict[str, list[float]] = {"before": [], "down": [], "after": []}
    restarted = threading.Event()

    def restart() -> None:
        server.stop()
        server.start()
        restarted.set()

    def steps(phase: str, until: Any) -> None:
        while not until():
            t0 = time.monotonic()
            time.sleep(0.2)  # the step's own work
            tracker.step(next(rows))
            step_s[phase].append(time.monotonic() - t0)

    steps("before", lambda: len(step_s["before"]) >= 10)
    restarter = threading.Thread(target=restart)
    restarter.start()
    steps("down", restarted.is_set)
    restarter.join()
    back = time.monotonic()
    steps("after", lambda: len(step_s["after"]) >= 5)
    failing = tracker.failing()
    assert tracker.close("complete", 180)
    flushed_s = time.monotonic() - back

    run_id = RunIds(tmp_path / "checkpoints").get("mlflow")
    assert run_id is not None
    total = sum(len(v) for v in step_s.values())
    assert sorted(metric_steps(server, run_id, "reward/mean")) == list(range(1, total + 1))
    # Not stalled: steps went on while the server was away (a trainer waiting for it would
    # have made one), at their usual pace (medians, loosely: a loaded machine delays sleeps).
    assert len(step_s["down"]) >= 5, step_s
    usual = statistics.median(step_s["before"])
    assert statistics.median(step_s["down"]) < 3 * usual + 0.05, step_s
    print(
        f"\nmlflow outage: {len(step_s['down'])} steps while the server was down "
        f"(failing: {failing or 'recovered before the last check'}); step time before "
        f"{spread(step_s['before'])}, during {spread(step_s['down'])}, after "
        f"{spread(step_s['after'])}; every record on the "
        f"server {flushed_s:.1f} s after it was back"
    )
