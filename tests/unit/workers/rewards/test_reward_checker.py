"""The math reward's checker processes (``rewards/checker.py``): time limits, crashes, start-up.

A stand-in child that speaks the checker protocol (and hangs or dies on request) drives the
failure paths; the real math-verify child is exercised by test_reward_math.py and
test_reward_hard_cases.py.
"""

from __future__ import annotations

import sys
import textwrap
import threading
from pathlib import Path

import pytest

from longtail_workers.rewards import CheckerUnavailable, MathChecker, Verdict
from longtail_workers.rewards.checker import cgroup_cpu_limit

FAKE_CHILD = textwrap.dedent(
    """
    import json, sys, time
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["answer"] == "hang":
            time.sleep(600)  # stuck where no alarm reaches: the parent must kill it
        if request["answer"] == "die":
            sys.exit(7)
        reply = {"correct": request["answer"] == request["gold"], "reason": None}
        print(json.dumps(reply), flush=True)
    """
)


def fake_checker(**kwargs: float) -> MathChecker:
    return MathChecker(command=[sys.executable, "-c", FAKE_CHILD], **{"timeout_s": 0.2, **kwargs})  # type: ignore[arg-type]


def test_a_silent_child_is_killed_and_replaced() -> None:
    checker = fake_checker(kill_grace_s=0.5)
    try:
        verdict = checker.check("1", "hang")
        assert not verdict.correct
        assert verdict.reason is not None
        assert verdict.reason.startswith("math check killed: no reply within 0.7 s")
        assert checker.check("1", "1") == Verdict(True, None)  # a new child answers
    finally:
        checker.close()


def test_a_child_that_dies_is_reported_and_replaced() -> None:
    checker = fake_checker()
    try:
        verdict = checker.check("1", "die")
        assert not verdict.correct
        assert verdict.reason is not None and "process died (exit code 7)" in verdict.reason
        assert checker.check("2", "2") == Verdict(True, None)
    finally:
        checker.close()


def test_a_child_that_cannot_start_is_a_clear_error() -> None:
    checker = MathChecker(command=[sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(CheckerUnavailable, match=r"exited during start-up \(exit code 3;"):
        checker.start()
    verdict = checker.check("1", "1")
    assert not verdict.correct
    assert verdict.reason is not None and verdict.reason.startswith("no math check: ")
    assert "is math-verify installed?" in verdict.reason


def test_a_child_that_never_says_ready_times_out() -> None:
    hang = [sys.executable, "-c", "import time; time.sleep(600)"]
    checker = MathChecker(command=hang, start_timeout_s=0.5)
    with pytest.raises(CheckerUnavailable, match=r"did not start within 0.5 s"):
        checker.start()


def test_more_threads_than_processes_share_them() -> None:
    checker = fake_checker(processes=2)
    verdicts: list[Verdict] = []
    try:
        threads = [
            threading.Thread(target=lambda i=i: verdicts.append(checker.check(str(i), str(i))))
            for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert verdicts == [Verdict(True, None)] * 8
    finally:
        checker.close()


def test_a_closed_checker_scores_nothing() -> None:
    checker = fake_checker()
    checker.start()
    checker.close()
    assert checker.check("1", "1") == Verdict(False, "no math check: the checker is closed")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"timeout_s": 0}, r"timeout_s: must be > 0 seconds, got 0"),
        ({"processes": 0}, r"processes: must be >= 1, got 0"),
    ],
)
def test_bad_settings(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MathChecker(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("max 100000\n", None), ("50000 100000\n", 0.5), ("200000 100000", 2.0), ("garbage", None)],
)
def test_cgroup_cpu_limit(tmp_path: Path, text: str, expected: float | None) -> None:
    path = tmp_path / "cpu.max"
    path.write_text(text)
    assert cgroup_cpu_limit(str(path)) == expected
    assert cgroup_cpu_limit(str(tmp_path / "absent")) is None
