"""``python -m longtail_operator``: run the operator (the operator image's entry point).

Reads the settings from ``LONGTAIL_OPERATOR_*`` (docs/operator.md), then runs kopf standalone
(no kopf peering objects) on the configured namespaces, or cluster-wide. With leader election
(the default) several replicas may run: one acts, the others wait for its Lease
(``leader.py``). Exit status: 0 after a signal (SIGTERM, Ctrl-C), 1 after losing the Lease (as
controller-runtime does: the restarted container campaigns afresh, and being the same pod
re-takes its Lease at once), 2 on bad settings. Whatever kopf ran, the Lease is released on the
way out if this process holds it.
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
    stop = asyncio.Event()  # kopf's stop flag: set on its loop by handlers._lost
    handlers.exit_on_lost(stop)
    try:
        kopf.run(
            standalone=True,
            namespaces=list(settings.namespaces),
            clusterwide=not settings.namespaces,
            stop_flag=stop,
        )
    finally:
        handlers.stop_job_loops()
        # kopf runs no cleanup handler after a cancelled start-up (SIGTERM to a standby) or a
        # crash: never exit holding the Lease or with the elector still campaigning.
        handlers.stop_elector()
    return 1 if handlers.lost_lease() else 0


if __name__ == "__main__":
    sys.exit(main())
