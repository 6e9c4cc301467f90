"""Which metrics the dashboards and alerts reference, and which names Longtail declares.

Used by the chart's tests (``tests/unit/helm``: every referenced name is declared in
``longtail_api.metrics`` or is a listed DCGM/Prometheus name; every expression parses with
``promtool``) and by ``tests/integration/test_helm_monitoring.py`` (a real Prometheus scraping
real endpoints has every referenced series). PromQL is not fully parsed here: label matchers,
strings, ranges and grouping clauses are removed, and what remains that looks like an
identifier not followed by ``(`` is a metric name. ``promtool`` parses the full expressions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "longtail"
DASHBOARD_DIR = CHART / "dashboards"
ALERTS_FILE = CHART / "files" / "alerts.rules.yaml"

PROMETHEUS_BUILTIN: tuple[str, ...] = ("up",)
"""Series Prometheus itself adds to every target."""
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$namespace": ".*",
    "$rljob": ".*",
}
"""Values substituted for Grafana variables so dashboard queries are plain PromQL (the
namespace and rljob variables as Grafana sends them with "All" selected: their allValue)."""

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([A-Za-z_:][A-Za-z0-9_:]*)\s*(\()?")


def substitute_variables(expr: str) -> str:
    """The expression with Grafana's variables replaced by plain values."""
    for var, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (exposition names, e.g. ``x_bucket``)."""
    text = _STRINGS.sub('""', substitute_variables(expr))
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def dashboards() -> dict[str, dict[str, Any]]:
    """File name -> parsed dashboard JSON, from the chart's dashboards directory."""
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARD_DIR.glob("*.json"))}


def dashboard_panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including panels nested in collapsed rows."""
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def dashboard_exprs() -> Iterator[tuple[str, str]]:
    """(where, expr) for every query of every dashboard, and for its variable queries."""
    for name, board in dashboards().items():
        for panel in dashboard_panels(board):
            for target in panel.get("targets", []):
                yield f"{name}: panel {panel['id']} {panel['title']!r}", target["expr"]
        for var in board.get("templating", {}).get("list", []):
            query = var.get("query")
            if var.get("type") == "query" and isinstance(query, dict):
                inner = re.fullmatch(r"label_values\((.*),\s*\w+\)", query["query"])
                if inner:
                    yield f"{name}: variable {var['name']}", inner.group(1)


def alert_rules(path: Path = ALERTS_FILE) -> list[dict[str, Any]]:
    """Every rule of a Prometheus rule file."""
    data = yaml.safe_load(path.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def alert_exprs(path: Path = ALERTS_FILE) -> Iterator[tuple[str, str]]:
    for rule in alert_rules(path):
        yield f"alert {rule['alert']}", rule["expr"]


def references() -> dict[str, list[str]]:
    """Metric name -> where it is referenced (dashboards and alerts)."""
    out: dict[str, list[str]] = {}
    for where, expr in [*dashboard_exprs(), *alert_exprs()]:
        for name in metric_names(expr):
            out.setdefault(name, []).append(where)
    return out


def declared_names() -> set[str]:
    """Every exposition name Longtail declares, with histogram series expanded."""
    from longtail_api import metrics

    names: set[str] = set()
    for spec in metrics.ALL_METRICS:
        if spec.kind == "histogram":
            names.update(spec.name + suffix for suffix in HISTOGRAM_SUFFIXES)
        else:
            names.add(spec.name)
    for name in metrics.ROLLOUT_METRIC_NAMES:
        names.add(name)
        # The engine's names carry no kind; its histograms expose the usual three series.
        names.update(name + suffix for suffix in HISTOGRAM_SUFFIXES)
    return names


def external_names() -> set[str]:
    """Referenced names that Longtail does not export itself: DCGM and Prometheus built-ins."""
    from longtail_chart.dashpanels import DCGM_METRICS

    return set(DCGM_METRICS) | set(PROMETHEUS_BUILTIN)


def promtool_rules(exprs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """A rule file with one recording rule per expression, for ``promtool check rules``."""
    rules = [
        {"record": f"longtail:check:{i}", "expr": substitute_variables(expr)}
        for i, (_, expr) in enumerate(exprs)
    ]
    return {"groups": [{"name": "dashboard-queries", "rules": rules}]}
