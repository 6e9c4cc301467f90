"""The chart's optional dcgm-exporter ServiceMonitor (``dcgmMonitor.*``) and its scrape config.

Renders each ``dcgmMonitor.labels`` convention (honor, relabel, exported) with the real helm
and checks the ServiceMonitor; checks that a bad convention is refused naming the value;
unit-tests :func:`longtail_chart.dcgmscrape.scrape_config` (field mapping, errors) and checks
its output with ``promtool check config``; and evaluates the RLJob queries (the default one and
the ``exported`` one, :data:`~longtail_chart.dcgmscrape.EXPORTED_QUERY`) with
``promtool test rules`` on series labelled as each convention leaves them.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from longtail_api.policies import DEFAULT_DCGM_QUERY
from longtail_chart.dcgmscrape import EXPORTED_QUERY, scrape_config

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "helm" / "longtail"
TEMPLATE = "templates/dcgm-servicemonitor.yaml"
NAME = "t-longtail-dcgm-exporter"
EXPORTER_LABELS = {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x7k2p"}
"""Target labels service discovery attaches: the exporter pod's own namespace and name."""
COPY_BACK = [
    {
        "sourceLabels": [f"exported_{label}"],
        "regex": "(.+)",
        "targetLabel": label,
        "replacement": "$1",
        "action": "replace",
    }
    for label in ("pod", "namespace")
]


def dcgm_monitor(render: Any, *sets: str, namespace: str = "lt") -> dict[str, Any]:
    docs = render(set=("dcgmMonitor.enabled=true", *sets), namespace=namespace)
    found = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert [d["metadata"]["name"] for d in found] == [NAME]
    return found[0]


def test_off_by_default(render) -> None:
    assert not [d for d in render() if d["kind"] == "ServiceMonitor"]
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["dcgmMonitor"]
    assert defaults == {
        "enabled": False,
        "additionalLabels": {},
        "namespace": "gpu-operator",
        "selector": {"app": "nvidia-dcgm-exporter"},
        "portName": "gpu-metrics",
        "interval": "30s",
        "scrapeTimeout": "10s",
        "labels": "honor",
    }


@pytest.mark.parametrize(
    ("convention", "honor", "relabelings"),
    [("honor", True, None), ("relabel", False, COPY_BACK), ("exported", False, None)],
)
def test_each_label_convention(render, convention: str, honor: bool, relabelings: Any) -> None:
    monitor = dcgm_monitor(render, f"dcgmMonitor.labels={convention}")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    # In the release namespace, selecting the exporter's Service in its own namespace.
    assert monitor["metadata"]["namespace"] == "lt"
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": ["gpu-operator"]}
    assert spec["selector"] == {"matchLabels": {"app": "nvidia-dcgm-exporter"}}
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] == "gpu-metrics"
    assert endpoint["interval"] == "30s" and endpoint["scrapeTimeout"] == "10s"
    assert endpoint["honorLabels"] is honor
    assert endpoint.get("metricRelabelings") == relabelings


def test_honor_is_the_default_convention(render) -> None:
    assert dcgm_monitor(render)["spec"]["endpoints"][0]["honorLabels"] is True


def test_namespace_selector_labels_and_port_follow_the_values(render) -> None:
    monitor = dcgm_monitor(
        render,
        "dcgmMonitor.namespace=monitoring",
        "dcgmMonitor.selector.app=null",
        "dcgmMonitor.selector.app\\.kubernetes\\.io/name=dcgm-exporter",
        "dcgmMonitor.portName=metrics",
        "dcgmMonitor.interval=15s",
        "dcgmMonitor.additionalLabels.release=kube-prometheus-stack",
        namespace="longtail-system",
    )
    assert monitor["metadata"]["namespace"] == "longtail-system"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": ["monitoring"]}
    assert spec["selector"] == {"matchLabels": {"app.kubernetes.io/name": "dcgm-exporter"}}
    assert spec["endpoints"][0]["port"] == "metrics"
    assert spec["endpoints"][0]["interval"] == "15s"


