"""What ``longtail run`` prints while it runs: a progress bar per step and a live line.

:class:`Progress` is fed the trainer's status and the coordinator's books every poll by
``local/run.py`` (``supervise`` calls :meth:`Progress.update`; every other line, from the run
directory to the summary, goes through :meth:`Progress.message`). On a terminal a ``rich``
live display redraws one line in place: the current step's rollout bar (answers done / total)
and the live figures (reward, accuracy, eval accuracy, share of tokens from speculative steps,
mean accepted length, both also per draft source once the history drafter speculates, drafter
version, idle and harvested worker-seconds, and the trainer's harvested seconds when it is a
harvest target), cropped to the terminal's width; when a step
completes, a permanent line with that step's figures is printed above it (its time split, and
the weight sync of the policy version its rollout used: pause seconds and GB/s). Off a terminal (CI
logs, pipes, tests) only the permanent lines are printed, as plain unwrapped text without
escape codes. Once a write fails (the terminal was closed: SIGHUP, then EIO or EPIPE), nothing
more is written, so the run still stops cleanly and writes its report.

A step's permanent line is printed once, when the status carries that step's own figures
(``figures_step``), not when the step counter moves: the trainer counts a step as soon as the
policy is updated, then publishes the weights and evaluates before the step's figures are
complete. Reward and accuracy are one column (``reward=acc``) when they are equal, as they are
for a 0/1 reward (``dataset.formatWeight`` 0); both are shown when they differ.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

from longtail_api.policies import DRAFT_SOURCES
from longtail_api.workerapi import TrainerStatus
from longtail_workers.local.coordinator import HarvestBooks

BAR_WIDTH = 24


def bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    """``[#########...............]`` for ``done`` of ``total``."""
    filled = 0 if total <= 0 else min(width, round(width * done / total))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def live_line(status: TrainerStatus, books: HarvestBooks) -> str:
    """The figures of the run so far, one line."""
    parts = [
        *_reward_accuracy(status.reward_mean, status.accuracy),
        f"eval {_num(status.eval_accuracy, '.3f')}"
        + ("" if status.eval_sampled_accuracy is None else f"/{status.eval_sampled_accuracy:.3f}"),
        f"sd {_num(None if status.sd_fraction is None else 100 * status.sd_fraction, '.0f')}%",
        f"acc.len {_num(status.accepted_length, '.2f')}",
        *_by_source(status),
        f"drafter v{status.drafter_version}",
        f"idle {books.idle_total:.1f}s",
        f"harvested {books.harvested_total:.1f}s",
    ]
    if books.trainer_tracked:
        parts.append(f"trainer {books.trainer_harvested_total:.1f}s")
    if status.acceptance_collapsed:
        parts.append("WARNING: SD accepts almost nothing (stale drafter)")
    return "  ".join(parts)


def _by_source(status: TrainerStatus) -> list[str]:
    """``history 30% len 3.40``: each draft source's share of the tokens and accepted length,
    once a source other than the learned drafter speculated (with the learned drafter alone
    they are the totals already shown)."""
    sources = {*status.sd_fraction_by_source, *status.accepted_length_by_source}
    if not sources - {"learned"}:
        return []
    order = [s for s in DRAFT_SOURCES if s in sources] + sorted(sources - set(DRAFT_SOURCES))
    return [
        f"{s} {100 * status.sd_fraction_by_source.get(s, 0.0):.0f}% "
        f"len {_num(status.accepted_length_by_source.get(s), '.2f')}"
        for s in order
    ]


def _reward_accuracy(reward: float | None, accuracy: float | None) -> list[str]:
    """One column when reward and accuracy print alike (a 0/1 reward), else both."""
    r, a = _num(reward, ".3f"), _num(accuracy, ".3f")
    return [f"reward=acc {a}"] if r == a else [f"reward {r}", f"acc {a}"]


class _Console(Console):
    """A console whose closed pipe is an ordinary write error: rich's default answer to EPIPE
    is ``SystemExit(1)``, which would skip the run's clean stop and its report."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "the terminal or pipe was closed")


class Progress:
    """Renders statuses to ``out`` (see the module text)."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        # Decided by isatty() alone (not FORCE_COLOR / TTY_COMPATIBLE): a CI log gets plain lines.
        self.console = _Console(
            file=self.out, force_terminal=self.tty, force_interactive=self.tty,
            color_system="auto" if self.tty else None, highlight=False, markup=False, emoji=False,
        )  # fmt: skip
        # No auto-refresh thread (a redraw happens on update) and no stdout/stderr capture:
        # output written by others stays where it went before.
        self._live = Live(
            console=self.console, auto_refresh=False, transient=True,
            redirect_stdout=False, redirect_stderr=False,
        )  # fmt: skip
        self._printed_step = -1
        """The last step whose permanent line was printed (-1: none yet)."""
        self.lost = False
        """A write failed (the terminal is gone); later output is dropped."""

    def update(self, status: TrainerStatus, books: HarvestBooks) -> None:
        done = status.figures_step
        if done is not None and done > self._printed_step:
            missed, first = "", self._printed_step + 1
            if 0 < first < done:  # polls slower than steps: say so
                which = f"step {first}" if first == done - 1 else f"steps {first}-{done - 1}"
                missed = f"  ({which} completed between two polls: see metrics.jsonl)"
            self._print(f"step {done:>4}/{status.total_steps}  {live_line(status, books)}"
                        f"{self._times(status)}{missed}")  # fmt: skip
            self._printed_step = done
        if self.tty:
            current = min(status.step + 1, status.total_steps)
            done, total = status.answers_done, status.answers_total
            text = (
                f"step {current:>4}/{status.total_steps} {bar(done, total)} {done}/{total}  "
                f"{live_line(status, books)}"
            )
            self._guarded(self._redraw, text)

    def message(self, text: str) -> None:
        """A permanent line (the live line, if shown, is cleared first and comes back on the
        next :meth:`update`)."""
        self._guarded(self._live.stop)
        self._print(text)

    def _redraw(self, text: str) -> None:
        self._live.update(Text(text, no_wrap=True, overflow="ellipsis"))
        if not self._live.is_started:
            self._live.start()
        self._live.refresh()

    def _print(self, text: str) -> None:
        # soft_wrap: the line goes out whole (the terminal wraps it, a log keeps one line).
        self._guarded(lambda: self.console.print(Text(text), soft_wrap=True))

    def _guarded(self, write: Callable[..., None], *args: str) -> None:
        if self.lost:
            return
        try:
            write(*args)
        except (OSError, ValueError):  # EIO/EPIPE after a hang-up; ValueError: stream closed
            self.lost = True
            self.console.quiet = True

    @staticmethod
    def _times(status: TrainerStatus) -> str:
        s = status.step_seconds
        if s is None:
            return ""
        times = f"  time rollout {s.rollout:.1f}s (tail {s.tail:.1f}s) train {s.train:.1f}s"
        if s.sync_pause is not None:  # the weight sync of the version the rollout used
            rate = "" if s.sync_gb_per_s is None else f", {s.sync_gb_per_s:.2f} GB/s"
            times += f" sync {s.sync_pause:.2f}s{rate}"
        return times
