"""GPU idleness from DCGM, end to end: exporter -> real Prometheus -> real operator -> workers.

On the real v1.20 control plane (``opharness.py``: the operator under ``KopfRunner``, the fake
kubelet), with ``harvest.source: prometheus``:

- ``dcgmexporter.DcgmExporter`` (``tests/doubles/``) serves dcgm-exporter's metric names, label
  sets and 0-1 / 0-100 scales for the job's pods, collecting every second; each test scripts
  the pods' utilisation over time (the traces below, with the role sequence each expects);
- Debian's Prometheus 2.42 (``promserver.py``) scrapes three such exporters every second, with
  the scrape settings the chart's ``dcgmMonitor`` ServiceMonitor renders for each pod-label
  convention (``helm template`` -> ``longtail_chart.dcgmscrape.scrape_config``): ``honor``
  (honorLabels: the workload's ``pod``/``namespace`` stay), ``relabel`` (no honorLabels,
  ``exported_*`` copied back) and ``exported`` (no honorLabels, the RLJob's query reads
  ``exported_pod``); service discovery's labels of the exporter pod itself are set as target
  labels, so without honorLabels Prometheus renames the workload's to ``exported_*``;
- the job's pods answer the operator as the tests' worker doubles (``FakeWorker`` per rollout
  pod, ``FakeTrainer`` for the trainer's rollout report).

Role-switch latency (exporter sample -> the worker's ``PUT /v1/role``) is printed by the first
test; ``bench/operator.py --dcgm`` measures it at 1 s and 30 s scrape intervals.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from dcgmexporter import DcgmExporter
from fakeworker import FakeTrainer, FakeWorker
from opharness import IPS, REPO, apply, cond, job, job_manifest, pods, trainer_at, wait_phase
from promserver import PrometheusServer

from longtail_api.policies import DEFAULT_DCGM_QUERY
from longtail_chart.dcgmscrape import EXPORTED_QUERY, scrape_config
from longtail_operator.settings import Settings

if TYPE_CHECKING:
    from conftest import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

EXPORTER_POD = {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x7k2p"}
"""The labels Kubernetes service discovery gives the exporter's own target."""
QUERIES = {"honor": DEFAULT_DCGM_QUERY, "relabel": DEFAULT_DCGM_QUERY, "exported": EXPORTED_QUERY}
R0, R1 = "tiny-rollout-0", "tiny-rollout-1"
BUSY, IDLE, TRAINING = 0.97, 0.0, 0.95
"""GR_ENGINE_ACTIVE ratios: generating, idle, drafter training (as busy as generating)."""

# The scripted traces and the role sequence each expects (PUT /v1/role per worker, in order).
# A trace step: (what happens, {pod: ratio}, the trainer's rollout report).
IDLE_HARVESTED = (
    ("both generate", {R0: BUSY, R1: BUSY}, "rollout"),
    ("R0 finished its answers, R1 is the long tail", {R0: IDLE, R1: BUSY}, "rollout"),
)
IDLE_HARVESTED_ROLES = {R0: ["drafter-train"], R1: []}
KEPT_WHILE_TRAINING = (
    *IDLE_HARVESTED,
    ("R0 harvested: drafter training keeps its GPU busy", {R0: TRAINING, R1: BUSY}, "rollout"),
)
KEPT_WHILE_TRAINING_ROLES = {R0: ["drafter-train"], R1: []}
RETURNED_FOR_NEXT_ROLLOUT = (
    *KEPT_WHILE_TRAINING,
    ("the next rollout lists R0's requests", {R0: TRAINING, R1: BUSY}, "rollout, R0 pending"),
)
RETURNED_FOR_NEXT_ROLLOUT_ROLES = {R0: ["drafter-train", "rollout"], R1: []}
NO_SERIES_ROLES = {R0: [], R1: []}
"""The exported convention read with the default query: no series, a condition, no switch."""
STALE_SERIES = (
    ("between rollouts: R1 idle (not harvested: no rollout)", {R0: BUSY, R1: IDLE}, "none"),
    ("R1 deleted, its series gone; a rollout starts", {R0: BUSY}, "rollout"),
    ("the new R1 pod: no series yet, its name's stale ones in range", {R0: BUSY}, "rollout"),
    ("the new R1's own GPU idle", {R0: BUSY, R1: IDLE}, "rollout"),
)
STALE_SERIES_ROLES = {R0: [], R1: ["drafter-train"]}  # the new pod, only from its own series
PROMETHEUS_DOWN = (
    ("Prometheus down; R0 idle, R1 busy", {R0: IDLE, R1: BUSY}, "rollout"),
    ("Prometheus back", {R0: IDLE, R1: BUSY}, "rollout"),
)
PROMETHEUS_DOWN_ROLES = {R0: ["drafter-train"], R1: []}  # only once Prometheus is back