def test_bad_values_refused_naming_the_field(helm) -> None:
    base = ("template", "t", str(CHART), "--set", "dcgmMonitor.enabled=true")
    proc = helm(*base, "--set", "dcgmMonitor.labels=honour", check=False)
    assert proc.returncode != 0
    assert (
        'dcgmMonitor.labels: dcgmMonitor.labels must be one of the following: "honor", '
        '"relabel", "exported"'
    ) in proc.stderr
    # The template refuses it too where schema validation is skipped.
    proc = helm(
        *base, "--set", "dcgmMonitor.labels=honour", "--skip-schema-validation", check=False
    )
    assert proc.returncode != 0
    assert 'dcgmMonitor.labels must be one of honor, relabel, exported, got "honour"' in proc.stderr
    # An empty selector would select every Service in the namespace.
    proc = helm(*base, "--set", "dcgmMonitor.selector.app=null", check=False)
    assert proc.returncode != 0
    assert "dcgmMonitor.selector: Must have at least 1 properties" in proc.stderr
    proc = helm(*base, "--set", "dcgmMonitor.namespace=GPU_Operator", check=False)
    assert proc.returncode != 0
    assert "dcgmMonitor.namespace: Does not match pattern" in proc.stderr


# --- scrape_config ---------------------------------------------------------------------------


def test_scrape_config_maps_the_first_endpoint(render) -> None:
    monitor = dcgm_monitor(render, "dcgmMonitor.labels=relabel")
    config = scrape_config(monitor, "dcgm", ["10.0.0.7:9400"], EXPORTER_LABELS)
    assert config == {
        "job_name": "dcgm",
        "honor_labels": False,
        "metrics_path": "/metrics",
        "scrape_interval": "30s",
        "scrape_timeout": "10s",
        "metric_relabel_configs": [
            {
                "source_labels": [f"exported_{label}"],
                "regex": "(.+)",
                "target_label": label,
                "replacement": "$1",
                "action": "replace",
            }
            for label in ("pod", "namespace")
        ],
        "static_configs": [{"targets": ["10.0.0.7:9400"], "labels": EXPORTER_LABELS}],
    }
    honor = scrape_config(dcgm_monitor(render), "dcgm", ["10.0.0.7:9400"], EXPORTER_LABELS)
    assert honor["honor_labels"] is True and "metric_relabel_configs" not in honor
    exported = dcgm_monitor(render, "dcgmMonitor.labels=exported")
    exported_config = scrape_config(exported, "dcgm", ["10.0.0.7:9400"], EXPORTER_LABELS)
    assert exported_config["honor_labels"] is False
    assert "metric_relabel_configs" not in exported_config


def test_scrape_config_defaults_strings_and_actions() -> None:
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "spec": {
            "endpoints": [
                {
                    "port": "metrics",
                    "metricRelabelings": [
                        {"sourceLabels": ["a", "b"], "separator": ";", "regex": 1,
                         "targetLabel": "c", "action": "Replace"},
                        {"regex": "tmp_.*", "action": "LabelDrop"},
                        {"sourceLabels": ["x"], "modulus": 4, "targetLabel": "shard",
                         "action": "hashmod", "replacement": None},
                    ],
                },
                {"port": "ignored", "honorLabels": True},
            ]
        },
    }  # fmt: skip
    config = scrape_config(monitor, "j", [], {})
    assert config == {
        "job_name": "j",
        "honor_labels": False,  # not set: Prometheus' and the Prometheus Operator's default
        "metric_relabel_configs": [
            {"source_labels": ["a", "b"], "separator": ";", "regex": "1", "target_label": "c",
             "action": "replace"},
            {"regex": "tmp_.*", "action": "labeldrop"},
            {"source_labels": ["x"], "modulus": 4, "target_label": "shard", "action": "hashmod"},
        ],
        "static_configs": [{"targets": [], "labels": {}}],
    }  # fmt: skip


VALID = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "ServiceMonitor",
    "spec": {"endpoints": [{"port": "metrics"}]},
}


