"""Recipes and cache names of the built-in drafters (``initialDrafter: builtin:<name>``).

What determines a built-in drafter's weights (:class:`DrafterRecipe`, with the model's recipe
and the layout), the settings of an offline fit (:class:`OfflineFit`, :class:`Sampling`: also
``longtail drafter fit``'s options), and where each built-in drafter lives in the cache
(:func:`builtin_drafter_dir`). The fit itself is :mod:`~longtail_workers.warmstart.builtin`.

Imports neither torch nor transformers: ``longtail run`` asks whether a built-in drafter is
fitted already before it starts any process (:func:`longtail_workers.local.run.prepare_builtins`),
and that answer must not cost the seconds of those imports.

Called by :mod:`~.builtin`, :mod:`~.offline`, the local launcher, tests and benches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from longtail_api.policies import DrafterLayout
from longtail_workers.models.cache import cache_root
from longtail_workers.models.recipe import SMALL, TINY, PolicyRecipe, placement
from longtail_workers.tasks import arith_long


@dataclass(frozen=True)
class Sampling:
    """How the policy's answers are sampled: a job's rollout temperature, top-p and seed."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class OfflineFit:
    """Settings of one offline fit (the ``longtail drafter fit`` options)."""

    steps: int = 600  # AdamW steps
    batch_size: int = 16  # windows per step
    learning_rate: float = 3e-4
    window_tokens: int = 512  # pairs per window
    max_running: int = 64  # answers sampled at once
    seed: int = 0  # order of the windows


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


def builtin_target(name: str) -> tuple[str, BuiltinTarget]:
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
    short, found = builtin_target(name)
    recipe = recipe or found.drafter
    tag = f"{short}-{found.model.fingerprint()}-{layout}-{recipe.fingerprint()}"
    return cache_root() / "drafters" / tag


def is_builtin(initial_drafter: str | None) -> bool:
    """Whether ``drafterTraining.initialDrafter`` names a built-in drafter."""
    return bool(initial_drafter) and str(initial_drafter).startswith(BUILTIN_PREFIX)