def render_monitor(labels: str) -> dict[str, Any]:
    """The chart's dcgmMonitor ServiceMonitor for one convention, at the tests' 1 s scrape."""
    helm = Path(sys.executable).parent / "helm"
    cmd = [
        str(helm), "template", "lt", str(REPO / "helm" / "longtail"),
        "--show-only", "templates/dcgm-servicemonitor.yaml",
        "--set", "dcgmMonitor.enabled=true", "--set", f"dcgmMonitor.labels={labels}",
        "--set", "dcgmMonitor.interval=1s", "--set", "dcgmMonitor.scrapeTimeout=1s",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def exporters() -> Iterator[dict[str, DcgmExporter]]:
    made = {conv: DcgmExporter(collect_s=1.0) for conv in QUERIES}
    yield made
    for e in made.values():
        e.close()


def prometheus_config(exporters: dict[str, DcgmExporter]) -> dict[str, Any]:
    jobs = [
        scrape_config(render_monitor(conv), f"dcgm-{conv}", [e.target], EXPORTER_POD)
        for conv, e in exporters.items()
    ]
    scrape = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    return {"global": scrape, "scrape_configs": jobs}


@pytest.fixture(scope="module")
def prometheus(
    tmp_path_factory: pytest.TempPathFactory, exporters: dict[str, DcgmExporter]
) -> Iterator[PrometheusServer]:
    server = PrometheusServer(prometheus_config(exporters), tmp_path_factory.mktemp("prom"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Job:
    ns: str
    trainer: FakeTrainer
    workers: dict[str, FakeWorker]

    def roles(self) -> dict[str, list[str]]:
        return {n: list(w.role_requests) for n, w in self.workers.items()}

    def rollout(self, active: bool, pending: tuple[str, ...] = ()) -> None:
        with self.trainer.lock:
            self.trainer.status = dataclasses.replace(
                self.trainer.status,
                step=self.trainer.status.step + (1 if pending else 0),
                pending_workers=pending,
            )
        self.trainer.set_rollout(active)


@contextmanager
def running_job(
    cp: ControlPlane, ns: str, kubelet: Any, settings: Settings, harvest: dict[str, Any]
) -> Iterator[Job]:
    """examples/01 (2 rollout pods with a GPU each) with ``harvest``, Running, doubles at the
    pods' IPs."""
    trainer = trainer_at(kubelet, settings, ns)
    workers = {}
    for name in (R0, R1):
        ip = next(IPS)
        kubelet.ips[(ns, name)] = ip
        workers[name] = FakeWorker(name, ip, settings.worker_port)
    try:
        m = job_manifest(ns)
        m["spec"]["harvest"] = {"enabled": True, "source": "prometheus", **harvest}
        apply(cp, m)
        wait_phase(cp, ns, "Running")
        yield Job(ns, trainer, workers)
    finally:
        for w in workers.values():
            w.close()
        trainer.close()


def harvest_spec(prom: PrometheusServer | str, query: str, idle_s: float = 2.0) -> dict[str, Any]:
    url = prom if isinstance(prom, str) else prom.url
    return {
        "prometheus": {"url": url, "query": query},
        "idleSeconds": idle_s,
        "pollPeriodSeconds": 0.5,
    }


def script(exporter: DcgmExporter, ns: str, util: dict[str, float]) -> None:
    for pod, ratio in util.items():
        exporter.set_util(ns, pod, ratio)


def wait_roles(cp: ControlPlane, j: Job, want: dict[str, list[str]], timeout: float = 60) -> None:
    cp.wait_for(lambda: j.roles() == want, timeout=timeout, what=f"role requests {want}")


def hold(j: Job, want: dict[str, list[str]], seconds: float) -> None:
    """The role requests stay ``want`` for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert j.roles() == want
        time.sleep(0.2)


def worker_row(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    rows = {w["name"]: w for w in job(cp, ns).get("status", {}).get("workers", [])}
    return rows.get(name, {})


def operator_metric(settings: Settings, line_start: str) -> float | None:
    url = f"http://127.0.0.1:{settings.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(line_start):
                return float(line.rsplit(" ", 1)[1])
    return None


def harvest_r0(cp: ControlPlane, j: Job, exp: DcgmExporter) -> float:
    """Play :data:`IDLE_HARVESTED`: R0 harvested and acknowledged; the latency from the
    exporter's sample of the idle GPU to R0's ``PUT /v1/role``."""
    script(exp, j.ns, IDLE_HARVESTED[0][1])
    j.rollout(True)
    hold(j, NO_SERIES_ROLES, 4.0)  # both generate: nothing to harvest
    script(exp, j.ns, IDLE_HARVESTED[1][1])
    wait_roles(cp, j, IDLE_HARVESTED_ROLES)
    cp.wait_for(
        lambda: worker_row(cp, j.ns, R0).get("observedRole") == "drafter-train",
        timeout=30, what="R0 acknowledged in drafter-train",
    )  # fmt: skip
    assert cond(job(cp, j.ns), "IdlenessUnavailable") == ("False", "IdlenessRead")
    return j.workers[R0].role_times[0] - exp.last_change(R0, IDLE)


@pytest.mark.parametrize("convention", ["honor", "relabel", "exported"])
def test_an_idle_gpu_is_harvested_and_acknowledged_in_each_label_convention(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings,
    prometheus: PrometheusServer, exporters: dict[str, DcgmExporter], convention: str,
) -> None:  # fmt: skip
    cp, exp = control_plane, exporters[convention]
    with running_job(cp, ns, kubelet, settings, harvest_spec(prometheus, QUERIES[convention])) as j:
        latency = harvest_r0(cp, j, exp)
    settings_text = "1 s scrape, idleSeconds 2, pollPeriodSeconds 0.5"
    print(f"\n{convention}: role-switch latency, exporter sample -> PUT /v1/role "
          f"({settings_text}): {latency:.2f} s", file=sys.__stderr__)  # fmt: skip
    raw = prometheus.query(f'DCGM_FI_DEV_GPU_UTIL{{pod="{R0}"}}')
    exported = prometheus.query(f'DCGM_FI_DEV_GPU_UTIL{{exported_pod="{R0}"}}')
    if convention == "exported":  # the workload is only in exported_pod; `pod` is the exporter's
        assert any(s["metric"]["pod"] == EXPORTER_POD["pod"] for s in exported)
    else:  # honorLabels, or the chart's relabelling, keeps the workload in `pod`/`namespace`
        assert any(s["metric"].get("namespace") == ns for s in raw)


def test_a_harvested_gpu_busy_with_its_drafter_training_is_not_switched_back(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings,
    prometheus: PrometheusServer, exporters: dict[str, DcgmExporter],
) -> None:  # fmt: skip
    cp, exp = control_plane, exporters["honor"]
    with running_job(cp, ns, kubelet, settings, harvest_spec(prometheus, QUERIES["honor"])) as j:
        harvest_r0(cp, j, exp)
        script(exp, ns, KEPT_WHILE_TRAINING[-1][1])  # as busy as generating
        hold(j, KEPT_WHILE_TRAINING_ROLES, 6.0)  # > window + idleSeconds + polls
        assert worker_row(cp, ns, R0)["assignedRole"] == "drafter-train"


def test_a_harvested_worker_goes_back_when_the_next_rollout_needs_it(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings,
    prometheus: PrometheusServer, exporters: dict[str, DcgmExporter],
) -> None:  # fmt: skip
    cp, exp = control_plane, exporters["honor"]
    with running_job(cp, ns, kubelet, settings, harvest_spec(prometheus, QUERIES["honor"])) as j:
        harvest_r0(cp, j, exp)
        script(exp, ns, RETURNED_FOR_NEXT_ROLLOUT[-1][1])
        j.rollout(True, pending=(R0,))  # the trainer lists R0's requests
        wait_roles(cp, j, RETURNED_FOR_NEXT_ROLLOUT_ROLES)
        cp.wait_for(
            lambda: worker_row(cp, ns, R0).get("observedRole") == "rollout",
            timeout=30, what="R0 back in rollout",
        )  # fmt: skip


def test_the_wrong_query_for_the_convention_is_a_condition_not_a_silent_no_harvest(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings,
    prometheus: PrometheusServer, exporters: dict[str, DcgmExporter],
) -> None:  # fmt: skip
    cp, exp = control_plane, exporters["exported"]
    script(exp, ns, IDLE_HARVESTED[1][1])
    with running_job(cp, ns, kubelet, settings, harvest_spec(prometheus, QUERIES["honor"])) as j:
        j.rollout(True)
        got = cp.wait_for(
            lambda: cond(job(cp, ns), "IdlenessUnavailable") == ("True", "IdlenessSourceFailing"),
            timeout=60, what="IdlenessUnavailable naming the label convention",
        )  # fmt: skip
        assert got
        message = next(
            c["message"] for c in job(cp, ns)["status"]["conditions"]
            if c["type"] == "IdlenessUnavailable"
        )  # fmt: skip
        assert "honorLabels" in message and "exported_pod" in message
        hold(j, NO_SERIES_ROLES, 3.0)


def test_a_deleted_pods_stale_series_never_harvest_the_pod_that_takes_its_name(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings,
    prometheus: PrometheusServer, exporters: dict[str, DcgmExporter],
) -> None:  # fmt: skip
    cp, exp = control_plane, exporters["honor"]
    steps = STALE_SERIES
    script(exp, ns, steps[0][1])
    harvest = harvest_spec(prometheus, QUERIES["honor"], idle_s=4.0)  # window 4 s
    with running_job(cp, ns, kubelet, settings, harvest) as j:
        j.rollout(False)
        hold(j, NO_SERIES_ROLES, 7.0)  # R1 idle > idleSeconds, but no rollout runs
        old_uid = pods(cp, ns)[R1]["metadata"]["uid"]
        cp.kubectl("-n", ns, "delete", "pod", R1, "--wait=false")
        exp.release(ns, R1)
        j.rollout(True)

        def recreated() -> bool:
            p = pods(cp, ns).get(R1)
            return bool(p and p["metadata"]["uid"] != old_uid and p["status"].get("podIP"))

        cp.wait_for(recreated, timeout=60, what="R1 recreated by the operator")
        hold(j, NO_SERIES_ROLES, 8.0)  # its name's stale idle series are in range for 4 s
        script(exp, ns, steps[3][1])
        wait_roles(cp, j, STALE_SERIES_ROLES, timeout=60)


def test_prometheus_down_is_a_condition_and_a_metric_and_changes_no_role(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings,
    exporters: dict[str, DcgmExporter], tmp_path: Path,
) -> None:  # fmt: skip
    cp, exp = control_plane, exporters["honor"]
    down = PrometheusServer(prometheus_config(exporters), tmp_path)  # not started yet
    gauge = f'longtail_operator_idleness_source_up{{namespace="{ns}",rljob="tiny"}}'
    script(exp, ns, PROMETHEUS_DOWN[0][1])
    with running_job(cp, ns, kubelet, settings, harvest_spec(down.url, QUERIES["honor"])) as j:
        j.rollout(True)
        cp.wait_for(
            lambda: cond(job(cp, ns), "IdlenessUnavailable") == ("True", "IdlenessSourceFailing"),
            timeout=60, what="IdlenessUnavailable while Prometheus is down",
        )  # fmt: skip
        cp.wait_for(lambda: operator_metric(settings, gauge) == 0.0, timeout=30, what=gauge)
        hold(j, NO_SERIES_ROLES, 4.0)  # R0 idle all along: never harvested on no data
        try:
            down.start()
            wait_roles(cp, j, PROMETHEUS_DOWN_ROLES, timeout=90)
            cp.wait_for(
                lambda: cond(job(cp, ns), "IdlenessUnavailable") == ("False", "IdlenessRead"),
                timeout=60, what="IdlenessUnavailable False once Prometheus answers",
            )  # fmt: skip
            assert operator_metric(settings, gauge) == 1.0
        finally:
            down.stop()
