"""Where the Prometheus and promtool binaries for the chart's checks are: one call to
``e2e/monitoring.sh bin``.

Called by the chart tests (``tests/unit/helm/conftest.py`` for promtool,
``tests/integration/test_helm_monitoring.py`` for Prometheus), so both find the binaries the same
way. The script fetches Debian's build once into a cache; that first fetch is the slow part,
hence the generous timeout.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "e2e" / "monitoring.sh"
FETCH_TIMEOUT_S = 900.0
"""The first run downloads Debian's prometheus package; later runs return at once."""


def binaries_dir(timeout: float = FETCH_TIMEOUT_S) -> Path:
    """The directory holding ``prometheus`` and ``promtool``.

    Raises RuntimeError with the script's exit status and stderr if it cannot provide them.
    """
    cmd = ["bash", str(SCRIPT), "bin"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"e2e/monitoring.sh bin failed (exit {proc.returncode}); the binaries are fetched "
            f"from Debian's archive on first use, so check network access:\n{proc.stderr}"
        )
    return Path(proc.stdout.strip())
