"""``python -m longtail_operator``: run the operator (the operator image's entry point).

Reads the settings from ``LONGTAIL_OPERATOR_*`` (docs/operator.md), then runs kopf standalone
(no kopf peering objects) on the configured namespaces, or cluster-wide. With leader election
(the default) several replicas may run: one acts, the others wait for its Lease
(``leader.py``). Exit status: 0 after a signal (SIGTERM, Ctrl-C), 1 after losing the Lease (as
controller-runtime does: the restarted process campaigns afresh), 2 on bad settings.
"""

from __future__ import annotations

import asyncio
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
    lost = asyncio.Event()  # set on the kopf loop by handlers._lost
    handlers.exit_on_lost(lost)
    kopf.run(
        standalone=True,
        namespaces=list(settings.namespaces),
        clusterwide=not settings.namespaces,
        stop_flag=lost,
    )
    handlers.stop_job_loops()
    return 1 if lost.is_set() else 0


if __name__ == "__main__":
    sys.exit(main())
