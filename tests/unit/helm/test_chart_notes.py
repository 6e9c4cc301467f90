"""What ``helm install`` prints (templates/NOTES.txt), rendered offline: ``helm template`` never
renders NOTES, so a copy of the chart gets one template that includes it (issue #48, item 6b:
an RLJob in a namespace the operator does not watch gets nothing at all; the notes say so)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[3] / "helm" / "longtail"
Helm = Callable[..., Any]


def notes(helm: Helm, tmp_path: Path, *sets: str) -> str:
    chart = tmp_path / "longtail"
    shutil.copytree(CHART, chart)
    render = chart / "templates" / "notes-render.yaml"
    render.write_text('notes: {{ include "longtail/templates/NOTES.txt" . | toJson }}\n')
    args = ["template", "t", str(chart), "--show-only", "templates/notes-render.yaml"]
    for s in sets:
        args += ["--set", s]
    return str(yaml.safe_load(helm(*args).stdout)["notes"])


def test_namespaced_notes_name_the_watched_namespaces_and_warn_about_the_others(
    helm: Helm, tmp_path: Path
) -> None:
    text = notes(helm, tmp_path, "rbac.scope=namespaced", "rbac.watchNamespaces={team-a,team-b}")
    assert "watches RLJobs in team-a, team-b (namespaced mode)" in text
    assert "An RLJob in any other namespace is stored by the API server but nothing acts on" in (
        " ".join(text.split())
    )
    assert "rbac.watchNamespaces" in text


def test_cluster_notes_say_every_namespace(helm: Helm, tmp_path: Path) -> None:
    text = notes(helm, tmp_path)
    assert "watches RLJobs in every namespace." in text
    assert "any other namespace" not in text
