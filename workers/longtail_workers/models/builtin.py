"""``builtin:tiny``: a small Qwen2 policy Longtail builds itself, warm-started on builtin:arith.

No weights can be downloaded, yet a newcomer's first ``longtail run`` needs a real policy that
already solves part of the built-in task (so GRPO gets mixed rewards within a group) and emits
long-tailed responses. This module builds one: a real ``transformers`` ``Qwen2ForCausalLM``
(random init, seeded) fitted by :mod:`longtail_workers.models.sft` in two phases, then measured
greedily on the task's eval split with the ``math`` reward:

1. 2,100 steps on worked, step-by-step solutions (the careful style);
2. 200 steps on a mixture in which 65% of the solutions are the short cut ``Answer: N`` alone.

The policy then chooses a style with its first token and mostly (greedily: always) takes the
short cut, which is right on few sums; the worked style is right far more often. Which style to
use is one decision shared by every answer, the kind GRPO learns within a few steps, and answers
grow longer as it does (issue #19; figures in docs/performance.md).

The result is cached under ``$LONGTAIL_CACHE_DIR/models/tiny-<recipe hash>/`` (default root
``~/.cache/longtail``) as an ordinary Hugging Face directory (``save_pretrained`` of model and
tokenizer, plus ``longtail_build.json`` with the recipe, seed, accuracy and build time). A build
goes to a temporary directory renamed into place, under a file lock, so concurrent workers build
once and never see a half-written model. Called by
:func:`longtail_workers.models.loading.load_policy` for ``builtin:tiny`` and by
``bench/tiny_model.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
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
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from longtail_workers.models.cache import build_once, cache_root
from longtail_workers.models.evaluation import greedy_accuracy
from longtail_workers.models.sft import SftConfig, fit
from longtail_workers.models.tokenizer import build_char_tokenizer
from longtail_workers.tasks.arith import ANSWER_PREFIX, ArithConfig, TaskItem, generate

log = logging.getLogger(__name__)
BUILD_INFO_FILE = "longtail_build.json"
# Bump when the build code changes in a way that changes the weights for the same recipe.
BUILD_CODE_VERSION = 1
_PROSE_STREAM = 7  # seed stream of the prose-ending draw, apart from init and data order
_SHORTCUT_STREAM = 8  # seed stream of the short-cut draw


@dataclass(frozen=True)
class TinyRecipe:
    """Everything that determines the built weights; its hash names the cache directory."""

    # Architecture (Qwen2). Tied embeddings: the LM head is the embedding, as in small Qwen2.5.
    num_layers: int = 4
    hidden_size: int = 256
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 2048
    seed: int = 0  # model init and data order
    # 2,100 steps: worked solutions reliable on small sums (docs/performance.md, #19); 700
    # steps leave even two-operand sums near-ties that RL updates flip.
    sft: SftConfig = field(default_factory=lambda: SftConfig(steps=2100))
    # SFT data: the task's own train split (long items included, so that the model also
    # writes long, well-formed solutions for them: the rollout long tail).
    train_items: int = 20000
    train_task: ArithConfig = field(default_factory=ArithConfig)
    # Share of SFT solutions that end in prose ("The sum is 21.") instead of the "Answer: 21"
    # line the math reward reads, as base models often state a result outside the requested
    # format. A variant knob for RL experiments (format headroom that GRPO learns within a few
    # steps, docs/performance.md, RL loop); the shipped recipe keeps every Answer: line.
    prose_answer_fraction: float = 0.0
    # Share of SFT solutions in the short-cut style: the answer line alone, no worked steps
    # (``Answer: 21``). The policy then chooses a style with its first token; the short cut is
    # right on small sums and mostly wrong on long ones, so which style to use is a decision
    # GRPO can learn (issue #19).
    shortcut_fraction: float = 0.65
    # The short-cut style is taught in a second, short SFT phase on the mixture (None: mixed into
    # the main fit). The main fit then spends every step on worked solutions, which is what
    # makes that style reliable; the second phase only adds the new style and its share.
    style_sft: SftConfig | None = field(
        default_factory=lambda: SftConfig(steps=200, lr=3e-4, warmup_steps=10)
    )
    # Measurement: greedy accuracy on the eval split of this task (the builtin:arith default).
    task: ArithConfig = field(default_factory=ArithConfig)
    eval_items: int = 200

    def fingerprint(self) -> str:
        """Short stable hash of the recipe and the build code version."""
        recipe = dataclasses.asdict(self)
        for knob in ("prose_answer_fraction", "shortcut_fraction", "style_sft"):  # added later:
            if not recipe[knob]:  # caches built before stay valid
                del recipe[knob]
        blob = json.dumps({"recipe": recipe, "code": BUILD_CODE_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


DEFAULT_RECIPE = TinyRecipe()


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
    train_seconds: float
    torch_threads: int
    parameters: int


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


def tiny_dir(recipe: TinyRecipe = DEFAULT_RECIPE) -> Path:
    """Where ``builtin:tiny`` built with ``recipe`` lives (it may not exist yet)."""
    return cache_root() / "models" / f"tiny-{recipe.fingerprint()}"


def model_config(recipe: TinyRecipe, tokenizer: PreTrainedTokenizerBase) -> Qwen2Config:
    """The Qwen2 config of the recipe, with the tokenizer's vocabulary and special ids."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _build_bar(total: int) -> Any:
    """A terminal progress bar over every SFT step (off when stderr is not a terminal)."""
    return tqdm(total=total, desc="building builtin:tiny", unit="step", disable=None, leave=False)


