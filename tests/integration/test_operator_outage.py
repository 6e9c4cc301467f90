"""Issue #32, item 1: a short outage of the real kube-apiserver of the test control plane.

The operator (``opharness.py``: in-process under kopf, the limited identity, the fake kubelet)
runs a job; ``ControlPlane.apiserver_stopped()`` stops kube-apiserver alone (etcd, the
controller-manager and the scheduler keep running) and starts it again with the same flags and
port, also when the test fails. While it is down the operator's ``/readyz`` answers 503 and the
failed reconciles are counted (``longtail_operator_reconcile_errors_total{reason="ApiError"}``);
the job loop and the fake kubelet survive it. Once the API server answers again, the operator
recreates a deleted pod and creates the pod of a scale change within ``CONVERGE_S``: before the
fix the job daemon died on urllib3's ``MaxRetryError`` and kopf restarted it only after its
fixed 60 s.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest
from opharness import apply, job, job_manifest, pods, wait_phase

from longtail_api import metrics as names
from longtail_operator.settings import Settings

if TYPE_CHECKING:
    from conftest import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

OUTAGE_S = 10.0
"""How long the API server stays down (at least: stopping it takes a moment too)."""
CONVERGE_S = 10.0
"""Deadline, from the API server's return, for the operator to recreate the deleted pod and to
create the third replica of the scale change: a few seconds of reconcile (the job loop retries
every <= 2 s while the API does not answer), far under kopf's 60 s daemon restart that this
replaces."""
ERRORS = names.OPERATOR_RECONCILE_ERRORS_TOTAL.name


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def api_errors(settings: Settings) -> float:
    """``longtail_operator_reconcile_errors_total{reason="ApiError"}`` as /metrics shows it."""
    code, text = _get(f"http://127.0.0.1:{settings.metrics_port}/metrics")
    assert code == 200, text
    series = f'{ERRORS}{{reason="ApiError"}} '
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(series))


def test_operator_rides_out_an_api_server_outage(
    control_plane: ControlPlane, ns: str, kubelet: Any, settings: Settings
) -> None:
    cp = control_plane
    readyz = f"http://127.0.0.1:{settings.metrics_port}/readyz"
    apply(cp, job_manifest(ns))
    wait_phase(cp, ns, "Running")
    assert _get(readyz) == (200, "ready\n")
    errors_before, unanswered_before = api_errors(settings), kubelet.unanswered
    old_uid = pods(cp, ns)["tiny-rollout-0"]["metadata"]["uid"]

    with cp.apiserver_stopped():
        down = time.monotonic()

        def not_ready() -> str | None:
            code, text = _get(readyz)
            return text if code == 503 else None

        text = cp.wait_for(not_ready, timeout=OUTAGE_S, what="/readyz 503 while the API is down")
        assert "the Kubernetes API server does not answer" in text, text
        cp.wait_for(
            lambda: api_errors(settings) > errors_before,
            timeout=OUTAGE_S,
            what=f'{ERRORS}{{reason="ApiError"}} to count the failed reconciles',
        )
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down)))
        assert _get(readyz)[0] == 503
    back = time.monotonic()  # kube-apiserver's /readyz answers ok again

    assert kubelet.unanswered > unanswered_before  # the fake kubelet met the outage, survived
    cp.wait_for(lambda: _get(readyz)[0] == 200, timeout=CONVERGE_S, what="/readyz 200 again")
    cp.kubectl("-n", ns, "delete", "pod", "tiny-rollout-0", "--wait=false")
    patch = '{"spec": {"rollout": {"replicas": 3}}}'
    cp.kubectl("-n", ns, "patch", "rljob", "tiny", "--type=merge", "-p", patch)

    def recreated() -> set[str] | None:
        """The operator's part: the deleted pod made again (a new uid) and the third replica."""
        got = {n: p["metadata"]["uid"] for n, p in pods(cp, ns).items()}
        made = {"tiny-rollout-0"} if got.get("tiny-rollout-0", old_uid) != old_uid else set()
        made |= {"tiny-rollout-2"} & set(got)
        return made if len(made) == 2 else None

    left = CONVERGE_S - (time.monotonic() - back)
    cp.wait_for(
        recreated,
        timeout=max(left, 0.0),
        what=f"the deleted pod recreated and the third rollout replica created within "
        f"{CONVERGE_S:.0f} s of the API server's return",
    )

    def all_ready() -> dict[str, Any] | None:
        roles = job(cp, ns).get("status", {}).get("roles", {}).get("rollout", {})
        return roles if roles.get("ready") == roles.get("total") == 3 else None

    # Scheduling them waits for kube-scheduler, whose watches reconnect with their own backoff
    # (about 6 s here): not the operator's part, so a longer deadline.
    cp.wait_for(all_ready, timeout=60, what="status: 3 of 3 rollout replicas ready")
    assert not kubelet.errors, kubelet.errors
