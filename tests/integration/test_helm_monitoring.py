"""A real Prometheus scrapes real Longtail endpoints; every dashboard/alert metric must be there.

Started on loopback, all in this test module:

- a rollout worker (tiny Qwen2 model, adaptive speculative decoding, spot drafter trainer) behind
  its real ``ControlServer``; it generates, switches to drafter training and back, so its
  engine, acceptance, spot and role-switch series exist;
- the verifier, as the real ``longtail worker verifier --port 0`` process, scoring one batch;
- the operator's real metrics server (``longtail_operator.metrics.HealthServer``) with its
  collectors, fed through the same recording methods the reconciler and harvester call;
- the trainer's real HTTP surface (``longtail_workers.trainer.service.TrainerApp``) after
  recording one step row of the shape its step driver produces;
- Prometheus 2.42 from Debian (``e2e/monitoring.sh``), scraping every second, with the target
  labels the chart's PodMonitor sets (namespace, pod, rljob, worker_role).

Then every metric name referenced by a dashboard or alert must be in Prometheus' name index,
except the DCGM names (``longtail_chart.dashpanels.DCGM_METRICS``); if the trainer's HTTP
surface cannot be imported, its names are checked against ``longtail_api.metrics`` only and the
live trainer test is skipped naming what is missing. Every dashboard and alert
expression must also evaluate without error on that Prometheus, and every dashboard query
that reads only live metrics must return data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from promserver import PrometheusServer

from longtail_api.steprow import StepRow
from longtail_chart import metricrefs
from longtail_chart.dashpanels import DCGM_METRICS

pytestmark = [pytest.mark.integration, pytest.mark.slow]


JOB_LABELS = {"namespace": "ml", "rljob": "tiny"}
TRAINER_PREFIX = "longtail_trainer_"
MISSING: dict[str, str] = {}
"""Endpoints that could not be started, with the reason (for skip messages)."""


def wait_for(check: Any, *, timeout: float, what: str) -> Any:
    """Poll ``check`` with exponential backoff until truthy; fail naming ``what``."""
    deadline, delay, last = time.monotonic() + timeout, 0.1, None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(delay)
        delay = min(delay * 2, 2.0)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")


def http_json(url: str, body: Any = None, method: str = "GET", token: str = "") -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def rollout_worker() -> Iterator[str]:
    """A rollout worker that generated with SD, trained its drafter and went back; its URL."""
    torch = pytest.importorskip("torch")
    from tiny_targets import tiny_qwen2

    from longtail_api.policies import DrafterTrainingSpec, SpeculativeSpec, StrategySpec
    from longtail_workers.drafter.model import EagleDrafter
    from longtail_workers.engine.interface import GenerationRequest
    from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
    from longtail_workers.engine.stats import RolloutMetrics
    from longtail_workers.rollout.control import RolloutWorker
    from longtail_workers.rollout.http import ControlConfig, ControlServer

    torch.set_num_threads(1)
    model = tiny_qwen2(seed=6, vocab_size=24, sharpness=10.0)
    spec = SpeculativeSpec(
        enabled=True, batch_threshold=3, warmup_steps=1, strategies=[StrategySpec(draft_depth=3)]
    )
    engine = TorchEngine(
        model,
        config=EngineConfig(max_running=4),
        speculative=spec,
        drafter=EagleDrafter(model, target_id="tiny-mon"),
    )
    training = DrafterTrainingSpec(learning_rate=1e-3, window_tokens=16, max_steps_per_window=10**5)
    worker = RolloutWorker(engine, target_id="tiny-mon", name="tiny-rollout-0", training=training)
    # RolloutWorker does not attach the engine's collectors to its registry itself; whoever
    # builds both must (as here). NOTE: longtail_workers/rollout/service.py does not do it yet,
    # so a real rollout pod exports no longtail_rollout_* series until it does.
    engine.metrics = RolloutMetrics(worker.metrics_registry)
    with ControlServer(worker, ControlConfig(port=0)) as server:
        reqs = [GenerationRequest([1 + i, 2], max_new_tokens=6 + 4 * i, seed=i) for i in range(6)]
        worker.generate(reqs)
        assert http_json(server.url + "/v1/role", {"role": "drafter-train"}, "PUT")
        assert worker.trainer is not None
        wait_for(lambda: worker.trainer.total_steps >= 1, timeout=60, what="a drafter step")
        assert http_json(server.url + "/v1/role", {"role": "rollout"}, "PUT")
        worker.generate(reqs[:2])
        yield server.url
    worker.trainer.stop(timeout=5.0)


@pytest.fixture(scope="module")
def verifier() -> Iterator[str]:
    """``longtail worker verifier`` as a process, after scoring one batch; its URL."""
    exe = Path(sys.executable).parent / "longtail"
    token = "monitoring-test-token"  # a worker without a job token refuses to start
    proc = subprocess.Popen(
        [str(exe), "worker", "verifier", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "LONGTAIL_AUTH_TOKEN": token},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # "longtail verifier listening on http://..."
        assert "listening on http://" in line, (line, proc.poll())
        url = line.rsplit(" ", 1)[-1]
        items = [{"answer": r"\boxed{4}", "gold": "4"}, {"answer": "no idea", "gold": "7"}]
        answer = http_json(url + "/v1/verify", {"items": items}, "POST", token)
        assert len(answer["results"]) == 2
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="module")
def operator_metrics() -> Iterator[str]:
    """The operator's metrics server with a reconcile, an error, GPUs and role switches."""
    from longtail_operator.metrics import Health, HealthServer, OperatorMetrics

    metrics = OperatorMetrics()
    metrics.reconcile("ok", 0.02)
    metrics.reconcile("retry", 0.5, reason="ApiError")
    metrics.jobs({"Running": 1})
    metrics.job_gpus(JOB_LABELS["namespace"], JOB_LABELS["rljob"], total=4, idle=1, harvested=1)
    metrics.harvested(JOB_LABELS["namespace"], JOB_LABELS["rljob"], 12.5)
    metrics.role_switch("drafter-train", "acknowledged", 0.08)
    metrics.role_switch("rollout", "acknowledged", 0.05)
    metrics.status_poll("worker", ok=True)
    metrics.idleness_source_up(JOB_LABELS["namespace"], JOB_LABELS["rljob"], up=True)
    server = HealthServer(metrics, Health(), "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


STEP_ROW = StepRow(
    step=3,
    step_s=42.0,
    rollout_s=30.0,
    tail_s=12.0,
    train_s=10.0,
    sync_s=2.0,
    reward_mean=0.4,
    accuracy=0.35,
    policy_version=3,
    drafter_version=0,
    sync_version=2,
    sync_transport="broadcast",
    sync_gather_s=0.1,
    sync_pack_s=0.3,
    sync_wire_s=0.5,
    sync_load_s=0.2,
    sync_pause_s=1.2,
    sync_bytes=1_000_000_000,
    sync_gb_per_s=0.83,
)
"""One completed step, as the trainer step driver records it (with the weight sync of the
version its rollout used, which the dashboard's weight-sync row reads)."""


@pytest.fixture(scope="module")
def trainer() -> Iterator[str | None]:
    """The trainer's HTTP surface after one step, or None (with the reason) if it is missing."""
    try:
        from longtail_workers.trainer.service import TrainerApp
    except ImportError as exc:
        MISSING["trainer"] = f"cannot import longtail_workers.trainer.service.TrainerApp: {exc}"
        yield None
        return
    app = TrainerApp("127.0.0.1", 0)
    app.metrics.observe(STEP_ROW)
    with app:
        yield app.url


def _target(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc


@pytest.fixture(scope="module")
def prometheus(
    tmp_path_factory, rollout_worker, verifier, operator_metrics, trainer
) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("prometheus")
    pod = {"namespace": "ml", "rljob": "tiny"}
    workers = [
        (rollout_worker, "tiny-rollout-0", "rollout"),
        (verifier, "tiny-verifier-0", "verifier"),
        (trainer, "tiny-trainer-0", "trainer"),
    ]
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "longtail-workers",
                "static_configs": [
                    {"targets": [_target(url)], "labels": {**pod, "pod": name, "worker_role": role}}
                    for url, name, role in workers
                    if url is not None
                ],
            },
            {
                # Like the chart's ServiceMonitor: keep the operator's own namespace/rljob labels.
                "job_name": "longtail-operator",
                "honor_labels": True,
                "static_configs": [{"targets": [_target(operator_metrics)]}],
            },
        ],
    }
    server = PrometheusServer(config, workdir).start()
    url = server.url
    try:

        def all_up() -> bool:
            want = 1 + sum(url is not None for url, _, _ in workers)
            targets = server.targets()
            return len(targets) == want and all(t["health"] == "up" for t in targets)

        wait_for(all_up, timeout=60, what="prometheus to scrape every target")
        time.sleep(4)  # a few more scrapes, so rate() over the window has two samples
        yield url
    finally:
        server.stop()


