"""The RLJob spec: what a user writes under ``spec:`` in ``rljob.yaml``.

Typed dataclasses, one per block, each field with its default, bounds (:func:`spec_field`) and
an attribute docstring. This module is the single source of truth of the RLJob API:
``validation.py`` parses user dicts into these classes, ``schema.py`` generates
``crds/rljob.yaml`` from them, and both the operator and local mode (``longtail run``) consume
the parsed :class:`RLJobSpec`. Policy blocks (speculative decoding, drafter training, harvest,
checkpointing) live in ``policies.py``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from longtail_api.fields import spec_field
from longtail_api.policies import (
    CheckpointSpec,
    DrafterTrainingSpec,
    HarvestSpec,
    SpeculativeSpec,
    WeightSyncSpec,
    resolved_transport,
)
from longtail_api.scheduling import SchedulingSpec
from longtail_api.tracking import TrackingSpec

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY_HINT = "a Kubernetes quantity such as 2, 500m, 4Gi"
_SUFFIXES = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_SUFFIXES |= {"P": 1e15, "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_SUFFIXES |= {"Pi": 2**50, "Ei": 2**60}


def cpu_quantity(value: int | str) -> float:
    """A Kubernetes quantity as a number (``"500m"`` -> 0.5, ``"2"`` -> 2.0, ``"1e3"`` -> 1000)."""
    text = str(value).strip()
    if not re.match(QUANTITY_PATTERN, text):
        raise ValueError(f"{value!r} is not {_QUANTITY_HINT}")
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * _SUFFIXES[suffix]
    return float(text)  # plain or e-notation


_SOURCE_HINT = "a path, or builtin:<name>"
REWARD_NAME_PATTERN = r"^[a-z][a-z0-9_.:-]*$"
"""A reward's registered name (``rewards/registry.py`` checks the same pattern)."""
REWARD_NAME_HINT = "a lowercase reward name such as math"

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
Engine = Literal["torch", "vllm"]


@dataclass
class ModelSpec:
    """The policy model that is trained and used for rollout."""

    path: str = spec_field(
        min_length=1, fix="use a local Hugging Face model directory or builtin:tiny"
    )
    """Local Hugging Face model directory (config.json, weights, tokenizer) mounted into the
    pods, or ``builtin:<name>`` for a model that Longtail builds itself (``builtin:tiny``, 2.7M
    parameters, fitted on the CPU; ``builtin:small``, 535M parameters for ``builtin:arith-long``,
    fitted on the GPU when there is one)."""
    dtype: Dtype = spec_field("auto")
    """Parameter dtype: ``auto`` picks bfloat16 on GPUs and float32 on CPUs."""


@dataclass
class DatasetSpec:
    """Prompts with checkable answers, and the reward that checks them."""

    path: str = spec_field(
        min_length=1,
        pattern_hint=_SOURCE_HINT,
        fix="use a .jsonl or .parquet file, or builtin:arith",
    )
    """Training prompts: a ``.jsonl`` or ``.parquet`` file, or ``builtin:<name>`` for a built-in
    task (``builtin:arith``: long-tailed step-by-step arithmetic; ``builtin:arith-long``: the
    same with up to 120 operands, answers up to 2,036 tokens)."""
    prompt_key: str = spec_field("prompt", min_length=1)
    """Column holding the prompt text."""
    answer_key: str = spec_field("answer", min_length=1)
    """Column holding the gold answer the reward compares against."""
    eval_path: str | None = spec_field(None)
    """Held-out evaluation prompts in the same format; built-in tasks use their own held-out
    split when this is empty."""
    eval_size: int = spec_field(200, minimum=0, maximum=100000)
    """How many evaluation prompts to score (greedy) at each evaluation; 0 disables eval."""
    reward: str = spec_field("math", pattern=REWARD_NAME_PATTERN, pattern_hint=REWARD_NAME_HINT)
    """Name of the reward function the verifier applies (``math``: final answer from
    ``\\boxed{...}`` or an ``Answer:`` line, judged equal to the gold answer by math-verify)."""
    reward_by_source: dict[str, str] = spec_field(default_factory=dict)
    """Reward per value of the rows' ``data_source`` column (veRL-format files), e.g.
    ``{openai/gsm8k: math}``; rows with another or no source get ``reward``. Each source must
    occur in the training file."""
    format_weight: float = spec_field(0.0, minimum=0.0, maximum=1.0)
    """Weight of the optional format component added to the 0/1 correctness reward."""
    apply_chat_template: bool = spec_field(True)
    """Wrap prompts with the tokenizer's chat template when it defines one."""


