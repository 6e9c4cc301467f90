"""Settings from the environment, and the operator's /metrics, /healthz, /readyz server."""

from __future__ import annotations

import pytest
from httpcall import http

from longtail_api import metrics as names
from longtail_operator.metrics import Health, HealthServer, OperatorMetrics
from longtail_operator.settings import ENV_DOCS, Settings, SettingsError, from_env


def test_settings_from_env() -> None:
    s = from_env(
        {
            "LONGTAIL_OPERATOR_NAMESPACES": "a, b,",
            "LONGTAIL_OPERATOR_METRICS_PORT": "0",
            "LONGTAIL_OPERATOR_RECONCILE_PERIOD_S": "0.5",
            "LONGTAIL_OPERATOR_WORKER_IMAGE": "reg/img:2",
        }
    )
    assert s.namespaces == ("a", "b") and s.metrics_port == 0
    assert s.reconcile_period_s == 0.5 and s.worker_image == "reg/img:2"
    assert from_env({}) == Settings()
    # Every setting has a variable, except the token key (loaded from its Secret at start-up).
    assert set(ENV_DOCS) == set(Settings.__dataclass_fields__) - {"token_key"}
    with pytest.raises(SettingsError, match="LONGTAIL_OPERATOR_METRICS_PORT: must be an integer"):
        from_env({"LONGTAIL_OPERATOR_METRICS_PORT": "http"})
    with pytest.raises(SettingsError, match="IMAGE_PULL_POLICY: must be one of"):
        from_env({"LONGTAIL_OPERATOR_IMAGE_PULL_POLICY": "Sometimes"})
    with pytest.raises(SettingsError, match="RECONCILE_PERIOD_S: must be > 0"):
        from_env({"LONGTAIL_OPERATOR_RECONCILE_PERIOD_S": "0"})


def test_health_server_serves_every_operator_metric() -> None:
    clock = [0.0]
    metrics, health = OperatorMetrics(), Health(stale_after_s=30.0, clock=lambda: clock[0])
    metrics.reconcile("ok", 0.01)
    metrics.jobs({"Running": 2})
    metrics.job_gpus("ns", "job", 8, 2, 1)
    metrics.harvested("ns", "job", 3.0)
    metrics.role_switch("drafter-train", "acknowledged", 0.02)
    metrics.status_poll("worker", True)
    metrics.unreachable_workers("ns", "job", 1)
    metrics.idleness_source_up("ns", "job", up=False)
    server = HealthServer(metrics, health, "127.0.0.1", 0).start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert http(base + "/readyz")[::2] == (503, b"starting\n")
        health.started = True
        assert http(base + "/readyz")[0] == 200 and http(base + "/healthz")[0] == 200
        clock[0] = 31.0  # heartbeat stale: the event loop is stuck
        assert http(base + "/healthz")[0] == 503
        code, _, raw = http(base + "/metrics")
        text = raw.decode()
        assert code == 200
        for spec in names.OPERATOR_METRICS:
            assert f"# HELP {spec.name} " in text, spec.name
        assert 'longtail_operator_jobs{phase="Running"} 2.0' in text
        assert 'longtail_operator_idleness_source_up{namespace="ns",rljob="job"} 0.0' in text
        assert (
            'longtail_operator_harvested_gpu_seconds_total{namespace="ns",rljob="job"} 3.0' in text
        )
        assert 'longtail_operator_unreachable_workers{namespace="ns",rljob="job"} 1.0' in text
        metrics.forget_job("ns", "job")
        assert "longtail_operator_unreachable_workers{" not in metrics.exposition().decode()
    finally:
        server.stop()