def live_names(prometheus: str) -> set[str]:
    return set(http_json(prometheus + "/api/v1/label/__name__/values")["data"])


def query(prometheus: str, expr: str) -> list[Any]:
    q = urllib.parse.urlencode({"query": metricrefs.substitute_variables(expr)})
    try:
        body = http_json(f"{prometheus}/api/v1/query?{q}")
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"query failed ({exc.code}): {exc.read().decode()}\n{expr}") from exc
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_every_referenced_longtail_metric_is_scraped(prometheus) -> None:
    names = live_names(prometheus)
    refs = metricrefs.references()
    expected = {n for n in refs if n not in DCGM_METRICS and not n.startswith(TRAINER_PREFIX)}
    assert len(expected) > 30
    missing = {n: refs[n] for n in sorted(expected - names)}
    assert not missing, f"referenced but not exported by any live endpoint: {missing}"


def test_trainer_metrics_are_scraped(prometheus, trainer) -> None:
    refs = metricrefs.references()
    names = sorted(n for n in refs if n.startswith(TRAINER_PREFIX))
    assert names and set(names) <= metricrefs.declared_names()
    if trainer is None:
        reason = MISSING.get("trainer", "no trainer HTTP surface")
        pytest.skip(f"{reason}: trainer names {names} checked against longtail_api.metrics only")
    missing = {n: refs[n] for n in names if n not in live_names(prometheus)}
    assert not missing, f"referenced but not exported by the trainer: {missing}"
    step = query(prometheus, 'max by (rljob) (longtail_trainer_step{rljob="tiny"})')
    assert [r["value"][1] for r in step] == ["3"]