@dataclass
class AlgorithmSpec:
    """The RL algorithm and its sampling settings."""

    name: Literal["grpo"] = spec_field("grpo")
    """RL algorithm; GRPO (group-relative policy optimisation) is the one implemented."""
    group_size: int = spec_field(
        8, minimum=2, maximum=1024, fix="GRPO compares answers within a group: use 2 or more"
    )
    """Answers sampled per prompt; advantages are normalised within each group."""
    prompts_per_step: int = spec_field(16, minimum=1, maximum=65536)
    """Prompts per RL step (a step rolls out prompts_per_step x group_size answers)."""
    total_steps: int = spec_field(100, minimum=1, maximum=10_000_000)
    """RL steps to run before the job succeeds."""
    learning_rate: float = spec_field(1e-6, minimum=0.0, exclusive_minimum=True, maximum=1.0)
    """AdamW learning rate of the policy."""
    kl_coef: float = spec_field(0.0, minimum=0.0, maximum=10.0)
    """Weight of the KL penalty to the initial (reference) policy; 0 disables it."""
    clip_ratio: float = spec_field(
        0.2, minimum=0.0, exclusive_minimum=True, maximum=1.0, exclusive_maximum=True
    )
    """PPO-style clip range of the policy ratio."""
    max_new_tokens: int = spec_field(1024, minimum=1, maximum=262144)
    """Longest response, in tokens; the long tail runs up to this limit."""
    temperature: float = spec_field(1.0, minimum=0.0, maximum=10.0)
    """Sampling temperature during rollout (0 means greedy)."""
    top_p: float = spec_field(1.0, minimum=0.0, exclusive_minimum=True, maximum=1.0)
    """Nucleus sampling mass during rollout."""
    seed: int = spec_field(0, minimum=0, maximum=2**31 - 1)
    """Seed of prompt shuffling, sampling and initialisation; same seed, same run."""
    eval_every_steps: int = spec_field(10, minimum=0, maximum=10_000_000)
    """Evaluate every N steps (and after the last); 0 evaluates only at the start and end."""
    eval_samples: int = spec_field(4, minimum=0, maximum=1024)
    """Answers sampled per eval prompt at the rollout temperature and top-p, with fixed seeds;
    the share of them that are correct is the sampled eval accuracy (what GRPO maximises, on
    held-out prompts), reported next to the greedy accuracy. 0 evaluates greedily only."""


@dataclass
class ResourcesSpec:
    """Per-replica compute resources; they become the pod's requests and limits."""

    gpus: int = spec_field(0, minimum=0, maximum=64)
    """GPUs per replica (``nvidia.com/gpu``)."""
    cpu: int | str = spec_field("1", pattern=QUANTITY_PATTERN, pattern_hint=_QUANTITY_HINT)
    """CPU per replica. Rollout and trainer workers also size their torch CPU thread pool from
    it (whole CPUs rounded down, at least one, at most the CPUs the process may use; the
    worker's --threads overrides), as Ray sizes OMP_NUM_THREADS from a task's CPUs."""
    memory: int | str = spec_field("4Gi", pattern=QUANTITY_PATTERN, pattern_hint=_QUANTITY_HINT)
    """Memory per replica."""

    def cpu_threads(self) -> int:
        """Whole CPUs of :attr:`cpu` (rounded down, at least 1): a worker's torch threads.

        Rounded down because a CFS quota of 1.5 CPUs throttles two busy threads.
        """
        return max(1, math.floor(cpu_quantity(self.cpu)))


@dataclass
class RoleSpec:
    """Fields every worker role has."""

    replicas: int = spec_field(1, minimum=1, maximum=4096)
    """Number of worker pods of this role."""
    resources: ResourcesSpec = spec_field(default_factory=ResourcesSpec)
    """Compute resources of each replica."""
    image: str | None = spec_field(None)
    """Worker image; empty uses the operator's default worker image (Helm value
    ``workerImage``)."""
    template: dict[str, Any] = spec_field(default_factory=dict, free_form=True)
    """Pod template override (``metadata`` and ``spec`` of a PodTemplateSpec), merged into the
    generated pod: add tolerations, node selectors, volumes, env, sidecars."""


@dataclass
class RolloutSpec(RoleSpec):
    """Rollout workers: generate answers with the adaptive speculative-decoding engine and
    train the drafter on their idle GPUs."""

    replicas: int = spec_field(2, minimum=1, maximum=4096)
    """Number of rollout worker pods the job wants (its most)."""
    min_replicas: int | None = spec_field(None, minimum=1, maximum=4096)
    """Fewest rollout workers the job runs with (elastic rollout, docs/scheduling.md). Empty:
    ``replicas`` (a fixed set, as before). Between this and ``replicas`` the job starts with
    the rollout workers it can get (with Kueue: partial admission down to this many), a rollout
    worker evicted, preempted or deleted shrinks the job instead of failing it (not charged to
    ``backoffLimit``; a worker that crashes by itself still is), and workers that come back
    join at the next step. ``longtail run`` has no capacity to wait for: it goes on while at
    least this many rollout workers live (empty: one), see docs/local-mode.md."""
    below_min_grace_seconds: float = spec_field(300.0, minimum=0.0, maximum=86_400.0)
    """How long the job runs on with fewer than ``minReplicas`` rollout workers before it
    checkpoints and waits for capacity (with Kueue: gives its quota back, as an evicted job
    does); ``longtail run`` stops with a checkpoint instead."""

    engine: Engine = spec_field("torch")
    """Generation backend: ``torch`` (native engine, CPU or GPU) or ``vllm`` (vLLM 0.32 with
    Longtail's online drafter hot-swapped into it; CPU or GPU; docs/vllm.md)."""
    unresponsive_seconds: float = spec_field(6.0, minimum=1.0, maximum=3600.0)
    """How long a worker holding part of a rollout may leave the trainer's health probes (its
    ``/healthz``, a third of this each, three in a row) unanswered before the trainer declares
    it down and hands its requests to the other workers, as it does at once for a worker that
    died. A hung worker (a stopped process, a frozen node) rejoins at a later step once it
    answers again. Its HTTP server answers while the engine generates; raise this only for
    networks with pauses this long."""

    def fewest(self) -> int:
        """``min_replicas``, or ``replicas`` when it is empty."""
        return self.replicas if self.min_replicas is None else self.min_replicas


