"""Recipes of the built-in policies ``builtin:tiny`` and ``builtin:small``: what determines their
weights, the hash that names their cache directory, their size and the time a build should take.

One recipe class, one build (:func:`longtail_workers.models.builtin.build_policy`), one cache:

- :data:`TINY` (``builtin:tiny``, 2.7M parameters): fitted on the CPU on ``builtin:arith``; the
  policy of the CPU examples (01, 03-05).
- :data:`SMALL` (``builtin:small``, 535M parameters): a Qwen2 large enough that a GPU decode step
  at small batch reads ~1 GB of weights (memory-bound), fitted on ``builtin:arith-long``
  (answers up to 2,036 tokens) on the GPU itself, in bf16 autocast over fp32 weights; on a
  machine without a GPU it builds on the CPU in float32, which takes hours at this size. Its
  budget: about 150 s of H100 time for the whole build (:func:`build_estimate`; the GPU suite
  measures it), because a GPU session gets one command of minutes and no cache survives it.

Both keep the same two-phase design (worked solutions, then the short-cut mixture: see
:mod:`longtail_workers.models.builtin`), which gives GRPO a style decision to learn.

Called by :mod:`~longtail_workers.models.builtin` (the build), :mod:`~.loading` (the
``builtin:<name>`` registry), ``warmstart/recipe.py`` (drafter cache names), the local
launcher (is a built-in model built already?), tests and benches.

Imports neither torch nor transformers at module level: ``longtail run`` asks
:func:`policy_dir` whether a built-in model is built before it starts any process, and that
answer must not cost the seconds of those imports (the functions that build configs and devices
import them when called).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from longtail_workers.models.cache import cache_root
from longtail_workers.tasks import arith_long
from longtail_workers.tasks.arith import ArithConfig, make_item

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase, Qwen2Config

# Bump when the build code changes in a way that changes the weights for the same recipe.
BUILD_CODE_VERSION = 1
BUILD_INFO_FILE = "longtail_build.json"
"""Written last into a built model's directory: its presence means the build is complete."""
DEVICES = ("cpu", "auto")
# Knobs added after builtin:tiny first shipped, each with the value that builds as before: a
# recipe at that value leaves the knob out of its hash, so caches built before stay valid.
_LATER_KNOBS: dict[str, object] = {
    "prose_answer_fraction": 0.0,
    "shortcut_fraction": 0.0,
    "style_sft": None,
    "name": "tiny",
    "device": "cpu",
}
_LATER_TASK_KNOBS: dict[str, object] = {"label_letters": 1}  # in train_task and task
H100_BF16_FLOPS = 989e12  # dense bf16 peak of an H100 SXM, FLOP/s
ASSUMED_MFU = 0.35  # share of that peak the SFT loop is assumed to reach (to be measured)


@dataclass(frozen=True)
class SftConfig:
    """Optimizer, schedule and batching of a supervised fit (:mod:`~.sft` runs it)."""

    steps: int = 700
    # 1e-3 is the largest rate at which the copy circuits the task needs form reliably with
    # ~1k-token batches; 3e-3 was measured to stay noisy and learn far less in 800 steps.
    lr: float = 1e-3
    warmup_steps: int = 50
    decay_fraction: float = 0.5  # the last half of the steps decays linearly...
    min_lr_ratio: float = 0.1  # ...to lr * min_lr_ratio
    weight_decay: float = 0.01
    tokens_per_batch: int = 1024  # padded tokens per step (batch size shrinks for long items)
    clip_norm: float = 1.0


