"""The generated parts of docs/observability.md: the metric reference and the alert table.

``longtail_chart.chartgen`` replaces the text between ``<!-- BEGIN GENERATED: name -->`` and
``<!-- END GENERATED: name -->`` markers with :func:`metrics_reference` and
:func:`alerts_table`, and ``make verify`` fails when the file is out of date. The metric rows
come from ``longtail_api.metrics`` (name, type, labels, help), the specs every exporter builds
its collectors from (the rollout engine's too: ``ROLLOUT_ENGINE_METRICS``), so the document
lists exactly what the code exports.
"""

from __future__ import annotations

import re

import yaml

SECTIONS: tuple[tuple[str, str, str], ...] = (
    ("TRAINER_METRICS", "Trainer", "the trainer pod (step driver)"),
    ("WORKER_CONTROL_METRICS", "Rollout worker control", "rollout worker pods"),
    ("SPOT_METRICS", "Spot drafter training, versions, acceptance", "rollout worker pods"),
    ("VERIFIER_METRICS", "Verifier", "verifier pods"),
    ("OPERATOR_METRICS", "Operator", "the operator pod"),
)
"""(tuple in longtail_api.metrics, heading, who exports it), in document order."""


def _row(name: str, kind: str, labels: list[str], help_text: str) -> str:
    shown = ", ".join(f"`{label}`" for label in labels) or "—"
    meaning = help_text.replace("|", "\\|")
    return f"| `{name}` | {kind} | {shown} | {meaning} |"


def _table(rows: list[str]) -> list[str]:
    return ["| Name | Type | Labels | Meaning |", "|---|---|---|---|", *rows, ""]


def engine_rows() -> list[str]:
    """Rows for the rollout engine's metrics, from the specs its collectors are built from."""
    from longtail_api.metrics import ROLLOUT_ENGINE_METRICS

    return [_row(s.name, s.kind, list(s.labels), s.help) for s in ROLLOUT_ENGINE_METRICS]


def metrics_reference() -> str:
    from longtail_api import metrics

    lines: list[str] = []
    seen: set[str] = set()
    for attr, heading, who in SECTIONS:
        specs = getattr(metrics, attr, ())
        if not specs:
            continue
        lines += [f"### {heading}", "", f"Exported by {who}.", ""]
        rows = [_row(s.name, s.kind, list(s.labels), s.help) for s in specs]
        lines += _table(rows)
        seen |= {s.name for s in specs}
    rest = [s for s in metrics.ALL_METRICS if s.name not in seen]
    if rest:
        lines += ["### Other", ""]
        lines += _table([_row(s.name, s.kind, list(s.labels), s.help) for s in rest])
    lines += ["### Rollout engine", "", "Exported by rollout worker pods.", ""]
    lines += _table(engine_rows())
    return "\n".join(lines)


def alerts_table(rule_file_text: str) -> str:
    data = yaml.safe_load(rule_file_text)
    rows = ["| Alert | Severity | For | Fires when |", "|---|---|---|---|"]
    for group in data["groups"]:
        for rule in group["rules"]:
            expr = " ".join(str(rule["expr"]).split()).replace("|", "\\|")
            summary = re.sub(r"\{\{[^}]*\}\}", "…", rule["annotations"]["summary"])
            rows.append(
                f"| `{rule['alert']}` | {rule['labels']['severity']} | {rule.get('for', '0s')} "
                f"| {summary}: `{expr}` |"
            )
    return "\n".join([*rows, ""])


def replace_section(text: str, name: str, content: str) -> str:
    """``text`` with the body of the named generated section replaced by ``content``."""
    begin, end = f"<!-- BEGIN GENERATED: {name} -->", f"<!-- END GENERATED: {name} -->"
    if begin not in text or end not in text:
        raise ValueError(f"markers {begin!r} and {end!r} missing from docs/observability.md")
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n{content.rstrip()}\n{end}{tail}"
