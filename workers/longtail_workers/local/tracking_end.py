"""``longtail run``'s part of experiment tracking: the ``--tracking`` switch and the end.

Called by ``local/run.py``. :func:`tracking_switch` writes ``--tracking NAME`` into the run's
job file (``spec.tracking.NAME``), as ``--no-speculative`` is written, so the trainer, which
reads that file, logs to it. :func:`log_report` runs after the report is written: it reopens
the trainer's tracker runs (the run ids in ``tracking.json`` next to the checkpoints) and adds
what only this process knows, each step's idle and harvested GPU-seconds from the harvest
books, then the report (``report/``: summary and plots), ``summary.json`` and ``metrics.csv``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from longtail_api.spec import RLJobSpec
from longtail_workers.local.coordinator import HarvestBooks
from longtail_workers.local.report import merge_books, read_rows
from longtail_workers.tracking.figures import harvest_figures
from longtail_workers.tracking.sink import open_tracker

CLI_DEFAULTS: dict[str, dict[str, Any]] = {
    "tensorboard": {},
    "mlflow": {},  # the URI from MLFLOW_TRACKING_URI
    "wandb": {"project": "longtail", "mode": "offline"},  # online needs a key: spec it
}
"""What ``--tracking NAME`` adds when the job file has no ``spec.tracking.NAME`` block."""
REPORT_FLUSH_TIMEOUT_S = 60.0
"""How long the end of ``longtail run`` waits for trackers that are behind."""


def tracking_switch(job: dict[str, Any], backends: list[str]) -> None:
    """Add each backend of ``--tracking`` to the job's spec (a block already there is kept)."""
    tracking = job["spec"].setdefault("tracking", {})
    for name in backends:
        tracking.setdefault(name, dict(CLI_DEFAULTS[name]))


def log_report(spec: RLJobSpec, run_dir: Path, books: HarvestBooks | None, outcome: str) -> bool:
    """Add the harvest figures and the report to the run's trackers; True when all was sent
    (also when the job tracks nothing)."""
    if not spec.tracking.backends():
        return True
    rows = read_rows(run_dir)
    merge_books(rows, books)
    tracker = open_tracker(spec, run_dir, run_dir / spec.checkpoint.location)
    for row in rows:
        tracker.figures(row.step, harvest_figures(row))
    tracker.artifact(run_dir / "report", "report")
    tracker.artifact(run_dir / "summary.json", "report")
    tracker.artifact(run_dir / "metrics.csv", "report")
    return tracker.close(outcome, REPORT_FLUSH_TIMEOUT_S)
