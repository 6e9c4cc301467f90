"""A real Prometheus (Debian's 2.42, ``e2e/monitoring.sh``) on a loopback port, for the tests.

Not a double: the real server, started the one way the tests and benchmarks share (it sits with
the doubles because they import it by name from here too). Used by
``tests/integration/test_operator_dcgm.py`` (the operator's harvest reading dcgm-exporter series
through it) and ``bench/operator.py --dcgm``.
:class:`PrometheusServer` writes the scrape config, starts the server, waits until it answers
and stops it; :meth:`~PrometheusServer.stop` and :meth:`~PrometheusServer.start` again on the
same port and data directory is how a test takes Prometheus down and brings it back.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from httpcall import free_port

from longtail_chart.monitoring import binaries_dir


def get_json(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


class PrometheusServer:
    """One Prometheus process with ``config`` (a parsed prometheus.yml) in ``workdir``."""

    def __init__(self, config: dict[str, Any], workdir: Path, port: int | None = None) -> None:
        self.binary = binaries_dir() / "prometheus"  # RuntimeError saying why when it cannot
        self.workdir, self.port = workdir, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> PrometheusServer:
        log = (self.workdir / "prometheus.log").open("a")
        self.proc = subprocess.Popen(
            [
                str(self.binary),
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline, delay = time.monotonic() + timeout, 0.1
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"prometheus exited {self.proc.returncode}; see {self.workdir}/prometheus.log"
                )
            try:
                get_json(self.url + "/api/v1/status/buildinfo", timeout=2.0)
                return self
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(delay)
                delay = min(2 * delay, 1.0)
        raise AssertionError(f"prometheus did not answer within {timeout:.0f} s on {self.url}")

    def targets(self) -> list[dict[str, Any]]:
        return get_json(self.url + "/api/v1/targets")["data"]["activeTargets"]  # type: ignore[no-any-return]

    def query(self, expr: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": expr})
        body = get_json(f"{self.url}/api/v1/query?{q}")
        assert body["status"] == "success", body
        return body["data"]["result"]  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.proc = None
