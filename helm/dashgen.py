"""Grafana dashboards for Longtail, written as Python and rendered to the chart's JSON files.

``helm/chartgen.py`` calls :func:`render_all` and writes one JSON file per dashboard into
``helm/longtail/dashboards/``; the chart ships those files as ConfigMaps for Grafana's
dashboard sidecar (read with ``.Files.Get``, so ``{{pod}}`` legends are never templated by
Helm). Writing them here keeps panel ids unique, grid positions valid and every query on the
same label conventions; the JSON files are generated and drift-checked by ``make verify``.

Label conventions (the chart's PodMonitor relabels worker pods to these): ``namespace``,
``pod``, ``rljob`` (the RLJob's name) and ``worker_role`` (rollout, trainer, verifier,
drafter). Every dashboard has a ``datasource`` variable (no hard-coded datasource UID) and
``namespace``/``rljob`` (or ``namespace``) variables. Metric names come from
``longtail_api.metrics``; ``tests/unit/helm`` checks that every referenced name exists there
(DCGM names: ``dashpanels.DCGM_METRICS``). Panels are in ``helm/dashpanels.py``.
"""

from __future__ import annotations

from typing import Any

from dashpanels import DS, Panel, Row, job_overview_rows, operator_rows, rollout_rows

GRID_WIDTH = 24


def _target(expr: str, legend: str, ref: int) -> dict[str, Any]:
    return {
        "datasource": DS,
        "expr": expr,
        "legendFormat": legend,
        "refId": chr(ord("A") + ref),
        "range": True,
    }


def _field_config(p: Panel) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": p.unit}
    if p.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "fillOpacity": 30 if p.stack else 10,
            "lineWidth": 1,
            "showPoints": "never",
            "stacking": {"mode": "normal" if p.stack else "none", "group": "A"},
        }
    return {"defaults": defaults, "overrides": []}


def _panel_json(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    options: dict[str, Any] = {
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    if p.kind == "stat":
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    options.update(p.options)
    return {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DS,
        "gridPos": {"h": p.height, "w": p.width, "x": x, "y": y},
        "fieldConfig": _field_config(p),
        "options": options,
        "targets": [_target(e, legend, i) for i, (e, legend) in enumerate(p.queries)],
    }


def _layout(rows: list[Row]) -> list[dict[str, Any]]:
    """Place rows and their panels left to right, wrapping at the 24-column grid."""
    out: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row in rows:
        out.append(
            {
                "id": pid,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y = pid + 1, y + 1
        x, line_height = 0, 0
        for p in row.panels:
            if x + p.width > GRID_WIDTH:
                x, y, line_height = 0, y + line_height, 0
            out.append(_panel_json(p, pid, x, y))
            pid, x, line_height = pid + 1, x + p.width, max(line_height, p.height)
        y += line_height
    return out


def _variables(job_metric: str | None, ns_metric: str) -> list[dict[str, Any]]:
    def query_var(name: str, label: str, query: str) -> dict[str, Any]:
        return {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": DS,
            "query": {"query": query, "refId": f"{name}-var"},
            "definition": query,
            "refresh": 2,
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "sort": 1,
        }

    variables: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "refresh": 1,
            "current": {},
            "hide": 0,
        },
        query_var("namespace", "Namespace", f"label_values({ns_metric}, namespace)"),
    ]
    if job_metric is not None:
        query = f'label_values({job_metric}{{namespace=~"$namespace"}}, rljob)'
        variables.append(query_var("rljob", "RLJob", query))
    return variables


def dashboard(
    uid: str, title: str, rows: list[Row], *, job_metric: str | None, ns_metric: str
) -> dict[str, Any]:
    """A complete dashboard document (Grafana schema 39) ready for the sidecar."""
    return {
        "uid": uid,
        "title": title,
        "tags": ["longtail"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-3h", "to": "now"},
        "templating": {"list": _variables(job_metric, ns_metric)},
        "annotations": {"list": []},
        "links": [
            {
                "title": "Longtail dashboards",
                "type": "dashboards",
                "tags": ["longtail"],
                "asDropdown": True,
            }
        ],
        "panels": _layout(rows),
    }


def render_all() -> dict[str, dict[str, Any]]:
    """File name -> dashboard document, for every dashboard the chart ships."""
    return {
        "longtail-job-overview.json": dashboard(
            "longtail-job-overview",
            "Longtail / RL job overview",
            job_overview_rows(),
            job_metric="longtail_trainer_step",
            ns_metric="longtail_trainer_step",
        ),
        "longtail-rollout.json": dashboard(
            "longtail-rollout",
            "Longtail / Rollout & speculative decoding",
            rollout_rows(),
            job_metric="longtail_worker_role",
            ns_metric="longtail_worker_role",
        ),
        "longtail-operator.json": dashboard(
            "longtail-operator",
            "Longtail / Operator",
            operator_rows(),
            job_metric=None,
            ns_metric="longtail_operator_job_gpus",
        ),
    }