def test_every_dashboard_and_alert_expression_evaluates(prometheus) -> None:
    names = live_names(prometheus)
    empty = []
    for where, expr in [*metricrefs.dashboard_exprs(), *metricrefs.alert_exprs()]:
        result = query(prometheus, expr)
        live_only = metricrefs.metric_names(expr) <= names
        if where.startswith("longtail-") and live_only and not result:
            empty.append(f"{where}: {expr}")
    assert not empty, "dashboard queries over live metrics returned nothing:\n" + "\n".join(empty)


def test_job_labels_join_worker_and_operator_series(prometheus) -> None:
    role = query(prometheus, 'max by (pod, role) (longtail_worker_role{rljob="tiny"} == 1)')
    assert [r["metric"] for r in role] == [{"pod": "tiny-rollout-0", "role": "rollout"}]
    gpus = query(prometheus, 'sum by (state) (longtail_operator_job_gpus{rljob="tiny"})')
    assert {r["metric"]["state"]: r["value"][1] for r in gpus} == {
        "total": "4",
        "idle": "1",
        "harvested": "1",
        "drafter": "0",  # no dedicated drafter pods in this job (spec.drafter unset)
    }
    down = query(prometheus, 'up{worker_role="rollout"} == 0')
    assert down == []  # the worker-down alert's expression stays quiet while it is up
