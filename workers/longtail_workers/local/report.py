"""The run report of ``longtail run``: CSV, PNG plots and a Markdown/HTML summary.

Called by ``local/run.py`` when the run ends (complete, stopped or failed) with the run
directory; reads ``metrics.jsonl`` (one :class:`~longtail_api.steprow.StepRow` per step, written
by the trainer) and the harvest books, and writes ``metrics.csv``, ``report/*.png`` (reward
and accuracy per step, step time split rollout/tail/train, mean accepted length per step, also
per draft source; matplotlib's Agg backend, no display needed), ``report/summary.md``,
``report/summary.html`` and ``summary.json``. The weight sync of each step (the ``sync_*``
columns: the policy version its rollout used, per phase, bytes, GB/s) is in the CSV, and its
means in the summary. So is what became of the drafter candidates: how many the trainer
refused, by reason (the rows' ``drafter_refused``), and, when the run published no online
drafter version, why (``drafter_unpublished``, the trainer's words, with the harvest's figures
when no candidate was trained). Speculation by draft source (``learned``, ``history``: each
one's share of the tokens and its accepted length) is in the CSV's ``sd_fraction_<source>``
and ``accepted_length_<source>`` columns and the summary's means. Elastic rollout: the rollout
workers each step had are the CSV's ``rollout_workers`` column, and the summary's
``rollout_resizes`` lists the steps where that count changed (``was`` -> ``rollout_workers``:
the run shrank or grew), next to ``rollout_shrinks``, the workers ``longtail run`` lost past
their restarts (``local/restarts.py``).
"""

from __future__ import annotations

import csv
import html
import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from longtail_api.drafterstatus import NO_CANDIDATE
from longtail_api.policies import DRAFT_SOURCES
from longtail_api.steprow import METRICS_FILE, SYNC_PHASES, StepRow
from longtail_workers.local.coordinator import HarvestBooks

CSV_COLUMNS = (
    "step", "policy_version", "drafter_version", "reward_mean", "accuracy", "eval_accuracy",
    "eval_sampled_accuracy", "answers", "mean_length", "max_length", "rollout_s", "tail_s",
    "train_s", "sync_s", "step_s", "sd_fraction", "mean_accepted_length", "idle_s",
    "harvested_s", "trainer_harvested_s", "redispatched", "rollout_workers", "sync_version",
    "sync_transport",
    "sync_gather_s", "sync_pack_s", "sync_wire_s", "sync_load_s", "sync_pause_s", "sync_bytes",
    "sync_gb_per_s", *(f"sd_fraction_{s}" for s in DRAFT_SOURCES),
    *(f"accepted_length_{s}" for s in DRAFT_SOURCES),
)  # fmt: skip
LAST_STEPS = 5  # the "last steps" window of the summary's accepted length
_COUNTS = ("drafter_candidates_refused",)  # the summary's dicts that the Markdown table shows