@dataclass(frozen=True)
class PolicyRecipe:
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
    # builtin:<name> this recipe builds; the prefix of its cache directory.
    name: str = "tiny"
    # Where it is fitted: "cpu" always (builtin:tiny: its recorded figures are CPU figures), or
    # "auto": CUDA with bf16 autocast when a GPU is visible, else the CPU in float32.
    device: str = "cpu"

    def fingerprint(self) -> str:
        """Short stable hash of the recipe and the build code version."""
        recipe = dataclasses.asdict(self)
        for knob, before in _LATER_KNOBS.items():
            if recipe[knob] == before:
                del recipe[knob]
        for task in ("train_task", "task"):
            for knob, before in _LATER_TASK_KNOBS.items():
                if recipe[task][knob] == before:
                    del recipe[task][knob]
        blob = json.dumps({"recipe": recipe, "code": BUILD_CODE_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


TinyRecipe = PolicyRecipe  # its first name, still imported by tests and bench/
TINY = DEFAULT_RECIPE = PolicyRecipe()
SMALL = PolicyRecipe(
    name="small",
    # 535M parameters (see parameter_count): Qwen2.5-1.5B's width, heads and KV heads, 20
    # layers, MLP 3x. Head dim 128, as the engine's Triton attention wants (a power of two).
    num_layers=20,
    hidden_size=1536,
    num_heads=12,
    num_kv_heads=2,
    intermediate_size=4608,
    max_position_embeddings=4096,  # prompt (<= 485) + answer budget (2048) with room to spare
    # 660 steps of 16k padded tokens: 10.8M tokens, about one epoch of the 20k items (~480
    # tokens each on average); ~115 s on an H100 at 35% MFU (build_estimate). 3e-4: a
    # from-scratch rate for a model of this size.
    sft=SftConfig(steps=600, lr=3e-4, warmup_steps=50, tokens_per_batch=16384),
    style_sft=SftConfig(steps=60, lr=1e-4, warmup_steps=5, tokens_per_batch=16384),
    train_items=20000,
    train_task=arith_long.CONFIG,
    # Measured on eval items of up to 24 operands (<= 404 answer tokens): the build's plain
    # greedy eval (HF generate, tens of ms a token) stays near ten seconds; RL evals the rest.
    task=dataclasses.replace(arith_long.CONFIG, max_operands=24),
    eval_items=64,
    device="auto",
)
RECIPES: dict[str, PolicyRecipe] = {"tiny": TINY, "small": SMALL}
"""``builtin:<name>`` -> its shipped recipe."""


def policy_dir(recipe: PolicyRecipe = DEFAULT_RECIPE) -> Path:
    """Where ``builtin:<recipe.name>`` built with ``recipe`` lives (it may not exist yet; it is
    complete once it holds :data:`BUILD_INFO_FILE`)."""
    return cache_root() / "models" / f"{recipe.name}-{recipe.fingerprint()}"


def placement(device: str, knob: str) -> torch.device:
    """A built-in artefact's ``device`` knob (``cpu``, or ``auto``: CUDA when a GPU is visible)
    as the device to build on; ValueError naming ``knob`` for any other value."""
    if device not in DEVICES:
        raise ValueError(
            f"{knob}: {device!r} is not one of {', '.join(DEVICES)} (cpu: always on the CPU; "
            f"auto: CUDA when a GPU is visible)"
        )
    import torch

    if device == "auto" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def build_device(recipe: PolicyRecipe) -> torch.device:
    """Where ``recipe`` is fitted: see :attr:`PolicyRecipe.device`."""
    return placement(recipe.device, "PolicyRecipe.device")


def model_config(recipe: PolicyRecipe, tokenizer: PreTrainedTokenizerBase) -> Qwen2Config:
    """The Qwen2 config of the recipe, with the tokenizer's vocabulary and special ids."""
    from transformers import Qwen2Config

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


def parameter_count(recipe: PolicyRecipe) -> int:
    """Parameters of the recipe's model, counted on the meta device (nothing is allocated)."""
    import torch
    from transformers import Qwen2ForCausalLM

    from longtail_workers.models.tokenizer import build_char_tokenizer

    with torch.device("meta"):
        model = Qwen2ForCausalLM(model_config(recipe, build_char_tokenizer()))
    return sum(p.numel() for p in model.parameters())


def longest_sequence(task: ArithConfig) -> int:
    """Tokens of the task's longest ``prompt + solution + EOS`` (char tokenizer: one a char)."""
    item = make_item([task.max_operand] * task.max_operands, task)
    return len(item.prompt) + len(item.solution) + 1


@dataclass(frozen=True)
class BuildEstimate:
    """What a build's SFT should cost, from FLOPs (the GPU suite checks it against a build)."""

    parameters: int
    train_tokens: int  # padded tokens over every SFT step: steps x tokens_per_batch (at most)
    flops_per_token: float  # 6 N plus attention (see build_estimate)
    train_flops: float
    train_seconds: float  # at ``mfu`` of ``peak_flops``
    mfu: float
    peak_flops: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def build_estimate(
    recipe: PolicyRecipe, mfu: float = ASSUMED_MFU, peak_flops: float = H100_BF16_FLOPS
) -> BuildEstimate:
    """SFT time of ``recipe`` on a GPU reaching ``mfu`` of ``peak_flops``.

    Per token: 6 N (forward 2 N, backward 4 N) plus attention's scores and weighted values,
    12 x layers x hidden x context, with the context bounded by half the longest sequence (a
    causal token attends to its own position). Tokens: every step's padded budget. Data
    preparation, the greedy eval and saving come on top (about 20 s for ``builtin:small``).
    """
    params = parameter_count(recipe)
    phases = [recipe.sft] + ([recipe.style_sft] if recipe.style_sft else [])
    tokens = sum(c.steps * c.tokens_per_batch for c in phases)
    context = longest_sequence(recipe.train_task) / 2
    per_token = 6.0 * params + 12.0 * recipe.num_layers * recipe.hidden_size * context
    flops = per_token * tokens
    return BuildEstimate(
        parameters=params,
        train_tokens=tokens,
        flops_per_token=per_token,
        train_flops=flops,
        train_seconds=flops / (mfu * peak_flops),
        mfu=mfu,
        peak_flops=peak_flops,
    )
