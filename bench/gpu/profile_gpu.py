"""``longtail profile`` for the GPU suite: per batch size, within a deadline, sync assumed.

Called by ``bench/gpu/run.sh``'s profile stages (one unattended call on a lent GPU machine).

Usage: ``profile_gpu.py DEADLINE_S PROFILE-ARGS...``. Replaces the loopback
weight-sync measurement with the roofline's assumed rates (labelled ``assumed`` in the file;
``PROFILE_GPU_MEASURE_SYNC=1`` keeps the measurement);
measures the forward and engine-step curves one batch size at a time, dropping (and noting) a
batch size that runs out of device memory and the remaining ones once DEADLINE_S seconds have
passed (the first batch size always runs); falls back to the roofline's GRPO update time when
measuring it runs out of memory (a 7B policy with AdamW on an 80 GB card); leaves the drafter's
catch-up rate, the per-call overheads and the drafter merge unmeasured (optional fields) when
measuring them fails. Every such change is
appended to the profile's notes.
"""

import dataclasses
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from longtail_api.profile import EngineProfile, SyncCosts
from longtail_workers.profile import main as pm
from longtail_workers.profile import models
from longtail_workers.sim import roofline

START = time.monotonic()
DEADLINE_S = float(sys.argv[1])
NOTES: list[str] = []


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:160]


def per_batch(measure: Callable[..., Any], what: str, share: float) -> Callable[..., Any]:
    """``measure(model, drafter, grid, ...)`` one batch size at a time (see the module text),
    adding batch sizes until ``share`` of the deadline has passed."""

    def run(*args: Any, **kwargs: Any) -> Any:
        grid, parts, skipped = args[2], [], []
        for i, b in enumerate(grid.batches):
            if i and time.monotonic() - START > share * DEADLINE_S:
                skipped.append(b)
                continue
            one = dataclasses.replace(grid, batches=(b,))
            try:
                parts.append(measure(*args[:2], one, *args[3:], **kwargs))
            except torch.OutOfMemoryError as exc:
                print(f"{what}: batch {b} out of device memory, dropped", flush=True)
                NOTES.append(f"{what}: batch {b} dropped, out of memory ({_first_line(exc)})")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # the next batch's buffers should not fragment
        if skipped:
            NOTES.append(f"{what}: batches {skipped} not measured (bench/gpu/run.sh deadline)")
            print(f"{what}: deadline reached, skipped batches {skipped}", flush=True)
        if not parts:
            raise RuntimeError(f"{what}: no batch size could be measured")
        merged = {
            f.name: [p for part in parts for p in getattr(part, f.name)]
            for f in dataclasses.fields(parts[0])
        }
        return type(parts[0])(**merged)

    return run


def assumed_sync(policy: torch.nn.Module, repeats: int) -> tuple[float, SyncCosts]:
    costs = roofline.sync_costs(models.model_shape(policy))
    rates = (costs.http_pack_bytes_per_s, costs.http_pull_bytes_per_s, costs.load_bytes_per_s)
    NOTES.append(
        "weight sync NOT measured (bench/gpu/run.sh skips the loopback measurement): "
        "weight_sync_s and weight_sync are the roofline's assumed rates (sim/roofline.py); "
        "bench/gpu/weight_sync_gpu.py measures a GPU's pack and load"
    )
    return sum(costs.version_bytes / r for r in rates), costs


measured_update = pm.grpo_update_costs


def update_or_roofline(policy: torch.nn.Module, *args: Any) -> tuple[float, float]:
    try:
        return measured_update(policy, *args)
    except torch.OutOfMemoryError as exc:
        message = _first_line(exc)
    policy.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()
    flops = (6 + 2 * roofline.TRAINER_EXTRA_FORWARDS) * models.model_shape(policy).params
    NOTES.append(
        f"GRPO update NOT measured (out of memory: {message}); trainer_seconds_per_token is "
        "the roofline's assumption (sim/roofline.py)"
    )
    print("GRPO update: out of device memory, the roofline's figure is used", flush=True)
    return flops / (roofline.PEAK_FLOPS * roofline.TRAIN_FLOPS_FRACTION), 0.0


# The forwards run first and cost far less than the engine steps (no prefill of every row), so
# they stop early enough that the engine steps, which the simulator's step times come from, get
# most of the time.
measured_catch_up = pm._catch_up


def catch_up_or_none(*args: Any) -> float | None:
    """The catch-up rate, or None (not measured): its first speculative step feeds every row's
    response so far through the drafter in one wide eager forward, a path the decode and
    speculative curves do not take, so its failure should not cost the whole profile."""
    try:
        rate: float | None = measured_catch_up(*args)
    except Exception as exc:  # noqa: BLE001 - recorded in the notes, with the traceback above
        traceback.print_exc()
        NOTES.append(f"drafter catch-up NOT measured ({type(exc).__name__}: {_first_line(exc)})")
        return None
    return rate


pm.step_curves = per_batch(pm.step_curves, "forwards", 0.4)
pm.engine_curves = per_batch(pm.engine_curves, "engine steps", 1.0)
if os.environ.get("PROFILE_GPU_MEASURE_SYNC") != "1":  # rl_step_gpu.py: a 0.5B policy's is quick
    pm.measure_sync = assumed_sync
    pm._sync_rates = lambda costs: "weight sync rates: assumed (roofline), not measured here"


def or_none(measure: Any, what: str) -> Any:
    """``measure``, or None with a note when it fails: the per-call costs and the drafter merge
    come after the curves and must not cost the profile its file."""

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return measure(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - recorded in the notes, with the traceback above
            traceback.print_exc()
            NOTES.append(f"{what} NOT measured ({type(exc).__name__}: {_first_line(exc)})")
            return None

    return run


pm.grpo_update_costs = update_or_roofline
pm._catch_up = catch_up_or_none
pm._calls = or_none(pm._calls, "generate-call overheads")
pm.merge_costs = or_none(pm.merge_costs, "drafter merge")
argv = sys.argv[2:]
code = pm.main(argv)
if code == 0 and NOTES:
    out = pm.build_parser().parse_args(argv).out
    profile = EngineProfile.read(out)
    dataclasses.replace(profile, notes=[*profile.notes, *NOTES]).write(out)
    print("notes added to the profile:", *NOTES, sep="\n  ")
sys.exit(code)
