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
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from longtail_api.policies import DrafterLayout, LossWeightsSpec
from longtail_api.spec import DatasetSpec
from longtail_workers.drafter.checkpoint import save_drafter
from longtail_workers.models.cache import build_once, cache_root
from longtail_workers.models.loading import load_policy
from longtail_workers.models.recipe import SMALL, TINY, PolicyRecipe, placement
from longtail_workers.tasks import arith_long
from longtail_workers.warmstart.offline import OfflineFit, Sampling, fit_offline, sampling_requests

log = logging.getLogger(__name__)
BUILD_INFO_FILE = "longtail_build.json"
# Bump when the fit code changes in a way that changes the weights for the same recipe.
BUILD_CODE_VERSION = 1
BUILTIN_PREFIX = "builtin:"


@dataclass(frozen=True)
class DrafterRecipe:
    """What determines the built-in drafter's weights (with the model's recipe and the layout)."""

    dataset: str = "builtin:arith"  # prompts: the task's training split, never its eval split
    prompts: int = 512  # answers sampled (every 10th held out to measure the fit)
    max_new_tokens: int = 256  # example 01's answer budget
    sampling: Sampling = field(default_factory=Sampling)  # temperature 1, as example 01 samples
    fit: OfflineFit = field(default_factory=OfflineFit)
    # Where it is fitted: "cpu" (float32; builtin:tiny), or "auto": on CUDA with the policy in
    # bfloat16, as a GPU job runs it, when a GPU is visible, else on the CPU in float32.
    device: str = "cpu"

    def fingerprint(self) -> str:
        recipe = dataclasses.asdict(self)
        if recipe["device"] == "cpu":  # added later: drafters built before keep their names
            del recipe["device"]
        blob = json.dumps({"recipe": recipe, "code": BUILD_CODE_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def placement(self) -> tuple[str, str]:
        """``(device, dtype)`` for :func:`~longtail_workers.models.loading.load_policy`."""
        device = placement(self.device, "DrafterRecipe.device")
        return (str(device), "bfloat16") if device.type == "cuda" else ("cpu", "float32")


@dataclass(frozen=True)
class BuiltinTarget:
    """A built-in policy and the recipe of the drafter fitted to it."""

    model: PolicyRecipe
    drafter: DrafterRecipe


DEFAULT_DRAFTER_RECIPE = DrafterRecipe()
SMALL_DRAFTER_RECIPE = DrafterRecipe(
    dataset="builtin:arith-long",
    prompts=256,  # two waves of 128 answers; ~100k sampled tokens at the task's mean length
    max_new_tokens=arith_long.MAX_NEW_TOKENS,  # example 06's budget: the whole tail
    fit=OfflineFit(max_running=128),
    device="auto",
)
"""Estimate on an H100 (to be measured in the GPU suite): sampling is at most ~2 x 2,048
engine steps of a 535M model at batch <= 128 (~10 ms each with CUDA graphs: ~20-40 s), the fit
600 steps of 16 windows of 512 tokens through one 1536-wide layer (~10 ms each: ~6 s)."""
# builtin:<name> -> the model and the drafter recipe; api/longtail_api/rules.py's
# BUILTIN_DRAFTERS lists the same names (a test keeps them equal)
BUILTIN_TARGETS: dict[str, BuiltinTarget] = {
    "tiny": BuiltinTarget(TINY, DEFAULT_DRAFTER_RECIPE),
    "small": BuiltinTarget(SMALL, SMALL_DRAFTER_RECIPE),
}


def _target(name: str) -> tuple[str, BuiltinTarget]:
    """``(model name, its target)`` of ``builtin:<name>``; ValueError naming the known ones."""
    short = name.removeprefix(BUILTIN_PREFIX)
    if not name.startswith(BUILTIN_PREFIX) or short not in BUILTIN_TARGETS:
        known = ", ".join(BUILTIN_PREFIX + n for n in sorted(BUILTIN_TARGETS))
        raise ValueError(
            f"drafterTraining.initialDrafter: {name!r} is not a built-in drafter; built-in "
            f"drafters: {known} (or give a directory written by `longtail drafter fit`)"
        )
    return short, BUILTIN_TARGETS[short]


def builtin_drafter_dir(
    name: str, layout: DrafterLayout, recipe: DrafterRecipe | None = None
) -> Path:
    """Where the drafter of ``builtin:<name>`` in ``layout`` lives (it may not exist yet).
    ``recipe``: the target's own drafter recipe."""
    short, target = _target(name)
    recipe = recipe or target.drafter
    tag = f"{short}-{target.model.fingerprint()}-{layout}-{recipe.fingerprint()}"
    return cache_root() / "drafters" / tag


def build_builtin_drafter(
    dest: Path, name: str, layout: DrafterLayout, recipe: DrafterRecipe | None = None
) -> dict[str, Any]:
    """Fit the drafter of ``builtin:<name>`` and write it with its build record into ``dest``."""
    recipe = recipe or _target(name)[1].drafter
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
    recipe = recipe or _target(name)[1].drafter
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


def is_builtin(initial_drafter: str | None) -> bool:
    """Whether ``drafterTraining.initialDrafter`` names a built-in drafter."""
    return bool(initial_drafter) and str(initial_drafter).startswith(BUILTIN_PREFIX)
