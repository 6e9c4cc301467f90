"""The worker side of reading an RLJob file: the validated spec, or one error listing every problem.

Called by every worker program (``runtime.py`` for the rollout, trainer and drafter services,
``warmstart/offline.py`` for ``longtail drafter fit``, ``local/run.py`` for ``longtail run``). It
sits at the bottom of the worker packages so that programs of every layer can use it without
importing the service plumbing in ``runtime.py``.
"""

from __future__ import annotations

from pathlib import Path

from longtail_api.manifest import ManifestError, validate_file
from longtail_api.spec import RLJobSpec


class JobSpecError(ValueError):
    """The RLJob file is unreadable or invalid; the message lists every error."""


def load_job_spec(path: str | Path) -> RLJobSpec:
    """The validated spec of the single RLJob in ``path``."""
    try:
        results = validate_file(path)
    except ManifestError as exc:
        raise JobSpecError(str(exc)) from exc
    if len(results) != 1:
        raise JobSpecError(f"{path}: holds {len(results)} YAML documents; give one RLJob per file")
    res = results[0]
    if res.errors or res.spec is None:
        listed = "\n  - ".join(str(e) for e in res.errors)
        raise JobSpecError(f"{path}: {len(res.errors)} error(s):\n  - {listed}")
    return res.spec
