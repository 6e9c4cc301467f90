"""Real operator processes for the integration tests that need them (``test_operator_ha.py``,
``test_operator_restarts.py``): ``python -m longtail_operator`` (the image's entry point) as the
limited identity ``longtail-operator``, its own namespace holding the Lease, watching
``itha-*``, with ``fakekubelet.FakeKubelet`` playing the kubelet for the job's pods.

- :meth:`Operators.start`: one process, as one container that is never restarted.
- :meth:`Operators.restarted`: one process under a :class:`RestartLoop`, the kubelet's part for
  the operator's own container (``restartPolicy: Always``): each time the process exits it is
  started again with the same environment, so the same ``POD_NAME``.

Environment: what the chart sets (``helm/longtail/templates/deployment.yaml``), defaults for the
rest unless a test passes more (``env``). ``conftest.py`` imports the fixtures.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from opharness import get

if TYPE_CHECKING:
    from conftest import ControlPlane

LEASE = "longtail-operator-leader"
RELIST_S = 1.0
"""How soon the kubelet notices a container's exit (its PLEG relists every second)."""
BACKOFF_S = (0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0)
"""The kubelet's wait before the n-th restart, from the exit (CrashLoopBackOff): none for the
first after a quiet 10 minutes, then 10 s doubling to 300 s."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class OperatorProcess:
    """One ``python -m longtail_operator`` process and where its log and metrics are."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    metrics_port: int
    started: float = field(default_factory=time.monotonic)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def metric(self, series: str) -> float:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            lines = resp.read().decode().splitlines()
        return sum(float(line.split()[-1]) for line in lines if line.startswith(series))

    def reconciles(self) -> float:
        return self.metric("longtail_operator_reconcile_total{")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal it and return its exit status (:meth:`wait`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.wait(timeout)

    def wait(self, timeout: float = 30.0) -> int:
        """Its exit status; one that does not exit in time is aborted (PYTHONFAULTHANDLER:
        every thread's stack goes to its log) and the test fails."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(timeout=10)
            raise AssertionError(
                f"operator {self.name} did not exit within {timeout:.0f} s:\n" + self.text()[-6000:]
            ) from None


class RestartLoop:
    """The kubelet's part for one operator container: start the process again whenever it
    exits (after :data:`RELIST_S` plus the :data:`BACKOFF_S` of that restart), until
    :meth:`stop`. ``runs``: every process so far; ``exits``: ``(status, monotonic time)``."""

    def __init__(self, spawn: Any) -> None:
        self._spawn = spawn
        self.runs: list[OperatorProcess] = [spawn(0)]
        self.exits: list[tuple[int, float]] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="restart-loop", daemon=True)
        self._thread.start()

    @property
    def current(self) -> OperatorProcess:
        return self.runs[-1]

    def text(self) -> str:
        return "".join(f"--- run {i} ---\n{run.text()}" for i, run in enumerate(self.runs))

    def _loop(self) -> None:
        while True:
            code = self.current.proc.wait()
            self.exits.append((code, time.monotonic()))
            if self._stopping.is_set():
                return
            wait = RELIST_S + BACKOFF_S[min(len(self.exits) - 1, len(BACKOFF_S) - 1)]
            if self._stopping.wait(wait):
                return
            self.runs.append(self._spawn(len(self.runs)))

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """No more restarts; signal the current process and return its exit status."""
        self._stopping.set()
        code = self.current.stop(sig, timeout)
        self._thread.join(timeout=5)
        return code


class Operators:
    """Starts operator processes for one test; every one still running is stopped at the end
    (SIGTERM: each releases the Lease for the next test)."""

    def __init__(self, cp: ControlPlane, home: str, tmp_path: Path) -> None:
        self.cp, self.home, self.tmp_path = cp, home, tmp_path
        self.processes: list[OperatorProcess] = []
        self.loops: list[RestartLoop] = []

    def _spawn(self, name: str, env: dict[str, str], run: int = 0) -> OperatorProcess:
        port = _free_port()
        full = {
            **os.environ,
            "KUBECONFIG": str(self.cp.operator_kubeconfig),
            "PYTHONFAULTHANDLER": "1",
            "POD_NAME": name,  # the chart sets it from the downward API: the Lease identity
            "LONGTAIL_OPERATOR_NAMESPACES": "itha-*",
            "LONGTAIL_OPERATOR_OPERATOR_NAMESPACE": self.home,
            "LONGTAIL_OPERATOR_METRICS_HOST": "127.0.0.1",
            "LONGTAIL_OPERATOR_METRICS_PORT": str(port),
            "LONGTAIL_OPERATOR_WORKER_IMAGE": "longtail-worker:integration",
            **env,
        }
        log = self.tmp_path / (f"operator-{name}.log" if not run else f"operator-{name}-{run}.log")
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "longtail_operator"],
                env=full,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        op = OperatorProcess(name, proc, log, port)
        self.processes.append(op)
        return op

    def start(self, name: str, env: dict[str, str] | None = None) -> OperatorProcess:
        """A process in pod ``name`` (its ``POD_NAME``: its Lease identity)."""
        return self._spawn(name, env or {})

    def restarted(self, name: str, env: dict[str, str] | None = None) -> RestartLoop:
        """A process in pod ``name`` under a :class:`RestartLoop`."""
        loop = RestartLoop(lambda run: self._spawn(name, env or {}, run))
        self.loops.append(loop)
        return loop

    def stop_all(self) -> None:
        for loop in self.loops:
            loop._stopping.set()
        for _ in range(2):  # again for one a restart loop started meanwhile
            for op in list(self.processes):
                if op.proc.poll() is None:
                    os.kill(op.proc.pid, signal.SIGCONT)  # a frozen one must be able to stop
                    op.stop(signal.SIGTERM, timeout=30)
            for loop in self.loops:
                loop._thread.join(timeout=RELIST_S + 5)


@pytest.fixture(scope="module")
def home(control_plane: ControlPlane, rbac: None) -> Iterator[str]:
    """The operators' own namespace, with the home Role bound there (as the chart does)."""
    ns = control_plane.create_namespace(prefix="haop")
    control_plane.kubectl(
        "-n",
        ns,
        "create",
        "rolebinding",
        "home",
        "--clusterrole=longtail-operator-home",
        "--user=longtail-operator",
    )
    yield ns
    control_plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture
def operators(
    control_plane: ControlPlane, home: str, kubelet: Any, tmp_path: Path
) -> Iterator[Operators]:
    ops = Operators(control_plane, home, tmp_path)
    yield ops
    ops.stop_all()


def holder(cp: ControlPlane, home: str) -> str:
    """The Lease's holder ("" when none, or no Lease)."""
    if cp.kubectl("-n", home, "get", "lease", LEASE, check=False).returncode != 0:
        return ""
    return str((get(cp, home, "lease", LEASE).get("spec") or {}).get("holderIdentity") or "")


def wait_holder(cp: ControlPlane, home: str, op: OperatorProcess, timeout: float = 60) -> str:
    """Wait until ``op``'s pod holds the Lease (its identity is the pod's name)."""

    def held() -> str | None:
        assert op.proc.poll() is None, f"operator {op.name} exited:\n{op.text()[-3000:]}"
        who = holder(cp, home)
        return who if who == op.name else None

    return cp.wait_for(held, timeout=timeout, what=f"operator {op.name} to hold the Lease")


def wait_log(cp: ControlPlane, op: OperatorProcess, text: str, timeout: float = 60) -> None:
    def logged() -> bool:
        assert op.proc.poll() is None, f"operator {op.name} exited:\n{op.text()[-3000:]}"
        return text in op.text()

    cp.wait_for(logged, timeout=timeout, what=f"{text!r} in operator {op.name}'s log")


def job_namespace(cp: ControlPlane) -> str:
    """A namespace the operators watch (``itha-*``)."""
    return cp.create_namespace(prefix="itha")
