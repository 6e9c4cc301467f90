"""The math-verify side of the ``math`` reward: parse two answers and judge their equivalence.

Runs inside the checker process that :mod:`longtail_workers.rewards.checker` starts
(``python -m longtail_workers.rewards.mathcheck``), never in the verifier's request threads:
math-verify bounds its own work with ``signal.alarm``, which only works in a process's main
thread, and the verifier scores answers in many threads at once. Here the main thread does all
the work, so one ``signal.setitimer`` alarm bounds each answer (parsing both sides and the
comparison together, in fractions of a second), and math-verify's own alarms are switched off
(``parsing_timeout=None``, ``timeout_seconds=None``).

Both answers are wrapped in ``\\boxed{...}`` and parsed with math-verify's LaTeX and plain
expression extractors, as veRL's and open-r1's math-verify rewards do for the gold answer: the
caller has already found the model's final answer (``extract.py``), so math-verify reads that
text alone and not some other number earlier in the output. Gold answers repeat across a GRPO
group, so their parses are cached.

Protocol (one JSON object per line): the process prints ``{"ready": true}`` once math-verify is
imported, then answers each request ``{"gold": ..., "answer": ..., "budget": seconds}`` with
``{"correct": bool, "reason": str | null}``; it exits at the end of its standard input.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import sys
from types import FrameType
from typing import IO, Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

_EXTRACTORS = (LatexExtractionConfig(), ExprExtractionConfig())
GOLD_CACHE_SIZE = 4096
"""Distinct gold answers whose parse is kept (a GRPO group shares one gold answer)."""


class GaveUp(BaseException):
    """The per-answer alarm fired. A ``BaseException``, so math-verify's and sympy's
    ``except Exception`` blocks do not swallow it and carry on past the budget."""


def parse_boxed(text: str) -> list[Any]:
    """math-verify's reading of ``text`` as a final answer: sympy objects and/or the string."""
    parsed: list[Any] = parse(
        "\\boxed{" + text + "}", extraction_config=_EXTRACTORS, parsing_timeout=None
    )
    return parsed


@functools.lru_cache(maxsize=GOLD_CACHE_SIZE)
def _parse_gold(gold: str) -> tuple[Any, ...]:
    return tuple(parse_boxed(gold))


def equivalent(gold: str, answer: str) -> bool:
    """Whether math-verify finds ``answer`` equal to ``gold`` (both final-answer texts).

    Unbounded in time on hostile input (``9^{9^{9^9}}``): call it under :func:`judge`'s alarm.
    """
    return bool(verify(list(_parse_gold(gold)), parse_boxed(answer), timeout_seconds=None))


class _Alarm:
    """One ``ITIMER_REAL`` alarm per answer; it raises :class:`GaveUp` only while armed, so an
    alarm that fires just after the work finished cannot hit the code that reports it."""

    def __init__(self) -> None:
        self.armed = False
        signal.signal(signal.SIGALRM, self._fire)

    def _fire(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:
            raise GaveUp

    def judge(self, gold: str, answer: str, budget_s: float) -> tuple[bool, str | None]:
        """(correct, reason): reason is ``None`` when math-verify reached a verdict."""
        self.armed = True
        signal.setitimer(signal.ITIMER_REAL, budget_s)
        try:
            return equivalent(gold, answer), None
        except GaveUp:
            return False, f"math-verify gave up: no verdict within {budget_s:g} s"
        except Exception as exc:  # noqa: BLE001 - a library bug: the reason, logged by the parent
            return False, f"math-verify failed: {type(exc).__name__}: {str(exc)[:200]}"
        finally:
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)


def serve(requests: IO[str], replies: IO[str]) -> None:
    """Answer requests line by line until ``requests`` ends (the parent closed the pipe)."""
    alarm = _Alarm()
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in requests:
        request = json.loads(line)
        correct, reason = alarm.judge(request["gold"], request["answer"], request["budget"])
        replies.write(json.dumps({"correct": correct, "reason": reason}) + "\n")
        replies.flush()


def main() -> None:
    """Entry point of the checker process; its standard output carries only the protocol."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt replies
    # math-verify warns once that its own timeouts are off: the alarm above replaces them.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
