"""Grafana dashboards for Longtail, built with grafana-foundation-sdk and rendered to JSON.

:mod:`longtail_chart.chartgen` calls :func:`render_all` and writes one JSON file per dashboard
into ``helm/longtail/dashboards/``; the chart ships those files as ConfigMaps for Grafana's
dashboard sidecar (read with ``.Files.Get``, so ``{{pod}}`` legends are never templated by
Helm). The SDK's typed builders write the document (panel, query, variable and link shapes as
Grafana's schema defines them); this module only chooses what goes in, numbers the panels and
places them. The JSON files are generated and drift-checked by ``make verify``.

Label conventions (the chart's PodMonitor relabels worker pods to these): ``namespace``,
``pod``, ``rljob`` (the RLJob's name) and ``worker_role`` (rollout, trainer, verifier,
drafter). Every dashboard has a ``datasource`` variable (no hard-coded datasource UID) and
``namespace``/``rljob`` (or ``namespace``) variables. Metric names come from
``longtail_api.metrics``; ``tests/unit/helm`` checks that every referenced name exists there
(DCGM names: ``dashpanels.DCGM_METRICS``). Panels are in :mod:`longtail_chart.dashpanels`.
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import common, prometheus, stat, timeseries
from grafana_foundation_sdk.builders import dashboard as gdb
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as gdm

from longtail_chart.dashpanels import DS, Panel, Row, job_overview_rows, operator_rows, rollout_rows

GRID_WIDTH = 24
DATASOURCE = gdm.DataSourceRef(type_val=DS["type"], uid=DS["uid"])
"""Every panel, query and query variable reads the dashboard's ``datasource`` variable."""

PanelBuilder = timeseries.Panel | stat.Panel


def _query(expr: str, legend: str, ref: int) -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .datasource(DATASOURCE)
        .expr(expr)
        .legend_format(legend)
        .ref_id(chr(ord("A") + ref))
        .range()
    )


def _timeseries(p: Panel) -> timeseries.Panel:
    stacking = cm.StackingMode.NORMAL if p.stack else cm.StackingMode.NONE
    return (
        timeseries.Panel()
        .draw_style(cm.GraphDrawStyle.LINE)
        .fill_opacity(30 if p.stack else 10)
        .line_width(1)
        .show_points(cm.VisibilityMode.NEVER)
        .stacking(common.StackingConfig().mode(stacking).group("A"))
        .legend(
            common.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common.VizTooltipOptions()
            .mode(cm.TooltipDisplayMode.MULTI)
            .sort(cm.SortOrder.DESCENDING)
        )
    )


def _stat() -> stat.Panel:
    reduce = common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)
    return stat.Panel().reduce_options(reduce)


def _panel(p: Panel, pid: int, x: int, y: int) -> PanelBuilder:
    if p.kind not in ("timeseries", "stat"):
        raise ValueError(f"panel {p.title!r}: kind {p.kind!r} is not timeseries or stat")
    builder: PanelBuilder = _timeseries(p) if p.kind == "timeseries" else _stat()
    builder.id(pid).title(p.title).description(p.description).datasource(DATASOURCE)
    builder.unit(p.unit).grid_pos(gdm.GridPos(h=p.height, w=p.width, x=x, y=y))
    for i, (expr, legend) in enumerate(p.queries):
        builder.with_target(_query(expr, legend, i))
    return builder


def _place(builder: gdb.Dashboard, rows: list[Row]) -> gdb.Dashboard:
    """Add rows and their panels left to right, wrapping at the 24-column grid.

    Positions are set here rather than by the SDK's auto-layout, which wraps only after a row
    of panels fills the grid exactly (a 12-wide panel after two 8-wide ones would overflow).
    """
    pid, y = 1, 0
    for row in rows:
        row_pos = gdm.GridPos(h=1, w=GRID_WIDTH, x=0, y=y)
        builder.with_row(gdb.Row(row.title).id(pid).grid_pos(row_pos).collapsed(False))
        pid, y = pid + 1, y + 1
        x, line_height = 0, 0
        for p in row.panels:
            if x + p.width > GRID_WIDTH:
                x, y, line_height = 0, y + line_height, 0
            builder.with_panel(_panel(p, pid, x, y))
            pid, x, line_height = pid + 1, x + p.width, max(line_height, p.height)
        y += line_height
    return builder


def _query_variable(name: str, label: str, query: str) -> gdb.QueryVariable:
    return (
        gdb.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query({"query": query, "refId": f"{name}-var"})
        .refresh(gdm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .multi(True)
        .all_value(".*")
        .current(gdm.VariableOption(selected=True, text=["All"], value=["$__all"]))
        .sort(gdm.VariableSort.ALPHABETICAL_ASC)
    )


def _variables(
    job_metric: str | None, ns_metric: str
) -> list[cogbuilder.Builder[gdm.VariableModel]]:
    datasource = gdb.DatasourceVariable("datasource").label("Data source").type("prometheus")
    namespace = f"label_values({ns_metric}, namespace)"
    variables: list[cogbuilder.Builder[gdm.VariableModel]] = [
        datasource,
        _query_variable("namespace", "Namespace", namespace),
    ]
    if job_metric is not None:
        query = f'label_values({job_metric}{{namespace=~"$namespace"}}, rljob)'
        variables.append(_query_variable("rljob", "RLJob", query))
    return variables


def dashboard(
    uid: str, title: str, rows: list[Row], *, job_metric: str | None, ns_metric: str
) -> dict[str, Any]:
    """A complete dashboard document ready for the sidecar, as plain JSON data."""
    link = (
        gdb.DashboardLink("Longtail dashboards")
        .type(gdm.DashboardLinkType.DASHBOARDS)
        .tags(["longtail"])
        .as_dropdown(True)
    )
    builder = (
        gdb.Dashboard(title)
        .uid(uid)
        .tags(["longtail"])
        .timezone("browser")
        .editable()
        .tooltip(gdm.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .version(1)
        .time("now-3h", "now")
        .variables(_variables(job_metric, ns_metric))
        # An empty list, not an absent one: Grafana adds its built-in annotation query to it.
        .annotations([])
        .link(link)
    )
    board = _place(builder, rows).build()
    data: dict[str, Any] = json.loads(json.dumps(board, cls=JSONEncoder))
    return data


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
