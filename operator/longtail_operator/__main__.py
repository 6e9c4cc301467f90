"""``python -m longtail_operator``: run the operator (the operator image's entry point).

Reads the settings from ``LONGTAIL_OPERATOR_*`` (docs/operator.md), then runs kopf standalone
(one replica; no peering objects needed) on the configured namespaces, or cluster-wide.
"""

from __future__ import annotations

import logging
import sys

import kopf

from longtail_operator import handlers
from longtail_operator.settings import SettingsError, from_env


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = from_env()
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    handlers.configure(settings)
    kopf.run(
        standalone=True,
        namespaces=list(settings.namespaces),
        clusterwide=not settings.namespaces,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
