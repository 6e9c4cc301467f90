"""``initialDrafter: builtin:<name>``: a built-in policy's drafter, fitted on first use and cached.

A drafter trained from scratch online stays at a low accepted length through example 01's
run, where a drafter fitted before the run on the policy's own answers starts high and, kept
fresh by the online windows, stays there (the figures: docs/performance.md, "The first run
learns"). For a user's model that fit is ``longtail drafter fit``; for the built-in
policy Longtail does it itself, as it builds the policy: on first use, the same offline fit
(:func:`~longtail_workers.warmstart.offline.fit_offline`) on the policy's task's training
prompts sampled at temperature 1 (``builtin:tiny``: ``builtin:arith`` on the CPU;
``builtin:small``: ``builtin:arith-long`` with answers up to 2,048 tokens, on the GPU when there
is one), in the job's ``drafterTraining.layout``, cached under ``$LONGTAIL_CACHE_DIR/drafters/``
next to the model it belongs to (the directory name carries the model's recipe hash, the layout
and the fit's own hash, so a rebuilt model gets a new drafter).

Called by :func:`longtail_workers.runtime.initial_drafter` (rollout workers, the trainer) and by
the local launcher, which prepares it once before any process starts.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from longtail_api.policies import DrafterLayout, LossWeightsSpec
from longtail_api.spec import DatasetSpec
from longtail_workers.drafter.checkpoint import save_drafter
from longtail_workers.models.cache import build_once
from longtail_workers.models.loading import load_policy
from longtail_workers.warmstart.offline import fit_offline, sampling_requests
from longtail_workers.warmstart.recipe import (
    BUILD_INFO_FILE,
    BUILTIN_TARGETS,
    DEFAULT_DRAFTER_RECIPE,
    SMALL_DRAFTER_RECIPE,
    BuiltinTarget,
    DrafterRecipe,
    builtin_drafter_dir,
    builtin_target,
    is_builtin,
)

__all__ = [  # the recipe names are re-exported: callers import them from here too
    "BUILD_INFO_FILE",
    "BUILTIN_TARGETS",
    "DEFAULT_DRAFTER_RECIPE",
    "SMALL_DRAFTER_RECIPE",
    "BuiltinTarget",
    "DrafterRecipe",
    "build_builtin_drafter",
    "builtin_drafter_dir",
    "ensure_builtin_drafter",
    "is_builtin",
]

log = logging.getLogger(__name__)


def build_builtin_drafter(
    dest: Path, name: str, layout: DrafterLayout, recipe: DrafterRecipe | None = None
) -> dict[str, Any]:
    """Fit the drafter of ``builtin:<name>`` and write it with its build record into ``dest``."""
    recipe = recipe or builtin_target(name)[1].drafter
    started = time.perf_counter()
    device, dtype = recipe.placement()
    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))  # once, CPU-bound: every core
    try:
        model, tokenizer = load_policy(name, dtype=dtype, device=device)
        requests = sampling_requests(
            DatasetSpec(path=recipe.dataset),
            recipe.sampling,
            tokenizer,
            recipe.prompts,
            recipe.max_new_tokens,
        )
        with tqdm(
            total=recipe.fit.steps, desc=f"fitting the {name} drafter", unit="step",
            disable=None, leave=False,
        ) as bar:  # fmt: skip
            fitted = fit_offline(
                model,
                name,
                requests,
                recipe.fit,
                layout=layout,
                loss_weights=LossWeightsSpec(),
                on_step=lambda _, loss: bar.update(1),
            )
    finally:
        torch.set_num_threads(previous)
    save_drafter(fitted.drafter, dest)
    info = {
        "drafter_of": name,
        "layout": layout,
        "recipe": dataclasses.asdict(recipe),
        "fingerprint": recipe.fingerprint(),
        "heldout_top1_before": fitted.top1_before,
        "heldout_top1": fitted.top1_after,
        "heldout_answers": fitted.held_out,
        "sampled_tokens": fitted.tokens,
        "sample_seconds": fitted.sample_seconds,
        "fit_seconds": fitted.fit_seconds,
        "build_seconds": time.perf_counter() - started,
        "device": device,
        "dtype": dtype,
    }
    (dest / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return info


def ensure_builtin_drafter(
    name: str, layout: DrafterLayout, recipe: DrafterRecipe | None = None
) -> Path:
    """The cached drafter directory of ``builtin:<name>`` in ``layout``, fitted first if missing
    (building the model too if that is missing). ``recipe``: the target's own drafter recipe."""
    recipe = recipe or builtin_target(name)[1].drafter
    final = builtin_drafter_dir(name, layout, recipe)

    def build(tmp: Path) -> None:
        log.info("fitting the %s drafter into %s (one-off, about a minute)", name, final)
        info = build_builtin_drafter(tmp, name, layout, recipe)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # hand the fit's GPU memory back to the job's processes
        log.info(
            "fitted the %s drafter in %.0f s: held-out top-1 %.3f",
            name,
            info["build_seconds"],
            info["heldout_top1"],
        )

    build_once(final, BUILD_INFO_FILE, build)
    return final
