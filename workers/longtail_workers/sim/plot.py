"""Per-worker timeline of one simulated step, baseline above Longtail, as a PNG.

Called by ``longtail simulate --plot FILE.png``. Each rollout worker is one row of coloured
segments (prefill, plain decode, speculative decode, idle, harvested); the trainer's update and
the weight sync follow on a row of their own, so the picture shows where the long tail leaves
GPUs idle and what SD and harvest do with it. matplotlib (a project dependency, also used by
``longtail run``'s report) is imported only here, on demand, with the non-interactive backend.
"""

from __future__ import annotations

from pathlib import Path

from longtail_workers.sim.step import StepResult

COLOURS = {
    "prefill": "#9e9e9e",
    "overhead": "#bcbd22",
    "decode": "#1f77b4",
    "speculative": "#2ca02c",
    "idle": "#d62728",
    "harvest": "#ff7f0e",
    "trainer": "#7f3fbf",
    "sync": "#444444",
}
"""Segment kind -> colour (idle in red: the GPU time the long tail wastes)."""


def _panel(ax: object, result: StepResult, title: str, x_max: float) -> None:
    workers = len(result.workers)
    for seg in result.segments:
        ax.broken_barh(  # type: ignore[attr-defined]
            [(seg.start, seg.end - seg.start)], (seg.worker - 0.4, 0.8),
            color=COLOURS[seg.kind], linewidth=0,
        )  # fmt: skip
    t = result.rollout_s
    row = workers
    ax.broken_barh([(t, result.trainer_s)], (row - 0.4, 0.8), color=COLOURS["trainer"])  # type: ignore[attr-defined]
    if result.weight_sync_s > 0:
        ax.broken_barh(  # type: ignore[attr-defined]
            [(t + result.trainer_s, result.weight_sync_s)], (row - 0.4, 0.8), color=COLOURS["sync"]
        )
    ax.set_yticks(  # type: ignore[attr-defined]
        list(range(workers + 1)), [f"rollout-{w}" for w in range(workers)] + ["trainer"]
    )
    ax.set_xlim(0, x_max)  # type: ignore[attr-defined]
    ax.invert_yaxis()  # type: ignore[attr-defined]
    ax.set_title(  # type: ignore[attr-defined]
        f"{title}: step {result.step_s:.2f} s (rollout {result.rollout_s:.2f} s, tail "
        f"{result.tail_s:.2f} s, idle {result.idle_gpu_s:.1f} GPU-s, harvested "
        f"{result.harvested_gpu_s:.1f} GPU-s)",
        fontsize=9,
    )


def timeline_png(base: StepResult, longtail: StepResult, path: str | Path, caption: str) -> None:
    """Write the two timelines (same time axis) to ``path``; ``caption`` names the profile and
    the step (printed under the plot, a roofline projection says so there)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = len(base.workers) + 1
    fig, axes = plt.subplots(2, 1, figsize=(10, 1.2 + 0.45 * rows * 2), sharex=True)
    x_max = max(base.step_s, longtail.step_s) * 1.02
    _panel(axes[0], base, "baseline (no SD, no harvest)", x_max)
    _panel(axes[1], longtail, "Longtail (adaptive SD + harvest)", x_max)
    axes[1].set_xlabel("seconds from the start of the step")
    handles = [Patch(color=c, label=k) for k, c in COLOURS.items()]
    fig.legend(handles=handles, loc="lower center", ncol=len(COLOURS), fontsize=8, frameon=False)
    fig.text(0.01, 0.005, caption, fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
