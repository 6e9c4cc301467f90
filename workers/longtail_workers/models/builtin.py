"""The built-in policies ``builtin:tiny`` and ``builtin:small``: Qwen2 models Longtail builds.

No weights can be downloaded, yet a newcomer's first ``longtail run`` needs a real policy that
already solves part of the built-in task (so GRPO gets mixed rewards within a group) and emits
long-tailed responses. This module builds one from a recipe (:mod:`longtail_workers.models.recipe`:
``builtin:tiny`` on the CPU on ``builtin:arith``, ``builtin:small`` on a GPU on
``builtin:arith-long``): a real ``transformers`` ``Qwen2ForCausalLM`` (random init, seeded)
fitted by :mod:`longtail_workers.models.sft` in two phases, then measured greedily on the task's
eval split with the ``math`` reward:

1. many steps on worked, step-by-step solutions (the careful style; tiny: 2,100);
2. a short phase on a mixture in which 65% of the solutions are the short cut ``Answer: N``.

The policy then chooses a style with its first token and mostly (greedily: always) takes the
short cut, which is right on few sums; the worked style is right far more often. Which style to
use is one decision shared by every answer, the kind GRPO learns within a few steps, and answers
grow longer as it does (issue #19; figures in docs/performance.md).

The result is cached under ``$LONGTAIL_CACHE_DIR/models/<name>-<recipe hash>/`` (default root
``~/.cache/longtail``) as an ordinary Hugging Face directory (``save_pretrained`` of model and
tokenizer, plus ``longtail_build.json`` with the recipe, seed, accuracy and build time). A build
goes to a temporary directory renamed into place, under a file lock, so concurrent workers build
once and never see a half-written model. Called by
:func:`longtail_workers.models.loading.load_policy` for ``builtin:<name>`` and by
``bench/tiny_model.py``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Qwen2ForCausalLM

from longtail_workers.models.cache import build_once
from longtail_workers.models.evaluation import greedy_accuracy
from longtail_workers.models.recipe import (
    BUILD_INFO_FILE,
    DEFAULT_RECIPE,
    SMALL,
    PolicyRecipe,
    TinyRecipe,
    build_device,
    build_estimate,
    model_config,
    policy_dir,
)
from longtail_workers.models.sft import fit
from longtail_workers.models.tokenizer import build_char_tokenizer
from longtail_workers.tasks.arith import ANSWER_PREFIX, TaskItem, generate

__all__ = [  # the recipe names are re-exported: callers import them from here
    "BUILD_INFO_FILE",
    "DEFAULT_RECIPE",
    "BuildReport",
    "PolicyRecipe",
    "TinyRecipe",
    "build_policy",
    "ensure_policy",
    "ensure_small",
    "ensure_tiny",
    "model_config",
    "policy_dir",
    "read_build_info",
    "tiny_dir",
    "with_prose_endings",
    "with_shortcuts",
]

log = logging.getLogger(__name__)
_PROSE_STREAM = 7  # seed stream of the prose-ending draw, apart from init and data order
_SHORTCUT_STREAM = 8  # seed stream of the short-cut draw


@dataclass
class BuildReport:
    """What a build measured; also written to ``longtail_build.json``."""

    recipe: dict[str, Any]
    fingerprint: str
    seed: int
    eval_accuracy: float
    eval_items: int
    eval_by_size: dict[str, list[int]]  # size -> [correct, n]
    final_train_loss: float
    phase_losses: list[float]  # final loss of each SFT phase (worked, then the style mixture)
    build_seconds: float
    train_seconds: float  # train data and both SFT phases
    torch_threads: int
    parameters: int
    device: str = "cpu"  # where it was fitted (cuda: bf16 autocast over float32 weights)
    eval_seconds: float = 0.0
    # The FLOP-based estimate of the SFT on an H100 (recipe.build_estimate), to hold the
    # measured train_seconds against on a GPU.
    estimate: dict[str, Any] = field(default_factory=dict)


def _seeded_share(n: int, fraction: float, seed: int, stream: int, knob: str, zero: str) -> Any:
    """A seeded boolean mask ``[n]`` that is True for a ``fraction`` share of the items."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"TinyRecipe.{knob} must be in [0, 1), got {fraction} ({zero})")
    rng = np.random.default_rng(np.random.SeedSequence([seed, stream]))
    return rng.random(n) < fraction


def with_prose_endings(items: Sequence[TaskItem], fraction: float, seed: int) -> list[TaskItem]:
    """A seeded ``fraction`` of ``items`` with the final ``Answer: N`` line said as prose.

    The worked steps stay as they are; only the last line becomes ``The sum is N.``, which the
    ``math`` reward does not read (no ``Answer:`` line, no ``\\boxed{}``).
    """
    why = "0 keeps every solution's Answer: line"
    prose = _seeded_share(len(items), fraction, seed, _PROSE_STREAM, "prose_answer_fraction", why)
    out = []
    for item, as_prose in zip(items, prose, strict=True):
        if as_prose:
            steps, _, last = item.solution.rpartition("\n")
            if not last.startswith(ANSWER_PREFIX):
                raise ValueError(f"solution without a final {ANSWER_PREFIX!r} line: {item!r}")
            ending = f"The sum is {item.answer}."
            item = dataclasses.replace(item, solution=f"{steps}\n{ending}" if steps else ending)
        out.append(item)
    return out


