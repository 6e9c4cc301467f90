"""Plays the kubelet for the operator's integration tests (there is none on the test control
plane): registers a fake GPU Node and keeps it Ready, starts every pod the scheduler binds to it
(phase Running, Ready, a loopback pod IP), finishes graceful deletions, and fails pods on demand.

Runs as a background thread polling the API as admin every 0.2 s; every wait has a timeout.
A poll the API server does not answer (an outage: urllib3's ``MaxRetryError``, which is no
``OSError``, a socket error, an ``ApiException`` of status 0) is counted in
:attr:`FakeKubelet.unanswered` and retried on the next poll, as a real kubelet does; any other
failure is recorded in :attr:`FakeKubelet.errors`, which the operator fixture asserts empty.
Pod IPs come from :attr:`FakeKubelet.ips` (``{(namespace, pod): ip}``, set by a test to point a
pod at a loopback server it runs) or else from a pool of loopback addresses where nothing
listens, so the operator's HTTP calls fail fast (connection refused).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from datetime import UTC, datetime
from typing import Any

NODE = "fake-gpu-node"
NODE_LABEL = "longtail.dev/fake-node"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKubelet:
    def __init__(self, api_client: Any, gpus: int = 256) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.gpus = gpus
        self.ips: dict[tuple[str, str], str] = {}
        self.not_ready: set[tuple[str, str]] = set()
        self.linger: set[tuple[str, str]] = set()
        """Pods whose graceful deletion is not finished yet (a container slow to stop)."""
        self._pool = (
            f"127.0.{a}.{b}" for a, b in itertools.product(range(100, 200), range(1, 255))
        )
        self._assigned: dict[str, str] = {}  # pod uid -> ip
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-kubelet", daemon=True)
        self._last_beat = 0.0
        self.errors: list[str] = []
        self.unanswered = 0
        """Polls the API server did not answer (see the module text)."""

    def start(self) -> FakeKubelet:
        from kubernetes.client.exceptions import ApiException

        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE,
                "labels": {NODE_LABEL: "true", "kubernetes.io/hostname": NODE},
            },
        }
        try:
            self.core.create_node(node)
        except ApiException as exc:
            if exc.status != 409:
                raise
        self._heartbeat()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _heartbeat(self) -> None:
        # The node lifecycle controller taints a Node whose heartbeat is older than 40 s.
        amounts = {"cpu": "1024", "memory": "4Ti", "pods": "1000", "nvidia.com/gpu": str(self.gpus)}
        cond = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "fake kubelet (integration tests)",
            "lastHeartbeatTime": _now(),
        }
        status = {"capacity": amounts, "allocatable": amounts, "conditions": [cond]}
        self.core.patch_node_status(NODE, {"status": status})
        self._last_beat = time.monotonic()

    def _loop(self) -> None:
        import urllib3
        from kubernetes.client.exceptions import ApiException

        while not self._stop.is_set():
            try:
                if time.monotonic() - self._last_beat > 5.0:
                    self._heartbeat()
                self._tick()
            except (urllib3.exceptions.HTTPError, OSError):  # no answer: retried next poll
                self.unanswered += 1
            except ApiException as exc:
                if exc.status:  # keep going; tests see them
                    self.errors.append(repr(exc))
                else:  # the client's TLS failure: no answer either
                    self.unanswered += 1
            except ValueError as exc:
                self.errors.append(repr(exc))
            self._stop.wait(0.2)

    def _tick(self) -> None:
        pods = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={NODE}", _preload_content=False
        )
        for pod in json.loads(pods.data)["items"]:
            meta, status = pod["metadata"], pod.get("status") or {}
            key = (meta["namespace"], meta["name"])
            if meta.get("deletionTimestamp"):
                self._delete(key)
            elif status.get("phase", "Pending") == "Pending":
                self._run(pod, key)
            elif status.get("phase") == "Running":
                self._sync_ready(pod, key)

    def _delete(self, key: tuple[str, str]) -> None:
        from kubernetes.client.exceptions import ApiException

        if key in self.linger:
            return

        try:
            self.core.delete_namespaced_pod(key[1], key[0], grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _ip(self, pod: dict[str, Any], key: tuple[str, str]) -> str:
        uid = pod["metadata"]["uid"]
        if key in self.ips:
            return self.ips[key]
        if uid not in self._assigned:
            self._assigned[uid] = next(self._pool)
        return self._assigned[uid]

    def _conditions(self, ready: bool) -> list[dict[str, Any]]:
        flag = "True" if ready else "False"
        return [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()},
            {"type": "Initialized", "status": "True", "lastTransitionTime": _now()},
            {"type": "ContainersReady", "status": flag, "lastTransitionTime": _now()},
            {"type": "Ready", "status": flag, "lastTransitionTime": _now()},
        ]

    def _run(self, pod: dict[str, Any], key: tuple[str, str]) -> None:
        ip = self._ip(pod, key)
        status = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": "127.0.0.1",
            "startTime": _now(),
            "conditions": self._conditions(key not in self.not_ready),
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c["image"],
                    "imageID": "",
                    "ready": key not in self.not_ready,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": _now()}},
                }
                for c in pod["spec"]["containers"]
            ],
        }
        self.core.patch_namespaced_pod_status(key[1], key[0], {"status": status})

    def _sync_ready(self, pod: dict[str, Any], key: tuple[str, str]) -> None:
        want = key not in self.not_ready
        conds = {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}
        if (conds.get("Ready") == "True") != want:
            patch = {"status": {"conditions": self._conditions(want)}}
            self.core.patch_namespaced_pod_status(key[1], key[0], patch)

    def fail(self, namespace: str, name: str, message: str = "CUDA error: out of memory") -> None:
        """The worker's container exits 1: the pod's phase becomes Failed."""
        pod = self.core.read_namespaced_pod(name, namespace)
        status = {
            "phase": "Failed",
            "conditions": self._conditions(False),
            "containerStatuses": [
                {
                    "name": "worker",
                    "image": pod.spec.containers[0].image,
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": 1,
                            "reason": "Error",
                            "message": message,
                            "finishedAt": _now(),
                        }
                    },
                }
            ],
        }
        self.core.patch_namespaced_pod_status(name, namespace, {"status": status})
