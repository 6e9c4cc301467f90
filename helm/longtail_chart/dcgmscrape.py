"""The chart's dcgm-exporter ServiceMonitor as a plain Prometheus scrape config.

The chart's ``templates/dcgm-servicemonitor.yaml`` tells the Prometheus Operator how to scrape
NVIDIA's dcgm-exporter (``dcgmMonitor.*`` values). Tests have no Prometheus Operator, so
:func:`scrape_config` does its translation for the first endpoint of the rendered manifest:
``tests/unit/helm/test_dcgm_monitor.py`` checks the result with ``promtool check config``, and
the integration tests load it into a real Prometheus that scrapes a fake exporter, to see the
series come out with the labels the RLJob's DCGM query expects for each ``dcgmMonitor.labels``
convention.

Service discovery is replaced by a static target list: the caller passes the exporter's
address and the target labels discovery would have attached (the exporter pod's own
``namespace``, ``pod``...). Only the endpoint fields the chart can set are translated; any
other field raises ValueError rather than being silently dropped. :data:`EXPORTED_QUERY` is the
RLJob query for the ``exported`` convention (docs/install.md). Pure: standard library only.
"""

from __future__ import annotations

from typing import Any

EXPORTED_QUERY = (
    "avg by (pod) (label_replace(avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    '{exported_namespace="$namespace"}[$window]), "pod", "$1", "exported_pod", "(.+)")) * 100'
)
"""``spec.harvest.prometheus.query`` for ``dcgmMonitor.labels: exported``: the default query
(``longtail_api.policies.DEFAULT_DCGM_QUERY``) reading ``exported_namespace`` and
``exported_pod`` instead; ``label_replace`` puts the workload's pod name on ``pod``, the label
the operator reads (``$1`` is PromQL's, not substituted: only ``$namespace`` and ``$window``
are)."""

ENDPOINT_FIELDS = {
    "port": None,  # resolved by the caller's targets
    "path": "metrics_path",
    "scheme": "scheme",
    "interval": "scrape_interval",
    "scrapeTimeout": "scrape_timeout",
    "honorLabels": "honor_labels",
    "honorTimestamps": "honor_timestamps",
    "metricRelabelings": "metric_relabel_configs",
}
"""ServiceMonitor endpoint field -> Prometheus scrape config key (None: not a config key)."""

RELABEL_FIELDS = {
    "sourceLabels": "source_labels",
    "separator": "separator",
    "targetLabel": "target_label",
    "regex": "regex",
    "modulus": "modulus",
    "replacement": "replacement",
    "action": "action",
}
"""Prometheus Operator ``RelabelConfig`` field -> Prometheus ``relabel_config`` key."""


def relabel_config(rule: Any, where: str) -> dict[str, Any]:
    """One ``metricRelabelings`` entry as a Prometheus ``relabel_config`` (snake_case keys).

    Unset fields are left out (Prometheus applies its defaults); ``regex``, ``replacement`` and
    ``separator`` are always strings, ``action`` lower case as the Prometheus Operator writes
    it. Raises ValueError naming ``where`` and the field for anything it cannot translate.
    """
    if not isinstance(rule, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(rule).__name__}")
    out: dict[str, Any] = {}
    for key, value in rule.items():
        if key not in RELABEL_FIELDS:
            raise ValueError(f"{where}.{key}: not a relabel field ({', '.join(RELABEL_FIELDS)})")
        if value is None:
            continue
        if key == "sourceLabels":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{where}.sourceLabels: expected a list of label names")
            value = list(value)
        elif key == "modulus":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{where}.modulus: expected an integer")
        elif key == "action":
            value = str(value).lower()
        else:
            value = str(value)
        out[RELABEL_FIELDS[key]] = value
    return out


def scrape_config(
    monitor: dict[str, Any], job_name: str, targets: list[str], target_labels: dict[str, str]
) -> dict[str, Any]:
    """One Prometheus ``scrape_configs`` entry equivalent to ``monitor``'s first endpoint.

    ``monitor`` is a rendered ServiceMonitor (parsed YAML); ``targets`` are ``host:port``
    addresses and ``target_labels`` the labels service discovery would attach to them. The
    entry has ``job_name``, ``honor_labels`` (``honorLabels``, default false),
    ``scrape_interval``/``scrape_timeout``/``metrics_path``/``scheme``/``honor_timestamps``
    where the endpoint sets them, ``metric_relabel_configs`` from ``metricRelabelings`` (see
    :func:`relabel_config`) and ``static_configs: [{targets, labels}]``.

    Raises ValueError naming the field when ``monitor`` is not a ServiceMonitor (``kind``,
    ``apiVersion``), has no ``spec.endpoints``, or its first endpoint has a field that cannot
    be translated.
    """
    if not isinstance(monitor, dict):
        raise ValueError(f"monitor: expected a mapping, got {type(monitor).__name__}")
    if monitor.get("kind") != "ServiceMonitor":
        raise ValueError(f"kind: expected ServiceMonitor, got {monitor.get('kind')!r}")
    api_version = monitor.get("apiVersion")
    if not isinstance(api_version, str) or not api_version.startswith("monitoring.coreos.com/"):
        raise ValueError(f"apiVersion: expected monitoring.coreos.com/*, got {api_version!r}")
    spec = monitor.get("spec")
    endpoints = spec.get("endpoints") if isinstance(spec, dict) else None
    if not isinstance(endpoints, list) or not endpoints:
        raise ValueError("spec.endpoints: a ServiceMonitor needs at least one endpoint")
    endpoint = endpoints[0]
    if not isinstance(endpoint, dict):
        raise ValueError("spec.endpoints[0]: expected a mapping")

    config: dict[str, Any] = {"job_name": job_name, "honor_labels": False}
    for key, value in endpoint.items():
        where = f"spec.endpoints[0].{key}"
        if key not in ENDPOINT_FIELDS:
            raise ValueError(f"{where}: not translated ({', '.join(ENDPOINT_FIELDS)})")
        name = ENDPOINT_FIELDS[key]
        if name is None or value is None:
            continue
        if key in ("honorLabels", "honorTimestamps"):
            if not isinstance(value, bool):
                raise ValueError(f"{where}: expected true or false, got {value!r}")
            config[name] = value
        elif key == "metricRelabelings":
            if not isinstance(value, list):
                raise ValueError(f"{where}: expected a list")
            rules = [relabel_config(r, f"{where}[{i}]") for i, r in enumerate(value)]
            if rules:
                config[name] = rules
        else:
            config[name] = str(value)
    config["static_configs"] = [{"targets": list(targets), "labels": dict(target_labels)}]
    return config
