"""Benchmark: elastic rollout in ``longtail run`` (issue #52): a lost worker and a returning one.

Run: ``.venv/bin/python bench/elastic_local.py [--kills N] [--max-new-tokens T]``. Starts
``longtail run`` on ``tests/e2e_local/ci-tiny.yaml`` (builtin:tiny, 2 rollout workers, 6 prompts
x 2 answers a step, no eval) with ``backoffLimit`` N, then N times: waits until rollout-1
generates, kills it (SIGKILL), and measures

* **death -> step goes on without it**: from the kill to the trainer's ``rollout worker
  rollout-1 failed ...; re-dispatching`` line (its log's millisecond timestamp): the moment its
  share is queued for rollout-0;
* **ready -> first prompts**: from the first ``/healthz`` answer of the restarted rollout-1
  (polled every 20 ms; its server starts once its model is loaded) to the trainer's ``rollout
  worker rollout-1 answers again; back in the pool`` line (the next step start's health check,
  which hands it its shard at once: bounded by one step), and from there to the first time its
  ``/v1/status`` says ``generating`` (polled every 20 ms): its first call's catch-up, loading the
  step's policy version over HTTP and the newest drafter (the row's ``worker_load_s`` has the
  policy part);
* the killed step's rollout seconds against the median of the others (the cost of the
  re-dispatch within the step).

Prints every sample and the median, min and max of each, and writes
``bench/results/elastic_local.json``. The machine's load is printed with them: the figures are
wall times on whatever else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "e2e_local" / "ci-tiny.yaml"
OUT = REPO / "bench" / "results" / "elastic_local.json"
REDISPATCH = "rollout worker rollout-1 failed"
BACK = "rollout worker rollout-1 answers again; back in the pool"
POLL_S = 0.02


def job(path: Path, kills: int, max_new: int) -> Path:
    doc = yaml.safe_load(JOB.read_text())
    spec = doc["spec"]
    spec["algorithm"].update(totalSteps=10_000, promptsPerStep=6, maxNewTokens=max_new)
    spec["dataset"]["evalSize"] = 0
    spec["backoffLimit"] = kills
    (path / "job.yaml").write_text(yaml.safe_dump(doc))
    return path / "job.yaml"


def get(url: str, timeout_s: float = 1.0) -> bytes | None:
    """The body of a 200 answer, None when there is none (refused, reset, timed out)."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return bytes(r.read())
    except OSError:
        return None


def until(cond: Any, timeout_s: float, what: str) -> float:
    """Poll ``cond`` every :data:`POLL_S`; returns the wall time it first held."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s:g}s")
        time.sleep(POLL_S)
    return time.time()


def log_time(line: str) -> float:
    """The wall time of a worker log line (``%(asctime)s``: local time, milliseconds)."""
    stamp = " ".join(line.split()[:2])
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def rollout_1(run_dir: Path) -> dict[str, Any]:
    """rollout-1's entry of ``processes.json`` (re-read while ``longtail run`` rewrites it)."""
    while True:
        try:
            procs = json.loads((run_dir / "processes.json").read_text())
            return dict(next(p for p in procs if p["name"] == "rollout-1"))
        except (OSError, ValueError):  # caught half-written
            time.sleep(POLL_S)


def generating(url: str) -> bool:
    body = get(url + "/v1/status")
    return body is not None and bool(json.loads(body).get("generating"))


def one_kill(run_dir: Path, seen: int) -> dict[str, float]:
    """Kill rollout-1 mid-generation, time the re-dispatch and its return to work."""
    victim = rollout_1(run_dir)
    until(lambda: generating(victim["url"]), 120, "rollout-1 generating")
    t_kill = time.time()
    os.kill(victim["pid"], signal.SIGKILL)
    log = run_dir / "logs" / "trainer.log"

    def lines(what: str) -> list[str]:
        return [ln for ln in log.read_text().splitlines() if what in ln]

    until(lambda: len(lines(REDISPATCH)) > seen, 60, "the re-dispatch")
    t_redispatch = log_time(lines(REDISPATCH)[seen])
    until(lambda: rollout_1(run_dir)["pid"] != victim["pid"], 30, "the restart")
    t_ready = until(lambda: get(victim["url"] + "/healthz") is not None, 180, "rollout-1 ready")
    t_generating = until(lambda: generating(victim["url"]), 120, "rollout-1 generating again")
    until(lambda: len(lines(BACK)) > seen, 30, "the trainer's line")
    t_back = log_time(lines(BACK)[seen])
    return {
        "death_to_redispatch_s": t_redispatch - t_kill,
        "ready_to_first_prompts_s": t_back - t_ready,
        "first_prompts_to_generating_s": t_generating - t_back,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    args = ap.parse_args()
    samples: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="elastic-") as tmp:
        run_dir = Path(tmp) / "run"
        job_file = job(Path(tmp), args.kills, args.max_new_tokens)
        cmd = [sys.executable, "-m", "longtail_cli.main", "run", str(job_file), "-o", str(run_dir)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            until(lambda: (run_dir / "metrics.jsonl").is_file(), 300, "step 1")
            for i in range(args.kills):
                samples.append(one_kill(run_dir, i))
                print(f"kill {i + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in samples[-1].items()),
                      flush=True)  # fmt: skip
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
        rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    killed = [r["rollout_s"] for r in rows if "rollout-1" in r["failed_workers"]]
    others = [r["rollout_s"] for r in rows if not r["failed_workers"]]
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "load_avg_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "max_new_tokens": args.max_new_tokens,
        "samples": samples,
        "killed_step_rollout_s": killed,
        "other_steps_rollout_s_median": statistics.median(others) if others else None,
        "step_s_median": statistics.median(r["step_s"] for r in rows),
    }
    # Every step's first call loads the version just published (HTTP here): a rejoin's
    # catch-up is one such load, whatever the number of versions it missed.
    loads = [r.get("worker_load_s", {}).get("rollout-1") for r in rows]
    loads = [x for x in loads if x is not None]
    result["policy_load_s_median"] = statistics.median(loads) if loads else None
    for key in ("death_to_redispatch_s", "ready_to_first_prompts_s",
                "first_prompts_to_generating_s"):  # fmt: skip
        values = [s[key] for s in samples]
        result[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        print(f"{key}: median {result[key]['median']:.3f}s (min {min(values):.3f}, max "
              f"{max(values):.3f}) over {len(values)} kills")  # fmt: skip
    print(f"rollout of the killed steps {', '.join(f'{s:.2f}' for s in killed)}s; other steps "
          f"median {result['other_steps_rollout_s_median']:.2f}s; step median "
          f"{result['step_s_median']:.2f}s; load {result['load_avg_1m']:.1f} "
          f"on {result['cpus']} CPUs")  # fmt: skip
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