def with_shortcuts(items: Sequence[TaskItem], fraction: float, seed: int) -> list[TaskItem]:
    """A seeded ``fraction`` of ``items`` answered in the short-cut style: ``Answer: N`` alone."""
    why = "0 keeps every solution worked step by step"
    short = _seeded_share(len(items), fraction, seed, _SHORTCUT_STREAM, "shortcut_fraction", why)
    return [
        dataclasses.replace(item, solution=f"{ANSWER_PREFIX}{item.answer}") if s else item
        for item, s in zip(items, short, strict=True)
    ]


tiny_dir = policy_dir  # its first name, still used by bench/


def _build_bar(total: int, name: str) -> Any:
    """A terminal progress bar over every SFT step (off when stderr is not a terminal)."""
    return tqdm(
        total=total, desc=f"building builtin:{name}", unit="step", disable=None, leave=False
    )


def _tick(bar: Any, loss: float) -> None:
    bar.update(1)
    bar.set_postfix(loss=f"{loss:.3f}", refresh=False)


def _build_threads() -> int:
    """All cores this process may use: the build runs once (on the CPU: CPU-bound)."""
    return max(1, len(os.sched_getaffinity(0)))


def _fit_phases(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    recipe: PolicyRecipe,
    log_every: int,
) -> list[float]:
    """Both SFT phases on the recipe's train split (worked, then the short-cut mixture)."""
    train = generate(recipe.train_items, recipe.seed, "train", recipe.train_task)
    train = with_prose_endings(train, recipe.prose_answer_fraction, recipe.seed)
    mixed = with_shortcuts(train, recipe.shortcut_fraction, recipe.seed)
    first = train if recipe.style_sft else mixed
    phases = [(first, recipe.sft)] + ([(mixed, recipe.style_sft)] if recipe.style_sft else [])
    losses = []
    with _build_bar(sum(cfg.steps for _, cfg in phases), recipe.name) as bar:
        for i, (items, cfg) in enumerate(phases):
            tick = lambda _, ema: _tick(bar, ema)  # noqa: E731
            losses.append(fit(model, tokenizer, items, cfg, recipe.seed + i, log_every, tick))
    return losses


def build_policy(
    dest: Path, recipe: PolicyRecipe = DEFAULT_RECIPE, log_every: int = 0
) -> BuildReport:
    """Build, measure and save ``builtin:<recipe.name>`` into ``dest`` (new or empty)."""
    start = time.perf_counter()
    device = build_device(recipe)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(_build_threads())
    # fork_rng: seeding here must not reset the random streams of the process that asked.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        try:
            torch.manual_seed(recipe.seed)
            tokenizer = build_char_tokenizer()
            with device:  # initialised where it is fitted (the CPU for builtin:tiny, as before)
                model = Qwen2ForCausalLM(model_config(recipe, tokenizer))
            fit_start = time.perf_counter()
            losses = _fit_phases(model, tokenizer, recipe, log_every)
            eval_start = time.perf_counter()
            held_out = generate(recipe.eval_items, recipe.seed, "eval", recipe.task)
            result = greedy_accuracy(model, tokenizer, held_out)
            eval_seconds = time.perf_counter() - eval_start
            threads = torch.get_num_threads()
        finally:
            torch.set_num_threads(previous_threads)
    dest.mkdir(parents=True, exist_ok=True)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    report = BuildReport(
        recipe=dataclasses.asdict(recipe),
        fingerprint=recipe.fingerprint(),
        seed=recipe.seed,
        eval_accuracy=result.accuracy,
        eval_items=result.n,
        eval_by_size={str(k): [c, n] for k, (c, n) in result.by_size.items()},
        final_train_loss=losses[-1],
        phase_losses=losses,
        build_seconds=time.perf_counter() - start,
        train_seconds=eval_start - fit_start,
        torch_threads=threads,
        parameters=sum(p.numel() for p in model.parameters()),
        device=str(device),
        eval_seconds=eval_seconds,
        estimate=build_estimate(recipe).as_dict(),
    )
    (dest / BUILD_INFO_FILE).write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
    return report


def ensure_policy(recipe: PolicyRecipe = DEFAULT_RECIPE, log_every: int = 100) -> Path:
    """Return the cached directory of ``builtin:<recipe.name>``, building it first if it is
    missing (:func:`~longtail_workers.models.cache.build_once`: concurrent callers build it
    once)."""
    final = policy_dir(recipe)
    reports: list[BuildReport] = []

    def build(tmp: Path) -> None:
        log.info("building builtin:%s into %s (one-off: minutes)", recipe.name, final)
        if recipe.device == "auto" and build_device(recipe).type == "cpu":
            log.warning(
                "builtin:%s is sized for a GPU and none is visible: building it on the CPU in "
                "float32 takes hours (a GPU does it in minutes)", recipe.name
            )  # fmt: skip
        reports.append(build_policy(tmp, recipe, log_every=log_every))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # hand the build's GPU memory back to the job's processes

    if build_once(final, BUILD_INFO_FILE, build):
        report = reports[0]
        log.info(
            "built builtin:%s in %.0f s, eval accuracy %.3f",
            recipe.name,
            report.build_seconds,
            report.eval_accuracy,
        )
    return final


ensure_tiny = ensure_policy  # its first name: ensure_tiny() builds builtin:tiny


def ensure_small() -> Path:
    """The cached ``builtin:small`` directory, built first (on a GPU when there is one)."""
    return ensure_policy(SMALL)


def read_build_info(model_dir: Path) -> dict[str, Any]:
    """The ``longtail_build.json`` of a built model directory."""
    path = Path(model_dir) / BUILD_INFO_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: {model_dir} is not a model built by Longtail "
            f"(build builtin:tiny with load_policy('builtin:tiny'))"
        )
    return dict(json.loads(path.read_text()))
