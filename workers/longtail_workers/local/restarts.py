"""Lost children of ``longtail run``: restart rollout and drafter workers, up to ``backoffLimit``.

``local/run.py``'s supervise loop calls :meth:`Restarts.check` every poll. A rollout worker (or
a dedicated drafter worker, ``spec.drafter``, which picks up at the next completed step) that
exited while the run goes on is *lost*: it is started again with the same command
(:meth:`Child.restart <longtail_workers.local.launcher.Child.restart>`: same name, port and log)
while fewer than ``spec.backoffLimit`` restarts were made, as the operator recreates a failed
pod up to ``backoffLimit``. The trainer has already re-dispatched the lost worker's requests to
the others; at the start of each step it health-checks the workers it marked down
(``RolloutPool.revive``), so the restarted worker takes work again once it has loaded its model.
Under ``--weight-sync broadcast`` it first pulls the current policy version over HTTP, and its
registration puts it in the next broadcast (``weights/broadcast.py``). Past the limit the
worker stays down and the run goes on with the others; when none is left
(:meth:`Restarts.none_left`) the run stops at once with the reason instead of waiting on the
trainer. Any other child that exits (the verifier) is reported, not restarted. The lost
and restarted workers end up in ``summary.json``, the report and the run's last lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from longtail_workers.local.launcher import Child

RESTARTED_ROLES = ("rollout", "drafter")
"""Roles whose lost processes are started again (the verifier's is reported, not restarted)."""


@dataclass
class Restarts:
    """Restart book-keeping of one run (see the module text)."""

    limit: int
    """``spec.backoffLimit``: restarts allowed over the whole run."""
    on_restart: Callable[[], None] = lambda: None
    """Called after a restart (``run.py`` rewrites ``processes.json`` with the new pid)."""
    lost: list[str] = field(default_factory=list)
    """``NAME (exit CODE)`` per loss, in order."""
    restarted: list[str] = field(default_factory=list)
    _reported: set[Child] = field(default_factory=set)
    """Exits already handled (the objects, not ids: a restarted child may reuse an id)."""

    def check(self, children: list[Child], trainer: Child) -> list[str]:
        """Replace lost rollout and drafter workers in ``children`` in place; returns lines to
        print."""
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
                lines.append(
                    f"warning: {child.name} exited with {code}; not restarted: "
                    f"{len(self.restarted)} restarts made, spec.backoffLimit={self.limit} "
                    "(raise it to restart more); the run goes on with the other workers"
                )
                continue
            children[i] = child.restart()
            self.restarted.append(child.name)
            self.on_restart()
            lines.append(
                f"warning: {child.name} exited with {code}; restarted it "
                f"(restart {len(self.restarted)} of spec.backoffLimit={self.limit}); "
                "it takes work again from the next step once it has loaded"
            )
        return lines

    def none_left(self, children: list[Child]) -> str | None:
        """Why the run cannot go on when every rollout worker is down for good (after
        :meth:`check` restarted what it could), else None: the trainer would wait for one
        until its own timeout."""
        rollout = [c for c in children if c.role == "rollout"]
        if not rollout or any(c.alive for c in rollout):
            return None
        names = ", ".join(c.name for c in rollout)
        return (
            f"every rollout worker has exited ({names}; {len(self.restarted)} restarts made, "
            f"spec.backoffLimit={self.limit}): nothing is left to generate; see "
            "logs/rollout-*.log for why, fix it and resume with `longtail run --resume`"
        )

    def summary(self) -> dict[str, list[str]]:
        """``lost_workers`` and ``restarted_workers`` for ``summary.json`` and the report."""
        return {"lost_workers": list(self.lost), "restarted_workers": list(self.restarted)}