def read_rows(run_dir: Path) -> list[StepRow]:
    """The trainer's rows (``metrics.jsonl``); a malformed line raises naming its number."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return []
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    return [StepRow.from_dict(json.loads(ln), f"{path.name}:{i}") for i, ln in enumerate(lines, 1)]


def merge_books(rows: list[StepRow], books: HarvestBooks | None) -> None:
    if books is None:
        return
    for row in rows:
        if row.step in books.idle or row.idle_s is None:
            row.idle_s = books.idle.get(row.step, 0.0)
            row.harvested_s = books.harvested.get(row.step, 0.0)
        if books.trainer_tracked and row.trainer_harvested_s is None:
            row.trainer_harvested_s = books.trainer_harvested.get(row.step, 0.0)


def summarize(rows: list[StepRow], info: dict[str, Any]) -> dict[str, Any]:
    final_eval = _last(rows, lambda r: r.eval_accuracy)
    final_sampled = _last(rows, lambda r: r.eval_sampled_accuracy)
    step_times = [r.step_s for r in rows]
    trainer = [r.trainer_harvested_s for r in rows if r.trainer_harvested_s is not None]
    return {
        **info,
        "steps_completed": rows[-1].step if rows else 0,
        "final_eval_accuracy": final_eval,
        "eval_gain_points": _gain(info.get("start_eval_accuracy"), final_eval),
        "final_eval_sampled_accuracy": final_sampled,
        "eval_sampled_gain_points": _gain(info.get("start_eval_sampled_accuracy"), final_sampled),
        "mean_step_s": sum(step_times) / len(step_times) if step_times else None,
        "mean_reward_first": rows[0].reward_mean if rows else None,
        "mean_reward_last": rows[-1].reward_mean if rows else None,
        "sd_fraction_mean": _mean([r.sd_fraction for r in rows]),
        "accepted_length_mean": _mean([r.mean_accepted_length or None for r in rows]),
        # The online drafter keeping up with the policy (issue #19's figure): the last 5 steps.
        "accepted_length_last5": _mean(
            [r.mean_accepted_length or None for r in rows[-LAST_STEPS:]]
        ),
        "rollout_share": _share(rows, lambda r: r.rollout_s),
        "train_share": _share(rows, lambda r: r.train_s),
        "idle_s_total": sum(r.idle_s or 0.0 for r in rows),
        "harvested_s_total": sum(r.harvested_s or 0.0 for r in rows),
        **({"trainer_harvested_s_total": sum(trainer)} if trainer else {}),
        "final_drafter_version": rows[-1].drafter_version if rows else None,
        "drafter_candidates_rejected": sum(r.drafter_candidates_rejected for r in rows),
        **_draft_sources(rows),
        **_drafter_outcome(rows),
        "acceptance_collapsed_steps": [r.step for r in rows if r.acceptance_collapsed],
        **_weight_sync(rows),
        "rollout_resizes": rollout_resizes(rows),
    }


def rollout_resizes(rows: list[StepRow]) -> list[dict[str, int]]:
    """The steps whose rollout had another count of workers than the step before: ``{"step",
    "was", "rollout_workers"}`` each (rows without the count are skipped)."""
    out, was = [], None
    for row in rows:
        now = row.rollout_workers
        if now is None:
            continue
        if was is not None and now != was:
            out.append({"step": row.step, "was": was, "rollout_workers": now})
        was = now
    return out


def _draft_sources(rows: list[StepRow]) -> dict[str, Any]:
    """Per draft source (``learned``, ``history``), over the rows that split their speculation
    by source: ``sd_fraction_mean_<source>`` (its share of all tokens; 0 in a step it drafted
    nothing) and ``accepted_length_mean_<source>`` (over the steps it drafted in). Nothing for
    runs whose rows have no split (written before it existed)."""
    split = [r for r in rows if r.sd_fraction_by_source or r.accepted_length_by_source]
    sources = sorted({s for r in split for s in r.sd_fraction_by_source}, key=_source_order)
    out: dict[str, Any] = {}
    for source in sources:
        out[f"sd_fraction_mean_{source}"] = _mean(
            [r.sd_fraction_by_source.get(source, 0.0) for r in split]
        )
        out[f"accepted_length_mean_{source}"] = _mean(
            [r.accepted_length_by_source.get(source) or None for r in split]
        )
    return out


def _source_order(source: str) -> tuple[int, str]:
    """The known sources in ``DRAFT_SOURCES`` order, any other after them."""
    known = DRAFT_SOURCES.index(source) if source in DRAFT_SOURCES else len(DRAFT_SOURCES)
    return known, source


def _drafter_outcome(rows: list[StepRow]) -> dict[str, Any]:
    """``drafter_candidates_refused`` (by reason) and, when no online drafter version was
    published, ``drafter_unpublished``: why, as the trainer said at the last step."""
    refused: Counter[str] = Counter()
    for row in rows:
        refused.update(row.drafter_refused)
    out: dict[str, Any] = {"drafter_candidates_refused": dict(refused)} if refused else {}
    why = rows[-1].drafter_unpublished if rows and rows[-1].drafter_version < 0 else None
    if why is not None and why.startswith(NO_CANDIDATE):
        idle = sum(r.idle_s or 0.0 for r in rows)
        harvested = sum((r.harvested_s or 0.0) + (r.trainer_harvested_s or 0.0) for r in rows)
        why += f"; this run harvested {harvested:.1f} of {idle:.1f} idle worker-seconds"
    if why is not None:
        out["drafter_unpublished"] = why
    return out


def _weight_sync(rows: list[StepRow]) -> dict[str, Any]:
    """Mean seconds per phase, GB/s and transport of the versions the rows' rollouts loaded
    (rows without a booked sync are left out; nothing when none has one)."""
    synced = [r for r in rows if r.sync_version is not None]
    if not synced:
        return {}
    transports = sorted({r.sync_transport for r in synced if r.sync_transport})
    out: dict[str, Any] = {"weight_sync_transport": ", ".join(transports) or None}
    for phase in SYNC_PHASES:
        out[f"weight_sync_{phase}_s_mean"] = _mean([getattr(r, f"sync_{phase}_s") for r in synced])
    out["weight_sync_gb_per_s_mean"] = _mean([r.sync_gb_per_s for r in synced])
    return out


def _share(rows: list[StepRow], part: Callable[[StepRow], float]) -> float | None:
    """Share of all step time spent in ``part`` (rollout, train)."""
    total = sum(r.step_s for r in rows)
    return sum(part(r) for r in rows) / total if total else None


def _last(rows: list[StepRow], value: Callable[[StepRow], float | None]) -> float | None:
    values = [v for v in map(value, rows) if v is not None]
    return float(values[-1]) if values else None


def _gain(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else 100 * (end - start)


def _mean(values: list[Any]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def write_csv(rows: list[StepRow], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            values = row.to_dict()
            for source in DRAFT_SOURCES:  # flat columns: a step row keeps them as dicts
                values[f"sd_fraction_{source}"] = row.sd_fraction_by_source.get(source, "")
                values[f"accepted_length_{source}"] = row.accepted_length_by_source.get(source, "")
            w.writerow({k: values.get(k, "") for k in CSV_COLUMNS})


def plot(rows: list[StepRow], out: Path, info: dict[str, Any]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r.step for r in rows]
    files = []
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [r.reward_mean for r in rows], label="reward (rollout)")
    ax.plot(steps, [r.accuracy for r in rows], label="accuracy (rollout)", alpha=0.7)
    for key, label in (("eval_accuracy", "greedy"), ("eval_sampled_accuracy", "sampled")):
        start = info.get(f"start_{key}")
        ev = [(0, start)] if start is not None else []
        evals = [(r.step, r.eval_accuracy if key == "eval_accuracy" else r.eval_sampled_accuracy)
                 for r in rows]  # fmt: skip
        ev += [(step, value) for step, value in evals if value is not None]
        if ev:
            ax.plot([s for s, _ in ev], [a for _, a in ev], "o-", label=f"{label} eval accuracy")
    ax.set(xlabel="step", ylabel="fraction", title="Reward and accuracy per step")
    ax.legend(fontsize=8)
    files.append(_save(fig, out / "reward_accuracy.png"))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    head = [r.rollout_s - r.tail_s for r in rows]
    tail = [r.tail_s for r in rows]
    train = [r.train_s + r.sync_s for r in rows]
    ax.bar(steps, head, label="rollout")
    ax.bar(steps, tail, bottom=head, label="tail")
    ax.bar(
        steps, train, bottom=[a + b for a, b in zip(head, tail, strict=True)], label="train+sync"
    )
    ax.set(xlabel="step", ylabel="seconds", title="Step time split")
    ax.legend(fontsize=8)
    files.append(_save(fig, out / "step_time.png"))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    # A step without a figure is a gap in the line (NaN), as matplotlib draws a None.
    accepted = [
        math.nan if r.mean_accepted_length is None else r.mean_accepted_length for r in rows
    ]
    ax.plot(steps, accepted, "o-", label="all")
    sources = sorted({s for r in rows for s in r.accepted_length_by_source}, key=_source_order)
    for source in sources:  # by draft source: a step it drafted nothing in is a gap
        by_source = [r.accepted_length_by_source.get(source) or math.nan for r in rows]
        ax.plot(steps, by_source, ".--", label=source)
    if sources:
        ax.legend(fontsize=8)
    ax.set(xlabel="step", ylabel="tokens per SD step", title="Mean accepted length per step")
    files.append(_save(fig, out / "accepted_length.png"))
    return files


def _save(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name


def markdown(summary: dict[str, Any], images: list[str]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):  # resizes
            return "; ".join(", ".join(f"{k} {x}" for k, x in d.items()) for d in v)
        if isinstance(v, list):  # lost_workers, restarted_workers
            return ", ".join(map(str, v)) or "none"
        if isinstance(v, dict):  # drafter_candidates_refused: by reason
            return ", ".join(f"{k} {n}" for k, n in v.items())
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = [f"# Run summary: {summary.get('job', '')}", "", "| | |", "|---|---|"]
    shown = {k: v for k, v in summary.items() if k in _COUNTS or not isinstance(v, dict)}
    lines += [f"| {k} | {fmt(v)} |" for k, v in shown.items()]
    lines += [""] + [f"![{name}]({name})" for name in images]
    return "\n".join(lines) + "\n"


def write_report(run_dir: Path, books: HarvestBooks | None, info: dict[str, Any]) -> dict[str, Any]:
    """Write every report file; returns the summary dict."""
    rows = read_rows(run_dir)
    merge_books(rows, books)
    summary = summarize(rows, info)
    write_csv(rows, run_dir / "metrics.csv")
    out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    images = plot(rows, out, info) if rows else []
    md = markdown(summary, images)
    (out / "summary.md").write_text(md)
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>"
                   for k, v in summary.items())  # fmt: skip
    imgs = "".join(f'<p><img src="{html.escape(n)}"></p>' for n in images)
    (out / "summary.html").write_text(
        f"<!doctype html><title>longtail run</title><table>{body}</table>{imgs}\n"
    )
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
