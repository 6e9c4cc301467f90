"""The drafter a tracked run logs at its end: the newest version, exported for serving.

Called by ``trainer/service.py`` (rank 0, when the job tracks anything) before
:func:`~longtail_workers.tracking.trainer_side.finish`. :func:`drafter_artifact` exports the
newest published drafter version as ``longtail drafter export`` writes it (the EAGLE-1 draft
model SGLang loads; ``drafter/export.py``, docs/drafter-export.md) where it exports exactly,
and otherwise (a ``longtail``-layout drafter, which exports only approximately; a refused or
slow export) hands back the version's own directory, saying why in a log line.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from longtail_workers.drafter.export import ExportError, export_drafter

log = logging.getLogger(__name__)

EXPORT_TIMEOUT_S = 120.0
"""How long the trainer's exit waits for the export (one read and one write of the drafter's
weights, no network: the target is the job's local model directory); past it, the version's own
directory is logged instead."""
EXPORT_DIR = "drafter-export"
"""Where in the run directory the export is written (kept: TensorBoard logs no files)."""
EXPORT_ENGINE = "sglang"
"""The engine the drafter is exported for: ``longtail drafter export``'s default. A drafter that
exports exactly (``drafterTraining.layout: eagle1``) exports exactly for vLLM too."""


def latest_drafter(drafters_dir: Path | None) -> Path | None:
    """The newest published drafter version's directory (``drafter/registry.py`` layout)."""
    if drafters_dir is None or not (drafters_dir / "LATEST").is_file():
        return None
    version = int((drafters_dir / "LATEST").read_text().strip())
    path = drafters_dir / "versions" / f"{version:06d}"
    return path if path.is_dir() else None


def drafter_artifact(drafters_dir: Path | None, target: str, out: Path) -> Path | None:
    """The drafter to log: the newest version exported into ``out`` (replaced) from the job's
    model directory ``target``, else that version's directory; None when none was published."""
    drafter = latest_drafter(drafters_dir)
    if drafter is None:
        return None
    exported = export_exactly(drafter, target, out)
    if isinstance(exported, Path):
        log.info("tracking: drafter artifact: version %s exported for %s (%s)",
                 drafter.name, EXPORT_ENGINE, exported)  # fmt: skip
        return exported
    log.info("tracking: drafter artifact: the version directory %s, not exported: %s",
             drafter, exported)  # fmt: skip
    return drafter


def export_exactly(drafter: Path, target: str, out: Path) -> Path | str:
    """``drafter`` exported into ``out`` for :data:`EXPORT_ENGINE`, exactly, within
    :data:`EXPORT_TIMEOUT_S`: ``out``, or why there is no export."""
    why: list[str] = []
    done: list[Path] = []

    def work() -> None:
        try:
            export_drafter(drafter, out, target, engine=EXPORT_ENGINE, overwrite=True)
            done.append(out)
        except (ExportError, OSError, ValueError) as exc:  # refused, or the target unreadable
            why.append(str(exc))

    # A daemon thread: an export stuck on a slow disk neither holds up nor outlives the exit.
    thread = threading.Thread(target=work, name="drafter-export", daemon=True)
    thread.start()
    thread.join(EXPORT_TIMEOUT_S)
    if thread.is_alive():
        return f"the export took over {EXPORT_TIMEOUT_S:g} s"
    if done:
        return done[0]
    return why[0] if why else "the export failed (its traceback is logged above)"
