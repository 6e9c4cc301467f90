"""Alert rules: `promtool check rules`, `promtool test rules` unit tests, and metric names.

``alerts_test.yaml`` (next to this file) holds the promtool unit tests: for every alert one
series set where it fires, with its exact labels and rendered annotations, and one where it
must stay quiet.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from longtail_chart import metricrefs

HERE = Path(__file__).resolve().parent
REQUIRED_ALERTS = {
    "LongtailJobStuck",
    "LongtailRolloutWorkerDown",
    "LongtailAcceptanceCollapsed",
    "LongtailHarvestNotAcknowledged",
    "LongtailOperatorReconcileErrors",
}


def promtool_run(promtool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], capture_output=True, text=True, timeout=120, cwd=HERE
    )


def test_check_rules(promtool: Path) -> None:
    proc = promtool_run(promtool, "check", "rules", str(metricrefs.ALERTS_FILE))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 7 rules found" in proc.stdout


def test_promtool_unit_tests(promtool: Path) -> None:
    proc = promtool_run(promtool, "test", "rules", "alerts_test.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_has_a_unit_test_and_the_required_ones_exist() -> None:
    rules = metricrefs.alert_rules()
    names = {r["alert"] for r in rules}
    assert names >= REQUIRED_ALERTS
    tests = yaml.safe_load((HERE / "alerts_test.yaml").read_text())["tests"]
    tested = {t["alertname"] for case in tests for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert tested == names
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_alert_metrics_are_declared() -> None:
    known = metricrefs.declared_names() | metricrefs.external_names()
    for where, expr in metricrefs.alert_exprs():
        missing = metricrefs.metric_names(expr) - known
        assert not missing, f"{where} references undeclared metrics {missing}"


def test_a_broken_expectation_fails(promtool: Path, tmp_path: Path) -> None:
    """The unit tests can fail: expecting the stuck-job alert on a progressing job does."""
    case = {
        "rule_files": [str(metricrefs.ALERTS_FILE)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": 'longtail_trainer_last_step_timestamp_seconds{rljob="x"}',
                        "values": "0+60x60",
                    }
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "50m",
                        "alertname": "LongtailJobStuck",
                        "exp_alerts": [{"exp_labels": {"severity": "critical", "rljob": "x"}}],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "broken_test.yaml"
    path.write_text(yaml.safe_dump(case))
    proc = promtool_run(promtool, "test", "rules", str(path))
    assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr
