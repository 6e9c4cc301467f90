"""A loopback stand-in for NVIDIA's dcgm-exporter: its metric names, label sets and scales.

A test double (under ``tests/``): used by ``tests/integration/test_operator_dcgm.py`` and
``bench/operator.py`` (``--dcgm``), which import it by name with this directory on ``sys.path``.
A real Prometheus scrapes it; the operator reads the GPUs' idleness from that Prometheus.

What it copies from dcgm-exporter (``/metrics`` of a device-plugin node with pod attribution):

- the profiling fields as 0-1 ratios (``DCGM_FI_PROF_GR_ENGINE_ACTIVE``,
  ``DCGM_FI_PROF_SM_ACTIVE``) next to the device field as 0-100 (``DCGM_FI_DEV_GPU_UTIL``);
- each GPU's labels ``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``
  and the workload's ``container``, ``namespace``, ``pod`` (plus ``pod_uid`` when the exporter
  runs with pod-UID support, off by default as on DRA nodes: dcgm-exporter #718);
- its own sampling: values change only every ``collect_s`` (dcgm-exporter's
  ``--collect-interval``, 30 s by default), whatever the scrape interval;
- a pod whose GPU is released (the pod deleted) loses its series at the next collection.

The test scripts utilisation over time with :meth:`set_util` (a 0-1 ratio per pod); every
collection records ``(time, pod, ratio)`` in :attr:`samples`, so a test can measure latency
from the sample that showed a change.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROF_FIELDS = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE")
"""Ratios, 0-1."""
DEV_UTIL = "DCGM_FI_DEV_GPU_UTIL"
"""Percent, 0-100."""


@dataclass
class GpuPod:
    """One GPU attributed to one pod."""

    namespace: str
    pod: str
    gpu: int
    uid: str = ""
    util: float = 0.0
    """The ratio the next collection samples (what the GPU does now)."""
    sampled: float | None = None
    """The ratio of the last collection (what /metrics serves); None before the first."""


class DcgmExporter:
    """``/metrics`` in Prometheus' text format on ``host:port`` (0: any free port)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        collect_s: float = 1.0,
        hostname: str = "gpu-node-1",
        pod_uid: bool = False,
    ) -> None:
        self.collect_s, self.hostname, self.pod_uid = collect_s, hostname, pod_uid
        self.lock = threading.Lock()
        self.pods: dict[tuple[str, str], GpuPod] = {}
        self.samples: list[tuple[float, str, float]] = []
        """Every collection's ``(wall time, pod, ratio)`` of a pod whose ratio changed."""
        self._stop = threading.Event()
        handler = type("Handler", (_Handler,), {"exporter": self})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.host, self.port = host, int(self._server.server_address[1])
        self._threads = [
            threading.Thread(target=self._server.serve_forever, daemon=True),
            threading.Thread(target=self._collect_loop, daemon=True),
        ]
        for t in self._threads:
            t.start()

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def set_util(self, namespace: str, pod: str, ratio: float, uid: str = "") -> None:
        """The pod's GPU does ``ratio`` (0-1) from now on; adds the pod on first use."""
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"utilisation ratio {ratio} is outside 0-1")
        with self.lock:
            key = (namespace, pod)
            if key not in self.pods:
                self.pods[key] = GpuPod(namespace, pod, gpu=len(self.pods), uid=uid)
            self.pods[key].util = ratio
            if uid:
                self.pods[key].uid = uid

    def release(self, namespace: str, pod: str) -> None:
        """The pod is gone: its GPU's series disappear (at once, as the exporter's pod mapper
        no longer finds the pod on its next collection)."""
        with self.lock:
            self.pods.pop((namespace, pod), None)

    def last_change(self, pod: str, ratio: float) -> float:
        """Wall time of the collection that first sampled ``pod`` at ``ratio`` (latest one)."""
        with self.lock:
            times = [t for t, p, r in self.samples if p == pod and r == ratio]
        if not times:
            raise LookupError(f"no collection sampled {pod} at {ratio}")
        return times[-1]

    def _collect_loop(self) -> None:
        while not self._stop.wait(0.0):
            now = time.time()
            with self.lock:
                for p in self.pods.values():
                    if p.sampled != p.util:
                        self.samples.append((now, p.pod, p.util))
                    p.sampled = p.util
            self._stop.wait(self.collect_s)

    def render(self) -> str:
        """The exposition text of the last collection."""
        lines: list[str] = []
        with self.lock:
            pods = [p for p in self.pods.values() if p.sampled is not None]
        for name in (*PROF_FIELDS, DEV_UTIL):
            kind = "ratio" if name in PROF_FIELDS else "percent"
            lines.append(f"# HELP {name} GPU activity ({kind}).")
            lines.append(f"# TYPE {name} gauge")
            for p in pods:
                assert p.sampled is not None
                value = p.sampled if name in PROF_FIELDS else round(100 * p.sampled)
                lines.append(f"{name}{{{self._labels(p)}}} {value}")
        return "\n".join(lines) + "\n"

    def _labels(self, p: GpuPod) -> str:
        labels = {
            "gpu": str(p.gpu),
            "UUID": f"GPU-{p.gpu:08d}-0000-0000-0000-000000000000",
            "pci_bus_id": f"00000000:{p.gpu + 0x10:02X}:00.0",
            "device": f"nvidia{p.gpu}",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": self.hostname,
            "DCGM_FI_DRIVER_VERSION": "570.124.06",
            "container": "worker",
            "namespace": p.namespace,
            "pod": p.pod,
        }
        if self.pod_uid and p.uid:
            labels["pod_uid"] = p.uid
        return ",".join(f'{k}="{v}"' for k, v in labels.items())

    def close(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        for t in self._threads:
            t.join(timeout=5.0)


class _Handler(BaseHTTPRequestHandler):
    exporter: DcgmExporter

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/metrics":
            self.send_response(404)
            self.end_headers()
            return
        data = self.exporter.render().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass
