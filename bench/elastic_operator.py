"""Benchmark: how fast the operator reacts to an elastic rollout's changes on the control plane.

Run: ``.venv/bin/python bench/elastic_operator.py`` (needs the cached control plane:
``make controlplane``; ``--rounds N``). Writes ``bench/results/elastic_operator.json`` and prints
the figures; nothing is asserted.

Starts the real v1.20 control plane (``e2e/controlplane.sh up``, as ``bench/operator.py``), the
operator in this process under ``kopf.testing.KopfRunner`` as its limited identity (the
integration tests' RBAC and settings: a 1 s reconcile period, woken by pod watch events), and
the integration tests' fake kubelet (``tests/integration/fakekubelet.py``, polling every
0.2 s). One RLJob with ``rollout.replicas: 2, minReplicas: 1``; each round:

1. eviction -> reaction: rollout pod 1 is evicted through the Eviction API (``policy/v1beta1``);
   the time from the API server's acceptance to ``status.rollout.lastShrink`` naming it, and
   to its replacement pod existing (a new UID);
2. readiness -> counted: the replacement is held not ready, then released; the time from the
   pod's ``Ready`` condition being True (as read through the API) to ``status.rollout.ready``
   counting it.

Every read is a GET through the API every 20 ms, so each figure includes up to that much
polling delay, and the fake kubelet's own 0.2 s poll is in (1) (it finishes the graceful
deletion). The trainer side's "first prompts after joining" is measured by the workers'
benchmarks, not here.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / p) for p in ("api", "operator", "tests/integration", "tests/doubles")]

from fakekubelet import FakeKubelet  # noqa: E402
from opharness import CLUSTER_BOUND  # noqa: E402  (the operator's cluster-wide roles)

from longtail_operator import handlers  # noqa: E402
from longtail_operator.settings import Settings  # noqa: E402

OUT = REPO / "bench" / "results" / "elastic_operator.json"
POLL_S = 0.02


def _bench_operator() -> Any:
    """``bench/operator.py`` (its :class:`Cluster`), loaded by path: its module name is the
    standard library's ``operator``."""
    spec = importlib.util.spec_from_file_location("bench_operator", REPO / "bench" / "operator.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait(check: Callable[[], Any], timeout: float, what: str) -> tuple[Any, float]:
    """``check()``'s first truthy value and ``time.monotonic()`` when it was read."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found, time.monotonic()
        time.sleep(POLL_S)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from kopf.testing import KopfRunner
    from kubernetes import client, config

    cluster = _bench_operator().Cluster(Path(tempfile.mkdtemp(prefix="bench-elastic-")))
    try:
        for role in CLUSTER_BOUND[2:]:
            cluster.kubectl(
                "create", "clusterrolebinding", role, f"--clusterrole={role}",
                "--user=longtail-operator",
            )  # fmt: skip
        cluster.kubectl(
            "-n", "default", "create", "rolebinding", "home",
            "--clusterrole=longtail-operator-home", "--user=longtail-operator",
        )  # fmt: skip
        admin = config.new_client_from_config(config_file=str(cluster.state / "admin.kubeconfig"))
        core, custom = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
        kubelet = FakeKubelet(admin).start()
        ns = cluster.namespace("bench-elastic")
        handlers.configure(Settings(metrics_port=0, http_timeout_s=1.0, reconcile_period_s=1.0))
        os.environ["KUBECONFIG"] = str(cluster.state / "operator.kubeconfig")
        argv = ["run", "--standalone", "--namespace=bench-*", "-m", "longtail_operator.handlers"]
        with KopfRunner(argv, timeout=60):
            wait(handlers.current, 60, "the operator to start")
            result = run_rounds(cluster, core, custom, kubelet, ns, args.rounds)
        kubelet.stop()
    finally:
        cluster.down()
    for key, val in result.items():  # here: KopfRunner holds stdout while it runs
        print(f"{key}: median {val['median_s'] * 1000:.0f} ms, max {val['max_s'] * 1000:.0f} ms "
              f"over {val['n']} rounds")  # fmt: skip
    result["host"] = {"machine": platform.machine(), "python": platform.python_version()}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(REPO)}")
    return 0


def run_rounds(
    cluster: Any, core: Any, custom: Any, kubelet: FakeKubelet, ns: str, rounds: int
) -> dict[str, Any]:
    m = yaml.safe_load((REPO / "examples" / "01-tiny-arith.yaml").read_text())
    m["metadata"] = {"name": "tiny", "namespace": ns}
    m["spec"]["rollout"].update(replicas=2, minReplicas=1)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(m))

    def status() -> dict[str, Any]:
        job = custom.get_namespaced_custom_object("longtail.dev", "v1alpha1", ns, "rljobs", "tiny")
        return job.get("status") or {}

    def pod_uid(name: str) -> str | None:
        found = core.list_namespaced_pod(ns, field_selector=f"metadata.name={name}").items
        return found[0].metadata.uid if found else None

    def pod_ready(name: str) -> bool:
        found = core.list_namespaced_pod(ns, field_selector=f"metadata.name={name}").items
        conds = (found[0].status.conditions or []) if found else []
        return any(c.type == "Ready" and c.status == "True" for c in conds)

    wait(lambda: (status().get("rollout") or {}).get("ready") == 2, 120, "2 rollout ready")
    shrink, recreate, counted = [], [], []
    victim = "tiny-rollout-1"
    for _ in range(rounds):
        before = pod_uid(victim)
        earlier = (status().get("rollout") or {}).get("lastShrink")
        kubelet.not_ready.add((ns, victim))  # the replacement waits until released
        body = {"apiVersion": "policy/v1beta1", "kind": "Eviction",
                "metadata": {"name": victim, "namespace": ns}}  # fmt: skip
        path = f"/api/v1/namespaces/{ns}/pods/{victim}/eviction"
        cluster.kubectl("create", "--raw", path, "-f", "-", input=json.dumps(body))
        t0 = time.monotonic()
        seen: dict[str, float] = {}

        def reacted(earlier: Any = earlier, before: Any = before, seen: Any = seen) -> bool:
            now = time.monotonic()
            last = (status().get("rollout") or {}).get("lastShrink") or {}
            if "shrink" not in seen and last != earlier and victim in last.get("pods", []):
                seen["shrink"] = now
            if "new" not in seen and pod_uid(victim) not in (None, before):
                seen["new"] = now
            return len(seen) == 2

        try:
            wait(reacted, 60, "the shrink and the replacement")
        except TimeoutError as e:  # say where it stood
            left = {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod(ns).items}
            raise TimeoutError(f"{e}; seen {seen}; status.rollout {status().get('rollout')}; "
                               f"pods {left}; replaced {before}") from e  # fmt: skip
        shrink.append(seen["shrink"] - t0)
        recreate.append(seen["new"] - t0)
        kubelet.not_ready.discard((ns, victim))
        _, t_ready = wait(lambda: pod_ready(victim), 30, "the replacement ready")
        _, t_counted = wait(
            lambda: (status().get("rollout") or {}).get("ready") == 2, 30, "counted ready"
        )
        counted.append(t_counted - t_ready)
        time.sleep(1.5)  # lastShrink.time is to the second: the next one must differ from it

    def summary(values: list[float]) -> dict[str, float]:
        return {"median_s": statistics.median(values), "max_s": max(values), "n": len(values)}

    out = {
        "eviction_to_status_s": summary(shrink),
        "eviction_to_replacement_pod_s": summary(recreate),
        "ready_to_counted_s": summary(counted),
    }
    return out


if __name__ == "__main__":
    sys.exit(main())