@dataclass
class VerifierSpec(RoleSpec):
    """Verifier workers: score answers against gold answers (the reward)."""


@dataclass
class TrainerSpec(RoleSpec):
    """The trainer: drives RL steps, computes GRPO updates and publishes policy weights."""

    replicas: int = spec_field(1, minimum=1, maximum=64)
    """Number of trainer pods. The trainer world is ``replicas`` x devices per pod (``gpus``,
    or one process per pod on CPU); every rank runs the GRPO update on its slice of the batch
    with the model, gradients and optimizer state sharded over the world (FSDP2)."""
    activation_checkpointing: bool = spec_field(False)
    """Recompute each decoder layer's activations in the backward pass instead of keeping them:
    less memory for long answers, one more forward pass per layer in the update."""
    micro_batch_tokens: int = spec_field(0, minimum=0, maximum=16_777_216)
    """Most padded tokens per forward pass of the policy update. Any value gives the same
    gradient; it trades memory for speed. 0 picks 1024 on CPU, where small passes keep their
    activations in cache, and 16384 on a GPU. Lower it if the update runs out of memory; a
    sequence longer than the budget still gets a pass of its own."""


@dataclass
class DrafterRoleSpec(RoleSpec):
    """Optional dedicated drafter trainers, in addition to harvested idle rollout GPUs."""


@dataclass
class RLJobSpec:
    """Desired state of an RL training job with adaptive speculative rollout."""

    model: ModelSpec
    """The policy model."""
    dataset: DatasetSpec
    """Prompts, gold answers and reward."""
    algorithm: AlgorithmSpec = spec_field(default_factory=AlgorithmSpec)
    """RL algorithm and sampling settings."""
    rollout: RolloutSpec = spec_field(default_factory=RolloutSpec)
    """Rollout worker role."""
    verifier: VerifierSpec = spec_field(default_factory=VerifierSpec)
    """Verifier (reward) role."""
    trainer: TrainerSpec = spec_field(default_factory=TrainerSpec)
    """Trainer role."""
    drafter: DrafterRoleSpec | None = spec_field(None)
    """Optional dedicated drafter-training role; absent means drafters are trained only on
    harvested idle GPUs."""
    speculative: SpeculativeSpec = spec_field(default_factory=SpeculativeSpec)
    """Adaptive speculative decoding in rollout."""
    drafter_training: DrafterTrainingSpec = spec_field(default_factory=DrafterTrainingSpec)
    """Online (spot) training of the drafter."""
    harvest: HarvestSpec = spec_field(default_factory=HarvestSpec)
    """Turning idle GPUs into drafter training."""
    checkpoint: CheckpointSpec = spec_field(default_factory=CheckpointSpec)
    """Checkpointing and resume."""
    weight_sync: WeightSyncSpec = spec_field(default_factory=WeightSyncSpec)
    """How policy versions reach the rollout workers (HTTP pieces or a bucketed broadcast)."""
    scheduling: SchedulingSpec = spec_field(default_factory=SchedulingSpec)
    """How the pods are placed: gang placement (Volcano, coscheduling, KAI, core Kubernetes),
    topology domains and the pods' priority class."""
    tracking: TrackingSpec = spec_field(default_factory=TrackingSpec)
    """Experiment trackers (TensorBoard, MLflow, Weights & Biases) the trainer logs to."""
    suspend: bool = spec_field(False)
    """When true, the trainer checkpoints and the worker pods are deleted; setting it back to
    false resumes from the last checkpoint."""
    active_deadline_seconds: int | None = spec_field(None, minimum=1)
    """Fail the job (reason DeadlineExceeded) once it has run this long."""
    backoff_limit: int = spec_field(3, minimum=0, maximum=1000)
    """How many times failed worker pods of one role are recreated before the job fails."""
    ttl_seconds_after_finished: int | None = spec_field(None, minimum=0)
    """Delete the finished job's pods and services this long after it succeeds or fails."""

    def weight_sync_transport(self) -> str:
        """``http`` or ``broadcast``: ``weightSync.transport`` with ``auto`` resolved."""
        return resolved_transport(
            self.weight_sync, self.trainer.resources.gpus, self.rollout.resources.gpus
        )
