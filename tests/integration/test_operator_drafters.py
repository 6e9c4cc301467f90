"""Issue #22 against the real v1.20 control plane: dedicated drafter pods (``spec.drafter``).

An RLJob with ``spec.drafter`` gets drafter pods that run ``longtail worker drafter`` with the
environment a rollout pod gets (trainer, weights and drafter-exchange URLs, the job token, the
job config) and the model volume of ``spec.drafter.template``; their command is checked with
the CLI's own argparse parser (parsed, not executed: it must name a worker role the CLI knows).
They live through the lifecycle of every role: Ready (the fake kubelet makes them so; the
operator polls the loopback ``FakeTrainer`` as pod 0), ``DrafterReady`` follows their
readiness, their GPUs show as drafter capacity (``status.gpus.drafter``, the ``DRAFTER``
printer column, the ``state="drafter"`` gauge), a failed one is recreated and counted, suspend
deletes them after the trainer's checkpoint and resume brings them back, and past
``backoffLimit`` the job fails. Fixtures: ``opharness.py``.
"""

from __future__ import annotations

import contextlib
import io
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest
from opharness import apply, cond, events, get, job, job_manifest, pods, trainer_at, wait_phase

from longtail_cli.main import build_parser
from longtail_operator.settings import Settings

if TYPE_CHECKING:
    from conftest import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

DRAFTERS = ("tiny-drafter-0", "tiny-drafter-1")
MODELS = {
    "spec": {
        "volumes": [{"name": "models", "emptyDir": {}}],
        "containers": [
            {"name": "worker", "volumeMounts": [{"name": "models", "mountPath": "/models"}]}
        ],
    }
}


def manifest(ns: str, **spec: Any) -> dict[str, Any]:
    drafter = {"replicas": 2, "resources": {"gpus": 1, "cpu": "1", "memory": "2Gi"}}
    return job_manifest(ns, backoffLimit=1, drafter={**drafter, "template": MODELS}, **spec)


def worker(pod: dict[str, Any]) -> dict[str, Any]:
    [c] = [c for c in pod["spec"]["containers"] if c["name"] == "worker"]
    return c


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in worker(pod)["env"]}


def ready(pod: dict[str, Any]) -> bool:
    conds = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions") or []}
    return conds.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp")