def _broken(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    monitor = copy.deepcopy(VALID)
    node: Any = monitor
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return monitor


@pytest.mark.parametrize(
    ("monitor", "message"),
    [
        (_broken(("kind",), "PodMonitor"), r"^kind: expected ServiceMonitor, got 'PodMonitor'"),
        (_broken(("kind",), KeyError), r"^kind: expected ServiceMonitor, got None"),
        (_broken(("apiVersion",), "v1"), r"^apiVersion: expected monitoring\.coreos\.com/"),
        (_broken(("spec",), KeyError), r"^spec\.endpoints: a ServiceMonitor needs at least one"),
        (_broken(("spec", "endpoints"), []), r"^spec\.endpoints: .* at least one endpoint"),
        (_broken(("spec", "endpoints"), KeyError), r"^spec\.endpoints: "),
        (_broken(("spec", "endpoints", 0), "metrics"), r"^spec\.endpoints\[0\]: expected a map"),
        (
            _broken(("spec", "endpoints", 0, "relabelings"), [{"action": "keep"}]),
            r"^spec\.endpoints\[0\]\.relabelings: not translated",
        ),
        (
            _broken(("spec", "endpoints", 0, "honorLabels"), "yes"),
            r"^spec\.endpoints\[0\]\.honorLabels: expected true or false",
        ),
        (
            _broken(("spec", "endpoints", 0, "metricRelabelings"), [{"target": "pod"}]),
            r"^spec\.endpoints\[0\]\.metricRelabelings\[0\]\.target: not a relabel field",
        ),
        (
            _broken(("spec", "endpoints", 0, "metricRelabelings"), [{"sourceLabels": "pod"}]),
            r"^spec\.endpoints\[0\]\.metricRelabelings\[0\]\.sourceLabels: expected a list",
        ),
    ],
)
def test_scrape_config_refuses_what_it_cannot_translate(monitor: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        scrape_config(monitor, "j", ["h:1"], {})


def test_scrape_configs_pass_promtool(render, promtool, tmp_path) -> None:
    configs = [
        scrape_config(
            dcgm_monitor(render, f"dcgmMonitor.labels={convention}"),
            f"dcgm-{convention}",
            ["10.0.0.7:9400"],
            EXPORTER_LABELS,
        )
        for convention in ("honor", "relabel", "exported")
    ]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump({"scrape_configs": configs}))
    proc = subprocess.run(
        [str(promtool), "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


# --- the RLJob queries on each convention's labels --------------------------------------------

WORKLOAD = {"rollout-0": "0.05", "trainer-0": "0.9"}
"""Workload pods in namespace ``ml`` and their DCGM_FI_PROF_GR_ENGINE_ACTIVE (0-1)."""


def _series(convention: str) -> list[dict[str, str]]:
    """The scraped series as each convention leaves them (what the real Prometheus run of the
    integration tests shows), plus a GPU no pod uses and a pod of another namespace."""
    out = []
    workload = [("ml", pod, value) for pod, value in WORKLOAD.items()]
    for gpu, (ns, pod, value) in enumerate([*workload, ("other", "rollout-0", "0.5")]):
        own = {"namespace": ns, "pod": pod, "container": "worker"}
        if convention == "honor":
            labels = own
        else:
            labels = {**EXPORTER_LABELS, **{f"exported_{k}": v for k, v in own.items()}}
            if convention == "relabel":
                labels.update(namespace=ns, pod=pod)
        out.append({"labels": {"gpu": str(gpu), **labels}, "value": value})
    out.append({"labels": {"gpu": "9", **EXPORTER_LABELS}, "value": "0"})
    return out


def _selector(labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return "DCGM_FI_PROF_GR_ENGINE_ACTIVE{" + inner + "}"


@pytest.mark.parametrize(
    ("convention", "query"),
    [
        ("honor", DEFAULT_DCGM_QUERY),
        ("relabel", DEFAULT_DCGM_QUERY),
        ("exported", EXPORTED_QUERY),
        ("exported", None),  # the default query finds nothing there
    ],
)
def test_rljob_query_per_convention(promtool, tmp_path, convention: str, query: Any) -> None:
    expr = (query or DEFAULT_DCGM_QUERY).replace("$namespace", "ml").replace("$window", "2m")
    expected = [] if query is None else [
        {"labels": f'{{pod="{pod}"}}', "value": float(value) * 100}
        for pod, value in WORKLOAD.items()
    ]  # fmt: skip
    test = {
        "rule_files": [],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": [
                    {"series": _selector(s["labels"]), "values": f"{s['value']}x4"}
                    for s in _series(convention)
                ],
                "promql_expr_test": [{"expr": expr, "eval_time": "2m", "exp_samples": expected}],
            }
        ],
    }
    path = tmp_path / "query_test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run(
        [str(promtool), "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, expr + "\n" + proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
