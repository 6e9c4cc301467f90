"""Lost children of ``longtail run``: restart rollout and drafter workers, shrink past the limit.

``local/run.py``'s supervise loop calls :meth:`Restarts.check`, then :meth:`Restarts.below_min`,
every poll. A rollout worker (or a dedicated drafter worker, ``spec.drafter``, which picks up at
the next completed step) that exited while the run goes on is *lost*: it is started again with
the same command (:meth:`Child.restart <longtail_workers.local.launcher.Child.restart>`: same
name, port and log) while fewer than ``spec.backoffLimit`` restarts were made, as the operator
recreates a failed pod up to ``backoffLimit``. The trainer has already re-dispatched the lost
worker's requests to the others; at the start of each step it health-checks the workers it
marked down (``RolloutPool.revive``), so the restarted worker takes prompts again from the step
after it has loaded its model (it loads the current policy version and the newest drafter at
its first generate call). Under ``--weight-sync broadcast`` it first pulls the current policy
version over HTTP, and its registration puts it in the next broadcast (``weights/broadcast.py``).

Past the limit the worker stays down and the run *shrinks* (elastic rollout, as a job's rollout
set shrinks on a cluster): it goes on with the other rollout workers while at least
:attr:`Restarts.floor` of them are alive: ``spec.rollout.minReplicas`` when set, else 1 (a run
without ``minReplicas`` keeps going down to one worker, as it always did). Below the floor for
longer than ``spec.rollout.belowMinGraceSeconds`` (at once when none is left: nothing could
generate) :meth:`Restarts.below_min` says why, and ``run.py`` has the trainer checkpoint the
last completed step and stop; ``longtail run --resume`` starts every worker again. Any other
child that exits (the verifier) is reported, not restarted. The lost and restarted workers and
each shrink (:attr:`Restarts.resizes`) end up in ``summary.json``, the report and the run's last
lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from longtail_api.spec import RLJobSpec
from longtail_workers.local.launcher import Child

RESTARTED_ROLES = ("rollout", "drafter")
"""Roles whose lost processes are started again (the verifier's is reported, not restarted)."""


@dataclass
class Restarts:
    """Restart and shrink book-keeping of one run (see the module text)."""

    limit: int
    """``spec.backoffLimit``: restarts allowed over the whole run."""
    floor: int = 1
    """Fewest alive rollout workers the run goes on with: ``spec.rollout.minReplicas``, else 1."""
    min_replicas: int | None = None
    """``spec.rollout.minReplicas`` as written (None: empty), for the messages."""
    grace_s: float = 300.0
    """``spec.rollout.belowMinGraceSeconds``: how long the run goes on below :attr:`floor`."""
    on_restart: Callable[[], None] = lambda: None
    """Called after a restart (``run.py`` rewrites ``processes.json`` with the new pid)."""
    clock: Callable[[], float] = time.monotonic
    run_dir: str = "RUN_DIR"
    """The run directory, for the resume command in the messages."""
    lost: list[str] = field(default_factory=list)
    """``NAME (exit CODE)`` per loss, in order."""
    restarted: list[str] = field(default_factory=list)
    resizes: list[dict[str, Any]] = field(default_factory=list)
    """One entry per change of the alive rollout workers past the restarts: ``{"at_s",
    "rollout_workers", "was", "why"}`` (``at_s``: seconds since the supervision began)."""
    _reported: set[Child] = field(default_factory=set)
    """Exits already handled (the objects, not ids: a restarted child may reuse an id)."""
    _below_since: float | None = None
    _start: float | None = None

    @classmethod
    def of(cls, spec: RLJobSpec, **kw: Any) -> Restarts:
        """For ``spec``: its backoff limit, floor and grace."""
        rollout = spec.rollout
        return cls(
            spec.backoff_limit,
            floor=rollout.min_replicas or 1,
            min_replicas=rollout.min_replicas,
            grace_s=rollout.below_min_grace_seconds,
            **kw,
        )

    def check(self, children: list[Child], trainer: Child) -> list[str]:
        """Replace lost rollout and drafter workers in ``children`` in place; returns lines to
        print."""
        if self._start is None:
            self._start = self.clock()
        lines = []
        for i, child in enumerate(children):
            # Every trainer rank shares rank 0's fate: the run ends with the trainer.
            if child is trainer or child.role == "trainer" or child.alive:
                continue
            if child in self._reported:
                continue
            self._reported.add(child)
            code = child.proc.poll()
            self.lost.append(f"{child.name} (exit {code})")
            if child.role not in RESTARTED_ROLES:
                lines.append(f"warning: {child.name} exited with {code}; it is not restarted")
                continue
            if len(self.restarted) >= self.limit:
                lines.append(self._shrunk(child, code, children))
                continue
            children[i] = child.restart()
            self.restarted.append(child.name)
            self.on_restart()
            lines.append(
                f"warning: {child.name} exited with {code}; restarted it "
                f"(restart {len(self.restarted)} of spec.backoffLimit={self.limit}); "
                "it takes prompts again from the step after it has loaded"
            )
        return lines

    def _shrunk(self, child: Child, code: int | None, children: Sequence[Child]) -> str:
        """``child`` is down for good: book the shrink (rollout workers only) and say so."""
        why = (
            f"{child.name} exited with {code}; not restarted: {len(self.restarted)} restarts "
            f"made, spec.backoffLimit={self.limit} (raise it to restart more)"
        )
        if child.role != "rollout":
            return f"warning: {why}; the run goes on without it"
        # Counted from the run's workers, not the alive ones: two lost in one poll are two steps.
        was = self.resizes[-1]["rollout_workers"] if self.resizes else self._rollout(children)
        self.resizes.append(
            {
                "at_s": round(self.clock() - (self._start or 0.0), 3),
                "rollout_workers": was - 1,
                "was": was,
                "why": why,
            }
        )
        return (
            f"warning: {why}; the run shrinks to {was - 1} rollout worker(s) "
            f"({self._floor_words()})"
        )

    @staticmethod
    def _rollout(children: Sequence[Child]) -> int:
        return sum(1 for c in children if c.role == "rollout")

    @staticmethod
    def alive_rollout(children: Sequence[Child]) -> int:
        return sum(1 for c in children if c.role == "rollout" and c.alive)

    def _floor_words(self) -> str:
        if self.min_replicas is None:
            return "spec.rollout.minReplicas is empty: the run goes on down to 1"
        return f"spec.rollout.minReplicas={self.min_replicas}"

    def below_min(self, children: Sequence[Child]) -> str | None:
        """Why the run must stop now (checkpoint first): fewer than :attr:`floor` rollout
        workers alive for longer than :attr:`grace_s`, or none at all (after :meth:`check`
        restarted what it could); else None. A run without rollout children never stops so."""
        rollout = [c for c in children if c.role == "rollout"]
        alive = self.alive_rollout(children)
        if not rollout or alive >= self.floor:
            self._below_since = None
            return None
        now = self.clock()
        if self._below_since is None:
            self._below_since = now
        waited = now - self._below_since
        if alive > 0 and waited < self.grace_s:
            return None
        lost = ", ".join(c.name for c in rollout if not c.alive)
        if alive:
            short = (
                f"fewer than spec.rollout.minReplicas={self.min_replicas} for {waited:.0f}s "
                f"(spec.rollout.belowMinGraceSeconds={self.grace_s:g})"
            )
        else:
            short = f"none left ({self._floor_words()})"
        return (
            f"{alive} of {len(rollout)} rollout workers alive, {short}; lost for good: {lost} "
            f"({len(self.restarted)} restarts made, spec.backoffLimit={self.limit}). The last "
            "completed step is checkpointed: see logs/rollout-*.log for why they exited, fix it "
            "(or lower minReplicas or raise backoffLimit in the run's job.yaml) and resume with "
            f"`longtail run --resume {self.run_dir}`"
        )

    def summary(self) -> dict[str, Any]:
        """``lost_workers``, ``restarted_workers`` and ``rollout_shrinks`` for ``summary.json``
        and the report."""
        return {
            "lost_workers": list(self.lost),
            "restarted_workers": list(self.restarted),
            "rollout_shrinks": [dict(r) for r in self.resizes],
        }