def cli_refusal(args: list[str]) -> str | None:
    """None when ``longtail ARGS`` parses as ``worker drafter`` plus the forwarded options;
    else what the parser said."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parsed, rest = build_parser().parse_known_args(args)
    except SystemExit:
        return err.getvalue().strip() or "the parser exited"
    if (parsed.command, getattr(parsed, "role", None)) != ("worker", "drafter"):
        return f"parsed as {parsed}"
    return None if rest[:3] == ["--host", "0.0.0.0", "--port"] else f"left over: {rest}"


def drafter_gauge(settings: Settings, ns: str) -> str | None:
    url = f"http://127.0.0.1:{settings.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    want = f'longtail_operator_job_gpus{{namespace="{ns}",rljob="tiny",state="drafter"}} '
    return next((line[len(want) :] for line in text.splitlines() if line.startswith(want)), None)


def check_drafter_pods(cp: ControlPlane, ns: str, settings: Settings) -> None:
    """Both drafter pods exist, are Ready and carry what a rollout pod carries."""
    got = pods(cp, ns)
    rollout = env_of(got["tiny-rollout-0"])
    host = f"tiny-trainer-0.tiny-trainer.{ns}.svc"
    for i, name in enumerate(DRAFTERS):
        p = got[name]
        assert ready(p), p["status"]
        c, env = worker(p), env_of(p)
        assert c["command"] == ["longtail"]
        assert c["args"] == [
            "worker",
            "drafter",
            "--host",
            "0.0.0.0",
            "--port",
            str(settings.worker_port),
        ]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert env["LONGTAIL_TRAINER_URL"] == f"http://{host}:{settings.trainer_port}"
        assert env["LONGTAIL_DRAFTER_URL"] == f"http://{host}:{settings.trainer_port}"
        assert env["LONGTAIL_WEIGHTS_URL"] == rollout["LONGTAIL_WEIGHTS_URL"]
        assert env["LONGTAIL_AUTH_TOKEN"] == rollout["LONGTAIL_AUTH_TOKEN"]
        assert env["LONGTAIL_CONFIG"] == "/etc/longtail/rljob.yaml"
        assert (env["LONGTAIL_ROLE"], env["LONGTAIL_REPLICA_INDEX"]) == ("drafter", str(i))
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["config"] == "/etc/longtail" and mounts["models"] == "/models"
        assert (p["spec"]["hostname"], p["spec"]["subdomain"]) == (name, "tiny-drafter")


def test_dedicated_drafter_pods_run_with_every_role_s_lifecycle(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings
) -> None:
    cp = control_plane
    trainer = trainer_at(kubelet, settings, ns)
    try:
        apply(cp, manifest(ns))
        j = wait_phase(cp, ns, "Running")
        check_drafter_pods(cp, ns, settings)
        assert j["status"]["roles"]["drafter"] == {"ready": 2, "total": 2, "failed": 0}
        assert cond(j, "DrafterReady") == ("True", "AllReplicasReady")
        assert j["status"]["gpus"]["drafter"] == 2 and j["status"]["gpus"]["total"] == 4
        svc = get(cp, ns, "service", "tiny-drafter")
        assert svc["spec"]["clusterIP"] == "None"
        # The job's NetworkPolicy admits them as the job's own pods (they reach the trainer).
        policy = get(cp, ns, "networkpolicy", "tiny-workers")["spec"]
        labels = pods(cp, ns)["tiny-drafter-0"]["metadata"]["labels"]
        peer = policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
        assert all(labels.get(k) == v for k, v in peer.items())
        assert {r["port"] for r in policy["ingress"][0]["ports"]} >= {
            settings.trainer_port,
            settings.worker_port,
        }
        # kubectl get shows the drafter GPUs (PHASE .. HARVESTED, DRAFTER, AGE).
        head, row = cp.kubectl("-n", ns, "get", "rljobs").stdout.splitlines()[:2]
        at = head.index("DRAFTER")  # empty cells (no reward yet) leave gaps: read by position
        assert row[at:].split()[0] == "2", (head, row)
        cp.wait_for(lambda: drafter_gauge(settings, ns) == "2.0", timeout=30, what="gauge")

        # Readiness comes from the pods: one drafter not Ready -> DrafterReady False, 1 GPU.
        kubelet.not_ready.add((ns, "tiny-drafter-1"))

        def one_ready() -> dict[str, Any] | None:
            j = job(cp, ns)
            return j if j["status"]["gpus"].get("drafter") == 1 else None

        j = cp.wait_for(one_ready, timeout=30, what="drafter capacity 1 with one pod not ready")
        assert cond(j, "DrafterReady") == ("False", "ReplicasNotReady")
        kubelet.not_ready.discard((ns, "tiny-drafter-1"))
        cp.wait_for(
            lambda: cond(job(cp, ns), "DrafterReady") == ("True", "AllReplicasReady"),
            timeout=30,
            what="DrafterReady again",
        )

        # A failed drafter pod is recreated and counted; the other pods stay.
        before = {n: p["metadata"]["uid"] for n, p in pods(cp, ns).items()}
        kubelet.fail(ns, "tiny-drafter-0", "drafter worker: CUDA error")

        def recreated() -> bool:
            p = pods(cp, ns).get("tiny-drafter-0")
            return p is not None and p["metadata"]["uid"] != before["tiny-drafter-0"] and ready(p)

        cp.wait_for(recreated, timeout=60, what="tiny-drafter-0 recreated")
        j = wait_phase(cp, ns, "Running")
        assert j["status"]["roles"]["drafter"]["failed"] == 1
        after = {n: p["metadata"]["uid"] for n, p in pods(cp, ns).items()}
        assert all(after[n] == before[n] for n in before if n != "tiny-drafter-0")
        failed = get(cp, ns, "events", "--field-selector", "reason=WorkerFailed")["items"]
        assert any("drafter worker: CUDA error" in e["message"] for e in failed), failed

        # Suspend: the trainer checkpoints, then the drafter pods go; resume brings them back.
        apply(cp, manifest(ns, suspend=True))
        wait_phase(cp, ns, "Suspended")
        cp.wait_for(lambda: pods(cp, ns) == {}, timeout=60, what="pods deleted on suspend")
        assert trainer.checkpoints and "CheckpointSaved" in events(cp, ns)
        j = job(cp, ns)
        assert j["status"]["gpus"]["drafter"] == 0
        assert cond(j, "DrafterReady") == ("False", "JobSuspended")
        apply(cp, manifest(ns, suspend=False))
        j = wait_phase(cp, ns, "Running")
        cp.wait_for(
            lambda: all(ready(pods(cp, ns).get(n, {"metadata": {}})) for n in DRAFTERS),
            timeout=60,
            what="drafter pods back on resume",
        )
        check_drafter_pods(cp, ns, settings)

        # A second failure is over backoffLimit=1: the job fails and says which role.
        kubelet.fail(ns, "tiny-drafter-1", "segfault")
        j = wait_phase(cp, ns, "Failed")
        assert cond(j, "Failed") == ("True", "BackoffLimitExceeded")
        [c] = [c for c in j["status"]["conditions"] if c["type"] == "Failed"]
        assert "drafter pods failed" in c["message"], c
        cp.wait_for(lambda: pods(cp, ns) == {}, timeout=60, what="all pods deleted after Failed")
    finally:
        trainer.close()


def test_drafter_pod_command_is_accepted_by_the_cli(
    control_plane: ControlPlane, ns: str, settings: Settings
) -> None:
    """The pod's container command, run through ``longtail``'s own parser (not executed):
    before issue #22 the CLI knew no ``drafter`` worker and every drafter pod exited at once."""
    cp = control_plane
    apply(cp, manifest(ns))
    got = cp.wait_for(
        lambda: pods(cp, ns).get("tiny-drafter-0"), timeout=60, what="drafter pod created"
    )
    c = worker(got)
    assert c["command"] == ["longtail"]
    refusal = cli_refusal(list(c["args"]))
    assert refusal is None, f"`longtail {' '.join(c['args'])}` is refused by the CLI: {refusal}"
    # What `longtail worker drafter` derives from the pod's environment (references resolved as
    # the kubelet would) names the trainer, its weight server and the drafter exchange.
    from longtail_workers import podenv

    env = {k: v for k, v in env_of(got).items() if isinstance(v, str)}
    env |= {"LONGTAIL_POD_NAME": "tiny-drafter-0", "LONGTAIL_AUTH_TOKEN": "t"}
    argv = podenv.pod_args("drafter", list(c["args"][2:]), env)
    host = f"http://tiny-trainer-0.tiny-trainer.{ns}.svc"
    for option, value in (
        ("--job", "/etc/longtail/rljob.yaml"),
        ("--trainer-url", f"{host}:{settings.trainer_port}"),
        ("--weights-url", f"{host}:{settings.weights_port}"),
        ("--drafters-url", f"{host}:{settings.trainer_port}"),
    ):
        assert option in argv and argv[argv.index(option) + 1] == value, (option, argv)
