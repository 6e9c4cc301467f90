"""The trainer's rollout membership in a pod: the job's spec as the operator renders it, re-read.

``spec.rollout.replicas`` is a live field (``longtail_api.mutability``): the operator creates
or deletes rollout pods when it changes, and rewrites the job's ConfigMap, which is mounted
into the trainer pod without ``subPath`` (``longtail_operator.builders``), so Kubernetes
updates the file in place after an edit (typically within a minute). The trainer's
``--rollout`` list is derived from that file once, at start (``longtail_workers.podenv``);
:func:`spec_membership` makes the
:class:`~longtail_workers.trainer.dispatch.RolloutPool` follow it instead: called by
``trainer/setup.py`` when the pool is built, it returns a :class:`SpecMembership` the pool asks
at each step start (``RolloutPool.revive``) for the workers the spec names now, built with the
same naming rule as the start list (``podenv.rollout_workers``). Only when the trainer got its
list from the pod's environment (the config variable set and the list exactly what the naming
rule gives for its size); ``longtail run`` and hand-started trainers keep their fixed list.

A file that cannot be read or does not validate (the operator renders only specs that do)
leaves the membership as it was, with a warning naming the file and the error.

At start, ``trainer/service.py`` calls :func:`wait_for_rollout`: the run starts once enough of
the listed workers answer, not all of them (with Kueue's partial admission the pods above the
admitted count do not exist yet); the others are not yet live and join at a step start once
they answer.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from longtail_api import podenv as names
from longtail_api.podenv import PodEnv, PodEnvError
from longtail_workers.jobspec import JobSpecError, load_job_spec
from longtail_workers.podenv import rollout_workers
from longtail_workers.trainer.dispatch import NOT_YET_LIVE, RolloutPool

log = logging.getLogger(__name__)


class SpecMembership:
    """The rollout workers the job's config file names now (see the module text)."""

    def __init__(self, job_file: str | Path, env: PodEnv) -> None:
        self.path, self.env = Path(job_file), env
        self._seen: tuple[int, int, int] | None = None  # the file version last read
        self._workers: dict[str, str] | None = None

    def __call__(self) -> dict[str, str] | None:
        """Name -> URL of the rollout workers ``spec.rollout.replicas`` names now; None when
        the file cannot be read (the caller keeps the workers it has)."""
        try:
            st = os.stat(self.path)  # follows the mount's symlinks to the current version
        except OSError as exc:
            log.warning("rollout membership: cannot read %s (%s); keeping the workers as they "
                        "are", self.path, exc)  # fmt: skip
            return None
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        if seen == self._seen:
            return self._workers
        self._seen = seen
        try:
            replicas = load_job_spec(self.path).rollout.replicas
        except (JobSpecError, OSError) as exc:
            log.warning("rollout membership: %s no longer holds a valid RLJob (%s); keeping the "
                        "workers as they are", self.path, exc)  # fmt: skip
            self._workers = None
            return None
        self._workers = rollout_workers(self.env, replicas)
        return self._workers


def spec_membership(
    job_file: str, workers: Mapping[str, str], environ: Mapping[str, str]
) -> SpecMembership | None:
    """A :class:`SpecMembership` on ``job_file`` when ``workers`` (the trainer's ``--rollout``
    list) came from the pod's environment; None otherwise (outside a pod, or a list given on
    the command line): the trainer's workers stay as listed."""
    if not environ.get(names.CONFIG, "").strip():
        return None
    try:
        env = PodEnv.from_env(environ)
        derived = rollout_workers(env, len(workers))
    except PodEnvError as exc:
        log.info("rollout membership fixed to the --rollout list: %s", exc)
        return None
    if derived != dict(workers):
        log.info("rollout membership fixed: the --rollout list was given on the command line")
        return None
    log.info("rollout membership follows spec.rollout.replicas in %s at each step start",
             job_file)  # fmt: skip
    return SpecMembership(job_file, env)


STARTING = f"{NOT_YET_LIVE} (starting)"
"""The reason a listed worker that has not answered yet is down at start."""


def wait_for_rollout(
    pool: RolloutPool,
    need: int,
    grace_s: float | None,
    timeout_s: float,
    stop: threading.Event,
    poll_s: float = 0.1,
) -> list[str]:
    """Wait until every worker of ``pool`` answers, or at least ``need`` of them (at most all)
    do, or, with ``grace_s`` (elastic: ``rollout.belowMinGraceSeconds``), ``grace_s`` have
    passed since the first one did (or ``timeout_s`` since the start, whichever is first);
    returns the live workers. The others stay down as not yet live (the pool takes them at a
    step start once they answer). :class:`TimeoutError`, naming the workers that never
    answered, at ``timeout_s`` without enough of them (none answered, or fewer than ``need``
    without ``grace_s``)."""
    for name in pool.workers:
        pool.down.setdefault(name, STARTING)
    deadline = time.monotonic() + timeout_s
    first: float | None = None
    while not stop.is_set():
        pool.revive()  # follows the membership too: the workers named now
        live, now = pool.live, time.monotonic()
        if live and first is None:
            first = now
        if not pool.down or len(live) >= min(need, len(pool.workers)):
            break
        if first is not None and grace_s is not None and (now - first >= grace_s or now > deadline):
            log.warning("starting with %d of %d rollout workers, fewer than the %d wanted: %s "
                        "not answering %.0fs after the first did (spec.rollout."
                        "belowMinGraceSeconds=%g)", len(live), len(pool.workers), need,
                        ", ".join(pool.down), now - first, grace_s)  # fmt: skip
            break
        if now > deadline:
            raise TimeoutError(
                f"rollout workers not healthy after {timeout_s:g}s: {', '.join(pool.down)} "
                f"({len(live)} of the {min(need, len(pool.workers))} needed answer)"
            )
        stop.wait(poll_s)
        poll_s = min(2.0, poll_s * 1.5)
    if pool.down and not stop.is_set():
        log.info("rollout workers %s not live yet: each takes prompts from the first step "
                 "start at which it answers", ", ".join(pool.down))  # fmt: skip
    return pool.live
