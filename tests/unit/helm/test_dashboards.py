"""Grafana dashboards: structure, variables, metric names, and every query parsed by promtool.

A Grafana server cannot be installed here, so the JSON is checked the way Grafana would read it:
unique panel ids, grid positions inside the 24-column grid without overlaps, a datasource
variable used by every panel and query (no hard-coded UID), namespace/rljob variables. Every
metric a query references must be declared in ``longtail_api.metrics`` or be a listed DCGM /
Prometheus name; ``tests/integration/test_helm_monitoring.py`` checks them on live endpoints.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from longtail_chart import metricrefs

BOARDS = metricrefs.dashboards()
REQUIRED = {
    "longtail-job-overview.json": (
        "step time",
        "reward",
        "accuracy",
        "version",
        "gpus",
        "weight sync",
        "rollout pause",
        "gb/s",
    ),
    "longtail-rollout.json": ("tokens/s", "batch", "sd-on", "accepted length", "dcgm"),
    "longtail-operator.json": ("reconciles", "errors", "role-switch latency"),
}


def test_the_three_dashboards_exist_with_unique_uids() -> None:
    assert set(BOARDS) == set(REQUIRED)
    uids = [b["uid"] for b in BOARDS.values()]
    assert len(set(uids)) == len(uids)


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_structure(name: str) -> None:
    board = BOARDS[name]
    panels = list(metricrefs.dashboard_panels(board))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {name}"
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert set(g) == {"h", "w", "x", "y"} and all(isinstance(v, int) for v in g.values())
        assert g["w"] >= 1 and g["h"] >= 1 and g["x"] >= 0 and g["y"] >= 0
        assert g["x"] + g["w"] <= 24, f"{name}: panel {p['id']} exceeds the 24-column grid"
        cover = {(g["x"] + dx, g["y"] + dy) for dx in range(g["w"]) for dy in range(g["h"])}
        assert not cells & cover, f"{name}: panel {p['id']} {p['title']!r} overlaps another"
        cells |= cover
    titles = " ".join(p["title"].lower() for p in panels)
    for word in REQUIRED[name]:
        assert word in titles, f"{name} has no panel about {word!r}"


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_datasource_variable_and_no_hardcoded_uids(name: str) -> None:
    board = BOARDS[name]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    assert "namespace" in variables
    if name != "longtail-operator.json":
        assert "rljob" in variables
    want = {"type": "prometheus", "uid": "${datasource}"}
    for panel in metricrefs.dashboard_panels(board):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == want, f"{name}: panel {panel['id']}"
        assert panel["targets"], f"{name}: panel {panel['id']} has no query"
        for target in panel["targets"]:
            assert target["datasource"] == want
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"] == want
    # Nothing that looks like a concrete datasource UID anywhere in the document.
    text = json.dumps(board)
    assert '"uid": "${datasource}"' in text
    uids = {m for m in _all_values(board, "uid") if m not in {board["uid"], "${datasource}"}}
    assert not uids, f"{name}: hard-coded uids {uids}"


def _all_values(node: Any, key: str) -> list[Any]:
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                out.append(v)
            out += _all_values(v, key)
    elif isinstance(node, list):
        for v in node:
            out += _all_values(v, key)
    return out


def test_job_queries_use_the_variables() -> None:
    for where, expr in metricrefs.dashboard_exprs():
        if "operator" in where.split(":")[0] or "variable" in where:
            continue
        assert '=~"$namespace"' in expr, f"{where}: query ignores $namespace: {expr}"


def test_every_referenced_metric_is_declared() -> None:
    refs = metricrefs.references()
    known = metricrefs.declared_names() | metricrefs.external_names()
    unknown = {name: where for name, where in refs.items() if name not in known}
    assert not unknown, f"metrics referenced but declared nowhere: {unknown}"
    # Sanity of the extraction itself: names everywhere in the catalogue are found.
    assert "longtail_rollout_generated_tokens_total" in refs
    assert "DCGM_FI_DEV_GPU_UTIL" in refs
    assert metricrefs.metric_names(
        'sum by (le) (rate(a_bucket{x="y"}[5m])) * on (pod) group_left (role) (b == 1) > 2'
    ) == {"a_bucket", "b"}


def test_every_query_parses_with_promtool(promtool: Path, tmp_path: Path) -> None:
    exprs = list(metricrefs.dashboard_exprs())
    assert len(exprs) > 40
    path = tmp_path / "dashboard-queries.rules.yaml"
    path.write_text(yaml.safe_dump(metricrefs.promtool_rules(exprs)))
    proc = subprocess.run(
        [str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in proc.stdout
    # And promtool does reject a broken query (the check is not vacuous).
    path.write_text(yaml.safe_dump(metricrefs.promtool_rules([("x", "sum by (pod (up)")])))
    bad = subprocess.run(
        [str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode != 0
