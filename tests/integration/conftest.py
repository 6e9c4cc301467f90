"""A real Kubernetes control plane for integration tests.

The session-scoped fixture ``control_plane`` builds (or reuses the cached) kube-apiserver,
kube-controller-manager, kube-scheduler and kubectl v1.20.2 with ``e2e/controlplane.sh build``,
starts them with etcd on loopback ports with ``e2e/controlplane.sh up DIR`` and always stops them
with ``e2e/controlplane.sh down DIR`` at the end of the session, also when a test fails.

Usage in a test::

    pytestmark = pytest.mark.integration

    def test_something(control_plane, rljob_crd):        # rljob_crd: CRD applied, Established
        ns = control_plane.create_namespace()               # Pods can be created in it at once
        control_plane.kubectl("-n", ns, "apply", "-f", "examples/01-tiny-arith.yaml")
        out = control_plane.kubectl("-n", ns, "get", "pods", as_operator=True, check=False)
        api = control_plane.api_client(as_operator=True)    # kubernetes.client.ApiClient
        control_plane.wait_for(lambda: ..., timeout=30, what="...")

``ControlPlane`` fields: ``api_url``, ``state_dir`` (the ``up`` DIR: logs/, env, pki/),
``admin_kubeconfig`` (system:masters), ``operator_kubeconfig`` (user ``longtail-operator``, no
grants until a test binds a Role; current context set, so ``KUBECONFIG=... kopf run`` works),
``kubectl_path`` (kubectl v1.20.2). ``kubectl()`` returns the ``CompletedProcess``; with
``check=True`` (default) a non-zero exit raises ``KubectlError`` with stderr.
``with control_plane.apiserver_stopped(): ...`` is an outage of kube-apiserver alone, restarted
(same flags and port) and ready again when the block is left.

There is no kubelet: tests play its part (register Node objects, patch Pod status).

If the control plane cannot be built or started, every test using the fixture FAILS with the
reason. Set ``LONGTAIL_SKIP_INTEGRATION=1`` to skip them instead (e.g. on a machine without
Debian's archive).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[2]
# Helper modules of this directory (fakekubelet.py) are imported by name under
# --import-mode=importlib, which does not put test directories on sys.path.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
SCRIPT = REPO / "e2e" / "controlplane.sh"
SKIP_ENV = "LONGTAIL_SKIP_INTEGRATION"
BUILD_TIMEOUT_S = 3600.0  # cold build is ~6-10 min on 2 cores; cached: seconds
UP_TIMEOUT_S = 300.0

T = TypeVar("T")


class KubectlError(AssertionError):
    """A kubectl command that was expected to succeed failed."""


def wait_for(
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.2,
    max_interval: float = 2.0,
) -> T:
    """Call ``check`` with exponential backoff until it returns a truthy value; return it.

    Raises AssertionError naming ``what`` (and the last value seen) after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}"
            )
        time.sleep(interval)
        interval = min(interval * 2, max_interval)


