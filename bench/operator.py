"""Benchmark: the operator's reconcile latency, role-switch latency and memory.

Run: ``.venv/bin/python bench/operator.py`` (needs the cached control plane:
``make controlplane``; ``--help`` for knobs). Writes ``bench/results/operator.json`` and prints
the figures; nothing is asserted (targets: reconcile of a 64-worker RLJob < 1 s, role-switch
p95 < 2 s, operator RSS < 150 MB).

1. Reconcile latency. Starts the real v1.20 control plane (``e2e/controlplane.sh up``), applies
   the CRD and the operator's RBAC, and times :meth:`Reconciler.reconcile` as the limited
   operator identity for RLJobs with 8 and 64 worker pods: the first reconcile (GET, LIST,
   create every pod + Services + ConfigMap, status write, events) and a steady-state one
   (nothing to change).
2. Operator process. Runs ``python -m longtail_operator`` as a subprocess (the real entry
   point), creates a 64-worker RLJob, times create -> 64 pods exist, and reads the process's
   VmRSS/VmHWM from /proc.
3. Role switches. A :class:`Harvester` drives 64 loopback :class:`FakeWorker` s over HTTP: each
   round, half the workers go idle while the rest generate; decision -> acknowledged latency is
   recorded per switch (both directions), over ``--rounds`` rounds.
4. Role switches from DCGM (``--dcgm``, on by default; ``--no-dcgm`` skips it): the idleness
   read through a real Prometheus (Debian's 2.42) scraping the tests' dcgm-exporter double
   (``tests/doubles/dcgmexporter.py``), at two settings: a 1 s scrape and exporter collection
   (idleSeconds 2, pollPeriodSeconds 0.5) and dcgm-exporter's default 30 s (idleSeconds 30,
   pollPeriodSeconds 5). Each round one worker's GPU goes idle while the other's stays busy and
   the trainer reports a rollout; the latency is from the exporter's collection that first
   showed the idle GPU to the worker's ``PUT /v1/role``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
# tests/doubles: the loopback FakeWorker (a test double, not shipped in the operator package).
sys.path[:0] = [str(REPO / p) for p in ("api", "operator", "helm", "tests/doubles")]

from dcgmexporter import DcgmExporter  # noqa: E402
from fakeworker import FakeTrainer, FakeWorker  # noqa: E402
from promserver import PrometheusServer  # noqa: E402

from longtail_api.policies import HarvestSpec, PrometheusSourceSpec  # noqa: E402
from longtail_operator.clients import WorkerClient  # noqa: E402
from longtail_operator.harvester import Harvester  # noqa: E402
from longtail_operator.metrics import OperatorMetrics  # noqa: E402
from longtail_operator.reconcile import JobRuntime, Reconciler  # noqa: E402
from longtail_operator.settings import Settings  # noqa: E402
from longtail_operator.sources import (  # noqa: E402
    PrometheusSource,
    WorkerStatusSource,
    WorkerTarget,
)

SCRIPT = REPO / "e2e" / "controlplane.sh"
OUT = REPO / "bench" / "results" / "operator.json"


def sh(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=True, capture_output=True, text=True, cwd=REPO, **kw)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Recorder(OperatorMetrics):
    def __init__(self) -> None:
        super().__init__()
        self.switches: list[float] = []

    def role_switch(self, role: str, result: str, seconds: float | None) -> None:
        super().role_switch(role, result, seconds)
        if seconds is not None:
            self.switches.append(seconds)


def job_manifest(ns: str, name: str, workers: int) -> dict[str, Any]:
    m = yaml.safe_load((REPO / "examples" / "01-tiny-arith.yaml").read_text())
    m["metadata"] = {"name": name, "namespace": ns}
    m["spec"]["rollout"]["replicas"] = workers - 2  # + trainer + verifier
    return m  # type: ignore[no-any-return]


class Cluster:
    def __init__(self, state: Path) -> None:
        self.state = state
        sh("bash", str(SCRIPT), "build", timeout=3600)
        self.kubectl_bin = sh("bash", str(SCRIPT), "bin").stdout.strip() + "/kubectl"
        sh("bash", str(SCRIPT), "up", str(state), timeout=300)
        self.kubectl("apply", "--validate=false", "-f", "crds/rljob.yaml")
        self.kubectl("wait", "--for=condition=Established", "crd/rljobs.longtail.dev")
        self.kubectl("apply", "-f", "operator/rbac/clusterrole.yaml")
        for role in ("longtail-operator", "longtail-operator-discovery"):
            self.kubectl(
                "create",
                "clusterrolebinding",
                role,
                f"--clusterrole={role}",
                "--user=longtail-operator",
            )

    def kubectl(self, *args: str, input: str | None = None) -> str:
        cmd = [self.kubectl_bin, "--kubeconfig", str(self.state / "admin.kubeconfig"), *args]
        return subprocess.run(cmd, check=True, capture_output=True, text=True, input=input).stdout

    def namespace(self, name: str) -> str:
        self.kubectl("create", "namespace", name)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # pods need the default ServiceAccount token
            out = self.kubectl("-n", name, "get", "sa", "default", "-o", "jsonpath={.secrets}")
            if out.strip():
                return name
            time.sleep(0.5)
        raise TimeoutError(f"no default ServiceAccount token in {name} after 60 s")

    def down(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "down", str(self.state)], check=False, cwd=REPO)


def bench_reconcile(cluster: Cluster, sizes: list[int]) -> dict[str, Any]:
    from kubernetes import config

    from longtail_operator.kube import Kube

    api = config.new_client_from_config(config_file=str(cluster.state / "operator.kubeconfig"))
    reconciler = Reconciler(Kube(api), Settings(metrics_port=0))
    out: dict[str, Any] = {}
    for n in sizes:
        ns = cluster.namespace(f"bench-{n}")
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job_manifest(ns, "job", n)))
        rt = JobRuntime(ns, "job")
        t0 = time.perf_counter()
        reconciler.reconcile(rt)
        first = time.perf_counter() - t0
        steady = []
        for _ in range(5):
            t0 = time.perf_counter()
            reconciler.reconcile(rt)
            steady.append(time.perf_counter() - t0)
        pods = len(cluster.kubectl("-n", ns, "get", "pods", "-o", "name").split())
        out[str(n)] = {"pods": pods, "first_s": first, "steady_median_s": statistics.median(steady)}
        print(
            f"reconcile, {n} workers: first {first * 1000:.0f} ms ({pods} pods created), "
            f"steady {statistics.median(steady) * 1000:.0f} ms"
        )
    reconciler.pool.shutdown()
    return out


def bench_process(cluster: Cluster, workers: int) -> dict[str, Any]:
    ns = cluster.namespace("bench-proc")
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.state / "operator.kubeconfig"),
        "LONGTAIL_OPERATOR_NAMESPACES": ns,
        "LONGTAIL_OPERATOR_METRICS_PORT": "0",
        "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("api", "operator")),
    }
    log = cluster.state / "operator-bench.log"
    with log.open("w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "longtail_operator"], env=env, stdout=f, stderr=subprocess.STDOUT
        )
    try:
        time.sleep(5.0)  # start-up: imports, login, watches
        t0 = time.perf_counter()
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job_manifest(ns, "job", workers)))
        deadline, pods = time.monotonic() + 120, 0
        while time.monotonic() < deadline:
            pods = len(cluster.kubectl("-n", ns, "get", "pods", "-o", "name").split())
            if pods >= workers:
                break
            time.sleep(0.05)
        e2e = time.perf_counter() - t0
        time.sleep(3.0)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        mem = {
            k: int(v.split()[0]) / 1024
            for k, v in (line.split(":", 1) for line in status.splitlines())
            if k in ("VmRSS", "VmHWM")
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(
        f"operator process: create -> {pods} pods in {e2e * 1000:.0f} ms; "
        f"RSS {mem['VmRSS']:.0f} MB (peak {mem['VmHWM']:.0f} MB)"
    )
    return {
        "workers": workers,
        "pods": pods,
        "create_to_pods_s": e2e,
        "rss_mb": mem["VmRSS"],
        "peak_rss_mb": mem["VmHWM"],
    }


def bench_switch(n: int, rounds: int) -> dict[str, Any]:
    workers = [FakeWorker(f"w{i}") for i in range(n)]
    metrics = Recorder()
    targets = [WorkerTarget(w.name, "rollout", w.host, w.port, 1, uid=w.name) for w in workers]
    h = Harvester("bench", WorkerClient(timeout=2.0), metrics)
    source = WorkerStatusSource(WorkerClient(timeout=2.0))
    spec = HarvestSpec(idle_seconds=0.0, poll_period_seconds=0.1)
    step_s = []
    try:
        for r in range(rounds):
            for w in workers:  # a rollout: everyone generates, then half finish
                w.set_generating(True)
            h.step(spec, targets, source)
            for i, w in enumerate(workers):
                w.set_generating(i % 2 == r % 2)
            t0 = time.perf_counter()
            h.step(spec, targets, source)  # idle half -> drafter-train
            step_s.append(time.perf_counter() - t0)
            for w in workers:
                w.set_generating(False)
            h.step(spec, targets, source)  # rollout over -> everyone back to rollout
    finally:
        for w in workers:
            w.close()
    s = metrics.switches
    print(
        f"role switch, {n} loopback workers, {len(s)} switches: p50 {pct(s, 0.5) * 1000:.1f} ms, "
        f"p95 {pct(s, 0.95) * 1000:.1f} ms, max {max(s) * 1000:.1f} ms; poll+decide+send step "
        f"median {statistics.median(step_s) * 1000:.0f} ms"
    )
    return {
        "workers": n,
        "switches": len(s),
        "p50_s": pct(s, 0.5),
        "p95_s": pct(s, 0.95),
        "max_s": max(s),
        "step_median_s": statistics.median(step_s),
    }


DCGM_SETTINGS = (
    # (name, exporter collection and scrape interval s, idleSeconds, pollPeriodSeconds, rounds)
    ("1s-scrape", 1.0, 2.0, 0.5, 8),
    ("30s-scrape", 30.0, 30.0, 5.0, 3),
)


def bench_dcgm(setting: tuple[str, float, float, float, int], workdir: Path) -> dict[str, Any]:
    """Exporter sample -> PUT /v1/role through a real Prometheus (see the module text)."""
    name, interval, idle_s, poll_s, rounds = setting
    ns = "bench"
    exporter = DcgmExporter(collect_s=interval)
    trainer = FakeTrainer()
    workers = [FakeWorker(f"w{i}") for i in range(2)]
    scrape = {"scrape_interval": f"{interval:g}s", "scrape_timeout": f"{min(interval, 10):g}s"}
    job = {
        "job_name": "dcgm",
        "honor_labels": True,
        "static_configs": [{"targets": [exporter.target]}],
    }
    prom = PrometheusServer({"global": scrape, "scrape_configs": [job]}, workdir).start()
    targets = [WorkerTarget(w.name, "rollout", w.host, w.port, 1, uid=w.name) for w in workers]
    tt = WorkerTarget("trainer-0", "trainer", trainer.host, trainer.port, 1, uid="t")
    spec = HarvestSpec(
        source="prometheus",
        prometheus=PrometheusSourceSpec(url=prom.url),
        idle_seconds=idle_s,
        poll_period_seconds=poll_s,
    )
    h = Harvester("bench", WorkerClient(timeout=2.0))
    reports = WorkerStatusSource(WorkerClient(timeout=2.0))
    source = PrometheusSource(spec, ns, reports)
    latencies: list[float] = []

    def step_until(done: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h.step(spec, targets, source, tt)
            if done():
                return True
            time.sleep(poll_s)
        return False

    try:
        for r in range(rounds):
            busy, idle = workers[1 - r % 2], workers[r % 2]
            for w in workers:  # a rollout: both generate
                exporter.set_util(ns, w.name, 0.97)
            trainer.set_rollout(True)
            time.sleep(2 * interval + idle_s)  # every window sees the busy GPUs
            asked = len(idle.role_requests)
            exporter.set_util(ns, idle.name, 0.0)  # idle answers done; `busy` is the tail
            harvested = lambda w=idle, n=asked: len(w.role_requests) > n  # noqa: E731
            if not step_until(harvested, 4 * interval + 3 * idle_s):
                print(f"dcgm {name}: round {r}: {idle.name} never harvested")
                continue
            latencies.append(idle.role_times[-1] - exporter.last_change(idle.name, 0.0))
            trainer.set_rollout(False)  # the rollout ends: both back to rollout
            step_until(lambda w=idle: w.role_requests[-1] == "rollout", 30.0)
            assert busy.role_requests[-1:] in ([], ["rollout"]), busy.role_requests
    finally:
        prom.stop()
        exporter.close()
        trainer.close()
        for w in workers:
            w.close()
    lat = latencies or [float("nan")]
    print(
        f"DCGM role switch, {name} (idleSeconds {idle_s:g}, pollPeriodSeconds {poll_s:g}), "
        f"{len(latencies)}/{rounds} rounds: exporter sample -> PUT /v1/role "
        f"min {min(lat):.1f} s, median {statistics.median(lat):.1f} s, max {max(lat):.1f} s"
    )
    return {
        "scrape_s": interval,
        "collect_s": interval,
        "idle_seconds": idle_s,
        "poll_period_seconds": poll_s,
        "rounds": rounds,
        "latencies_s": latencies,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--sizes", default="8,64", help="worker counts to reconcile (default %(default)s)"
    )
    ap.add_argument(
        "--rounds", type=int, default=20, help="role-switch rounds (default %(default)s)"
    )
    ap.add_argument("--switch-workers", type=int, default=64)
    ap.add_argument(
        "--dcgm", action=argparse.BooleanOptionalAction, default=True,
        help="role switches read from DCGM through Prometheus at 1 s and 30 s scrapes (~5 min)",
    )  # fmt: skip
    ap.add_argument(
        "--only-dcgm", action="store_true", help="only the DCGM role switches (no control plane)"
    )
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    result: dict[str, Any] = {"machine": platform.platform(), "cpus": os.cpu_count()}
    if args.dcgm or args.only_dcgm:
        result["dcgm_role_switch"] = {}
        for setting in DCGM_SETTINGS:
            with tempfile.TemporaryDirectory(prefix="longtail-bench-prom-") as tmp:
                result["dcgm_role_switch"][setting[0]] = bench_dcgm(setting, Path(tmp))
    if args.only_dcgm:
        out = OUT.with_name("operator-dcgm.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out.relative_to(REPO)}")
        return 0
    result["role_switch"] = bench_switch(args.switch_workers, args.rounds)
    with tempfile.TemporaryDirectory(prefix="longtail-bench-cp-") as tmp:
        cluster = Cluster(Path(tmp))
        try:
            result["reconcile"] = bench_reconcile(cluster, sizes)
            result["process"] = bench_process(cluster, max(sizes))
        finally:
            cluster.down()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