def _tick(bar: Any, loss: float) -> None:
    bar.update(1)
    bar.set_postfix(loss=f"{loss:.3f}", refresh=False)


def _build_threads() -> int:
    """All cores this process may use: the build is CPU-bound and runs once."""
    return max(1, len(os.sched_getaffinity(0)))


def build_tiny(dest: Path, recipe: TinyRecipe = DEFAULT_RECIPE, log_every: int = 0) -> BuildReport:
    """Build, measure and save ``builtin:tiny`` into ``dest`` (a new or empty directory)."""
    start = time.perf_counter()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(_build_threads())
    # fork_rng: seeding here must not reset the random stream of the process that asked.
    with torch.random.fork_rng(devices=[]):
        try:
            torch.manual_seed(recipe.seed)
            tokenizer = build_char_tokenizer()
            model = Qwen2ForCausalLM(model_config(recipe, tokenizer))
            train = generate(recipe.train_items, recipe.seed, "train", recipe.train_task)
            train = with_prose_endings(train, recipe.prose_answer_fraction, recipe.seed)
            mixed = with_shortcuts(train, recipe.shortcut_fraction, recipe.seed)
            fit_start = time.perf_counter()
            first = train if recipe.style_sft else mixed
            phases = [(first, recipe.sft)] + (
                [(mixed, recipe.style_sft)] if recipe.style_sft else []
            )
            with _build_bar(sum(cfg.steps for _, cfg in phases)) as bar:
                losses = []
                for i, (items, cfg) in enumerate(phases):
                    tick = lambda _, ema: _tick(bar, ema)  # noqa: E731
                    losses.append(
                        fit(model, tokenizer, items, cfg, recipe.seed + i, log_every, tick)
                    )
            train_seconds = time.perf_counter() - fit_start
            held_out = generate(recipe.eval_items, recipe.seed, "eval", recipe.task)
            result = greedy_accuracy(model, tokenizer, held_out)
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
        train_seconds=train_seconds,
        torch_threads=threads,
        parameters=sum(p.numel() for p in model.parameters()),
    )
    (dest / BUILD_INFO_FILE).write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
    return report


def ensure_tiny(recipe: TinyRecipe = DEFAULT_RECIPE, log_every: int = 100) -> Path:
    """Return the cached ``builtin:tiny`` directory, building it first if it is missing
    (:func:`~longtail_workers.models.cache.build_once`: concurrent callers build it once)."""
    final = tiny_dir(recipe)
    reports: list[BuildReport] = []

    def build(tmp: Path) -> None:
        log.info("building builtin:tiny into %s (one-off: a few minutes on CPU)", final)
        reports.append(build_tiny(tmp, recipe, log_every=log_every))

    if build_once(final, BUILD_INFO_FILE, build):
        report = reports[0]
        log.info(
            "built builtin:tiny in %.0f s, eval accuracy %.3f",
            report.build_seconds,
            report.eval_accuracy,
        )
    return final


def read_build_info(model_dir: Path) -> dict[str, Any]:
    """The ``longtail_build.json`` of a built model directory."""
    path = Path(model_dir) / BUILD_INFO_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: {model_dir} is not a model built by Longtail "
            f"(build builtin:tiny with load_policy('builtin:tiny'))"
        )
    return dict(json.loads(path.read_text()))