@dataclass
class ControlPlane:
    """A running control plane started by ``e2e/controlplane.sh up``."""

    api_url: str
    state_dir: Path
    admin_kubeconfig: Path
    operator_kubeconfig: Path
    kubectl_path: Path
    _clients: dict[bool, Any] = field(default_factory=dict, repr=False)

    @staticmethod
    def wait_for(
        check: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.2
    ) -> T:
        """``wait_for`` (module function) as a method, for tests that only get the fixture."""
        return wait_for(check, timeout=timeout, what=what, interval=interval)

    def kubeconfig(self, *, as_operator: bool = False) -> Path:
        return self.operator_kubeconfig if as_operator else self.admin_kubeconfig

    def kubectl(
        self,
        *args: str,
        as_operator: bool = False,
        check: bool = True,
        input: str | None = None,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the control plane's own kubectl (v1.20.2) as admin or as the operator identity.

        Returns the CompletedProcess (text stdout/stderr). With ``check=True`` (default) a
        non-zero exit raises KubectlError carrying the command and its stderr.
        """
        cmd = [
            str(self.kubectl_path),
            "--kubeconfig",
            str(self.kubeconfig(as_operator=as_operator)),
            "--cache-dir",
            str(self.state_dir / "kubectl-cache"),
            *args,
        ]
        proc = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=timeout, cwd=REPO
        )
        if check and proc.returncode != 0:
            who = "operator" if as_operator else "admin"
            raise KubectlError(
                f"kubectl {' '.join(args)} (as {who}) exited {proc.returncode}:\n"
                f"{proc.stderr.strip()}\n{proc.stdout.strip()}"
            )
        return proc

    def api_client(self, *, as_operator: bool = False) -> Any:
        """A ``kubernetes.client.ApiClient`` for the admin or the operator identity."""
        if as_operator not in self._clients:
            from kubernetes import config  # imported lazily: only integration tests need it

            self._clients[as_operator] = config.new_client_from_config(
                config_file=str(self.kubeconfig(as_operator=as_operator))
            )
        return self._clients[as_operator]

    def create_namespace(self, prefix: str = "it", *, timeout: float = 60.0) -> str:
        """Create a uniquely named namespace and wait until Pods can be created in it.

        (The ServiceAccount admission plugin rejects Pods until kube-controller-manager has made
        the namespace's ``default`` ServiceAccount and its token.)
        """
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.kubectl("create", "namespace", name)

        def sa_token() -> str:
            return self.kubectl(
                "-n",
                name,
                "get",
                "serviceaccount",
                "default",
                "-o",
                "jsonpath={.secrets[0].name}",
                check=False,
            ).stdout.strip()

        wait_for(sa_token, timeout=timeout, what=f"the default ServiceAccount token in {name}")
        return name

    @contextlib.contextmanager
    def apiserver_stopped(self) -> Iterator[None]:
        """An API outage for the ``with`` block: only kube-apiserver stops (``e2e/controlplane.sh
        stop-apiserver``); on leaving, whatever happened inside, it starts again with the same
        flags and port and this returns once its /readyz answers ok (the session's other tests
        share this control plane)."""
        try:
            self._script("stop-apiserver")
            yield
        finally:
            self._script("start-apiserver")

    def _script(self, command: str) -> None:
        log = self.state_dir / "controlplane-script.log"
        proc = _run_script([command, str(self.state_dir)], log, UP_TIMEOUT_S)
        if proc.returncode != 0:
            raise AssertionError(
                f"e2e/controlplane.sh {command} {self.state_dir} exited {proc.returncode}. "
                f"Last lines of {log}:\n{_tail(log)}\nComponent logs: {self.state_dir / 'logs'}"
            )


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(cannot read {path}: {exc})"


def _run_script(args: list[str], log: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run e2e/controlplane.sh; stderr (progress) goes to ``log``; stdout is returned."""
    with log.open("a") as err:
        return subprocess.run(
            ["bash", str(SCRIPT), *args],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=timeout,
            cwd=REPO,
        )


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """Session-wide real control plane (etcd, apiserver, controller-manager, scheduler)."""
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1 is set: integration tests against a real control plane skipped")
    if shutil.which("bash") is None:
        pytest.fail("bash is required to run e2e/controlplane.sh")

    state = tmp_path_factory.mktemp("controlplane")
    log = state / "controlplane-script.log"

    t0 = time.monotonic()
    try:
        build = _run_script(["build"], log, BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"e2e/controlplane.sh build took over {BUILD_TIMEOUT_S:.0f} s; log: {log}")
    if build.returncode != 0:
        pytest.fail(
            "could not build the Kubernetes control plane binaries (e2e/controlplane.sh build "
            f"exited {build.returncode}). Set {SKIP_ENV}=1 to skip integration tests on a machine "
            f"where this cannot work. Last lines of {log}:\n{_tail(log)}",
        )
    build_s = time.monotonic() - t0
    bin_dir = Path(_run_script(["bin"], log, 30).stdout.strip())

    t1 = time.monotonic()
    try:
        try:
            up = _run_script(["up", str(state)], log, UP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"e2e/controlplane.sh up did not finish in {UP_TIMEOUT_S:.0f} s; log: {log}"
            )
        if up.returncode != 0:
            pytest.fail(
                f"e2e/controlplane.sh up {state} exited {up.returncode}. Last lines of {log}:\n"
                f"{_tail(log)}\nComponent logs: {state / 'logs'}"
            )
        lines = up.stdout.strip().splitlines()
        api_url = lines[-1] if lines else ""
        if not api_url.startswith("https://"):
            pytest.fail(f"e2e/controlplane.sh up printed no API URL (stdout: {up.stdout!r})")
        with log.open("a") as f:
            f.write(f"[conftest] build {build_s:.1f} s, up {time.monotonic() - t1:.1f} s\n")
        yield ControlPlane(
            api_url=api_url,
            state_dir=state,
            admin_kubeconfig=state / "admin.kubeconfig",
            operator_kubeconfig=state / "operator.kubeconfig",
            kubectl_path=bin_dir / "kubectl",
        )
    finally:
        down = _run_script(["down", str(state)], log, 120)
        if down.returncode != 0:
            # Do not hide a test failure behind this one, but do not stay silent either.
            print(f"WARNING: e2e/controlplane.sh down {state} exited {down.returncode}; see {log}")


CRD_FILE = REPO / "crds" / "rljob.yaml"
CRD_NAME = "rljobs.longtail.dev"


@pytest.fixture(scope="session")
def rljob_crd(control_plane: ControlPlane) -> str:
    """The generated RLJob CRD (crds/rljob.yaml) applied and Established; returns its name."""
    # kubectl v1.20's client-side validation does not know `x-kubernetes-validations` (CEL, added
    # in v1.23) and would refuse the file; the server accepts it and drops that field.
    control_plane.kubectl("apply", "--validate=false", "-f", str(CRD_FILE))
    control_plane.kubectl(
        "wait",
        "--for=condition=Established",
        f"crd/{CRD_NAME}",
        "--timeout=60s",
        timeout=90,
    )

    # Established means the API serves it; wait until discovery lists it too, so `kubectl get
    # rljobs` and the garbage collector's REST mapping see the new kind.
    def discovered() -> bool:
        out = control_plane.kubectl("api-resources", "--api-group=longtail.dev", check=False)
        return "rljobs" in out.stdout

    wait_for(discovered, timeout=60, what="rljobs in API discovery")
    return CRD_NAME


# The operator's fixtures (settings, rbac, kubelet, operator, ns: one operator per test module
# that asks for one) live with its helpers in opharness.py, those of real operator processes
# (home, operators) in opprocess.py; imported here so that every test_operator*.py module can
# request them by name.
from opharness import kubelet, ns, operator, rbac, settings  # noqa: E402, F401
from opprocess import home, operators  # noqa: E402, F401
