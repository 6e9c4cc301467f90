"""Policy blocks of the RLJob spec: speculative decoding, drafter training, harvest, checkpoints.

Split from ``spec.py`` to keep files small; same conventions (``spec_field`` bounds plus an
attribute docstring per field). The rollout engine reads :class:`SpeculativeSpec`, the spot
drafter trainer :class:`DrafterTrainingSpec`, the harvest decision function (operator and local
coordinator alike) :class:`HarvestSpec`, and the trainer :class:`CheckpointSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from longtail_api.fields import spec_field

DEFAULT_DCGM_QUERY = (
    "avg by (pod) (avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    '{namespace="$namespace"}[$window]) * 100)'
)
"""Per-pod GPU busy percentage from dcgm-exporter, the preferred (fine-grained) signal."""

HarvestRole = Literal["rollout", "trainer", "verifier"]
DrafterLayout = Literal["longtail", "eagle1"]
DrafterKind = Literal["learned", "history", "hybrid"]
"""What proposes a strategy's drafts: the EAGLE drafter trained online (``learned``), the longest
match of the answer's recent tokens in the rollout history (``history``: no forward pass), or
per row the history where its match is long enough and the learned drafter otherwise
(``hybrid``)."""
DRAFT_SOURCES = ("learned", "history")
"""What one row's drafts in one step came from (a ``hybrid`` step drafts each row from one of
these): the keys of the per-drafter statistics in metrics, step rows and status."""


@dataclass
class StrategySpec:
    """One speculative-decoding strategy the selector can pick."""

    draft_depth: int = spec_field(4, minimum=1, maximum=32)
    """Tokens the drafter proposes per step (chain depth)."""
    verify_tokens: int | None = spec_field(None, minimum=1, maximum=256)
    """Tokens the target scores per step; empty means equal to draft_depth (chain drafting).
    Larger values are for tree drafting."""
    drafter: DrafterKind = spec_field("learned")
    """What proposes the drafts: ``learned`` (the online-trained EAGLE drafter), ``history``
    (the longest match of the answer's last tokens in this prompt, its group's answers and its
    earlier answers: no forward pass, speculates from the first step with no drafter version),
    or ``hybrid`` (history where its match is at least ``speculative.history.hybridMinMatch``
    tokens, learned otherwise). ``history`` and ``hybrid`` need ``rollout.engine: torch``."""


def _default_strategies() -> list[StrategySpec]:
    # The programmatic default (a SpeculativeSpec built in code): learned chains, valid on
    # either engine. An RLJob that lists no strategies gets default_strategies() for its engine
    # instead (defaulting.py), as Kubernetes defaults a field from its neighbours.
    return default_strategies("vllm")


def default_strategies(engine: str, learned: bool = True) -> list[StrategySpec]:
    """The strategy set of an RLJob that lists none, for its ``rollout.engine``; ``learned``:
    the job has a drafter (online training or an initial drafter).

    TLT's measured preference: deeper drafts at small batch, shallower ones as batch grows; the
    bandit picks per batch-size bucket among these by accepted tokens per second. vLLM runs the
    learned drafter only. The torch engine adds the history drafter (no forward pass, so a
    lookup one depth deeper costs nothing extra) and a hybrid; without a drafter it speculates
    with history alone (issue #49, docs/performance.md)."""
    chains = [StrategySpec(draft_depth=d) for d in (2, 4, 6)]
    if engine != "torch":
        return chains
    history = [StrategySpec(draft_depth=d, drafter="history") for d in (4, 8)]
    if not learned:
        return history
    return [*chains, *history, StrategySpec(draft_depth=4, drafter="hybrid")]


@dataclass
class SelectorSpec:
    """How a strategy is chosen for each running-batch-size bucket."""

    type: Literal["bandit", "fixed"] = spec_field("bandit")
    """``bandit``: epsilon-greedy over strategies, reward = accepted tokens per second;
    ``fixed``: always ``strategies[fixedIndex]``."""
    epsilon: float = spec_field(0.1, minimum=0.0, maximum=1.0)
    """Exploration probability of the bandit."""
    window: int = spec_field(50, minimum=1, maximum=100000)
    """Sliding window of recent rewards per (bucket, strategy) the bandit averages."""
    fixed_index: int = spec_field(0, minimum=0)
    """Index into ``strategies`` used by the ``fixed`` selector."""
    buckets: list[int] = spec_field(
        default_factory=lambda: [1, 2, 4, 8, 16, 32], min_items=1, max_items=32
    )
    """Upper bounds of running-batch-size buckets, strictly increasing; each bucket learns its
    own strategy."""


@dataclass
class HistorySpec:
    """The history drafter's index: what it looks up and how much it keeps per rollout worker."""

    max_tokens_per_prompt: int = spec_field(32768, minimum=64, maximum=16_777_216)
    """Most answer tokens kept per prompt (its answers in this and earlier steps), oldest
    answers dropped first."""
    max_tokens_total: int = spec_field(1_048_576, minimum=1024, maximum=1_073_741_824)
    """Most tokens the index keeps over all prompts on one worker, least recently used
    prompts dropped first (40-120 bytes a token, more the less the answers repeat each
    other: the default keeps up to ~125 MB)."""
    min_match: int = spec_field(2, minimum=1, maximum=64)
    """Shortest suffix of the answer that must match to propose anything."""
    max_match: int = spec_field(16, minimum=1, maximum=256)
    """Longest suffix looked up: the longest match of at most this many tokens wins."""
    hybrid_min_match: int = spec_field(4, minimum=1, maximum=256)
    """In a ``hybrid`` strategy, a row drafts from history when its match is at least this
    many tokens, from the learned drafter otherwise."""
    whole_step: bool = spec_field(False)
    """Also look up every answer of the step (every prompt), not only this prompt's."""
    clear_on_new_policy: bool = spec_field(False)
    """Forget earlier steps' answers when a new policy version arrives (kept by default:
    answers of one prompt stay similar across versions)."""


@dataclass
class SpeculativeSpec:
    """Adaptive speculative decoding during rollout."""

    enabled: bool = spec_field(True)
    """Use speculative decoding in the rollout tail."""
    batch_threshold: int = spec_field(32, minimum=1, maximum=65536)
    """SD switches on once the running sequences on a worker are at most this many."""
    warmup_steps: int = spec_field(3, minimum=0, maximum=10000)
    """Consecutive decode steps at or below the threshold before SD switches on."""
    strategies: list[StrategySpec] = spec_field(
        default_factory=_default_strategies,
        min_items=1,
        max_items=16,
        default_doc="by engine: torch `learned` 2/4/6, `history` 4/8, `hybrid` 4 "
        "(`history` 4/8 alone without a drafter); vllm `learned` 2/4/6",
    )
    """Candidate strategies (draft depth / tokens to verify / drafter). Left out, the job gets
    its engine's set: with ``rollout.engine: torch`` the learned drafter at depths 2, 4 and 6,
    history at 4 and 8 and hybrid at 4 (history alone when the job has no drafter: no
    drafterTraining and no initialDrafter); with ``vllm`` the learned drafter at 2, 4 and 6
    (``rollout.engine: vllm`` takes ``learned`` only)."""
    selector: SelectorSpec = spec_field(default_factory=SelectorSpec)
    """How a strategy is picked per batch-size bucket."""
    history: HistorySpec = spec_field(default_factory=HistorySpec)
    """The history drafter's index (strategies with ``drafter: history`` or ``hybrid``)."""
    drafter_context_window: int | None = spec_field(None, minimum=1, maximum=1_048_576)
    """Sliding window of the drafter's own attention, in tokens of the answer; empty: the whole
    answer so far (the drafter reads the answer, never the prompt, as it is trained).
    Each draft step attends to at most this many of the answer's newest tokens, and when SD
    switches on the drafter re-reads at most this many per sequence, so switching on and each
    draft step cost O(window) instead of O(context): a bound for very long answers. Shorter
    windows can lower the accepted length (docs/performance.md). The torch engine only (vLLM
    drafts over the whole context, docs/vllm.md)."""


@dataclass
class LossWeightsSpec:
    """Weights of the drafter's training loss terms (TLT: 1.0 and 0.1)."""

    smooth_l1: float = spec_field(1.0, minimum=0.0, maximum=100.0)
    """Weight of SmoothL1 between predicted and target next hidden state."""
    cross_entropy: float = spec_field(0.1, minimum=0.0, maximum=100.0)
    """Weight of soft cross-entropy against the target's next-token distribution."""


@dataclass
class DrafterTrainingSpec:
    """Online (spot) training of the drafter on GPUs idle during the rollout tail."""

    enabled: bool = spec_field(True)
    """Train the drafter online from the current rollouts."""
    learning_rate: float = spec_field(3e-4, minimum=0.0, exclusive_minimum=True, maximum=1.0)
    """AdamW learning rate of the drafter."""
    window_tokens: int = spec_field(512, minimum=16, maximum=32768)
    """Response tokens per training window; several windows are packed into one sequence."""
    max_steps_per_window: int = spec_field(200, minimum=1, maximum=1_000_000)
    """Most optimizer steps in one idle window (training also stops when rollout ends)."""
    buffer_tokens: int = spec_field(262144, minimum=1024)
    """Most captured tokens (with their hidden states) kept per worker for training."""
    loss_weights: LossWeightsSpec = spec_field(default_factory=LossWeightsSpec)
    """Weights of the loss terms."""
    initial_drafter: str | None = spec_field(None)
    """Drafter to start from: a directory written by ``longtail drafter fit``, or
    ``builtin:tiny`` / ``builtin:small`` (with the same ``model.path``: fitted by Longtail on
    first use, then cached); empty starts from a fresh drafter. Online windows
    that draft worse than the version they started from (held-out top-1) are dropped, so a
    fitted drafter is never replaced by a worse one."""
    layout: DrafterLayout = spec_field("longtail")
    """Drafter layout. ``longtail`` keeps the decoder layer's input norm and a bias on the
    2H->H projection (drafts better in our measurements, docs/performance.md); ``eagle1`` is the
    EAGLE-1 serving layout (neither), which ``longtail drafter export`` writes exactly for vLLM
    and SGLang (a ``longtail`` drafter exports only approximately)."""


@dataclass
class PrometheusSourceSpec:
    """Where to read GPU idleness when ``harvest.source`` is ``prometheus``."""

    url: str | None = spec_field(None, pattern=r"^https?://", pattern_hint="an http(s) URL")
    """Prometheus base URL, e.g. ``http://prometheus-operated.monitoring:9090``."""
    query: str = spec_field(DEFAULT_DCGM_QUERY, min_length=1)
    """PromQL returning busy percentage per ``pod``; ``$namespace`` and ``$window`` are
    substituted."""


@dataclass
class HarvestSpec:
    """Reassigning idle GPUs to drafter training while the rollout tail runs."""

    enabled: bool = spec_field(True)
    """Harvest idle GPUs for drafter training."""
    source: Literal["workers", "prometheus"] = spec_field("workers")
    """Idleness signal: the workers' own reports, or Prometheus (DCGM exporter metrics)."""
    prometheus: PrometheusSourceSpec = spec_field(default_factory=PrometheusSourceSpec)
    """Prometheus settings, used when source is ``prometheus``."""
    idle_utilization_threshold: float = spec_field(10.0, minimum=0.0, maximum=100.0)
    """A GPU at or below this busy percentage counts as idle."""
    idle_seconds: float = spec_field(2.0, minimum=0.0, maximum=3600.0)
    """How long a worker must stay idle before it is harvested. With DCGM (30 s sampling by
    default) use a value of at least the exporter's interval."""
    poll_period_seconds: float = spec_field(1.0, minimum=0.1, maximum=600.0)
    """How often idleness is polled."""
    eligible_roles: list[HarvestRole] = spec_field(
        default_factory=lambda: ["rollout"], min_items=1, max_items=3
    )
    """Roles whose idle GPUs may be harvested (``trainer`` helps in disaggregated
    placements, where the trainer idles through the whole rollout)."""


@dataclass
class CheckpointSpec:
    """Checkpoints of the policy, optimizer and drafter, and resume."""

    location: str = spec_field("/checkpoints", min_length=1)
    """Directory for checkpoints (inside the pods; relative to the run directory in local
    mode)."""
    persistent_volume_claim: str | None = spec_field(
        None,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        pattern_hint="a PersistentVolumeClaim name",
    )
    """PVC mounted at ``location``; empty uses an emptyDir, which dies with the pod (tests
    only)."""
    every_steps: int = spec_field(10, minimum=1, maximum=1_000_000)
    """Checkpoint every N RL steps (and on suspend and at the end)."""
    keep_last: int = spec_field(3, minimum=1, maximum=1000)
    """Checkpoints kept; older ones are deleted after a newer one is complete."""
    resume: bool = spec_field(True)
    """Resume from the newest complete checkpoint when one exists."""


WeightSyncTransport = Literal["auto", "http", "broadcast"]
WeightHostCopy = Literal["spool", "memory"]


@dataclass
class WeightSyncSpec:
    """How each new policy version travels from the trainer to the rollout workers."""

    transport: WeightSyncTransport = spec_field(
        "auto",
        fix="broadcast uses NCCL on GPUs and gloo on CPU by itself: write broadcast, http or auto",
    )
    """``http``: every rollout worker pulls the version from the trainer in parallel pieces
    (works anywhere). ``broadcast``: the trainer broadcasts it in buckets on a process group of
    its own (NCCL on GPUs, gloo on CPU); a new or restarted worker catches up over HTTP first.
    ``auto``: broadcast when both the trainer and the rollout role have GPUs, else http."""
    bucket_mb: int = spec_field(
        1024,
        minimum=1,
        maximum=16384,
        fix="MiB per bucket, e.g. 1024, the default; the trainer holds at most two at a time",
    )
    """Size of each broadcast bucket in MiB; the sender packs the next bucket while one is on
    the wire, so it holds at most two (tensors larger than a bucket are split)."""
    phase_timeout_seconds: int = spec_field(
        120,
        minimum=5,
        maximum=3600,
        fix="seconds, e.g. 120, the default; enough for one bucket on the slowest link",
    )
    """Longest any phase of a sync may take (membership, group set-up, one bucket, the
    finish): a worker that does not keep up is dropped from that attempt and the version goes
    on to the others within this time."""
    host_copy: WeightHostCopy = spec_field(
        "memory",
        fix="memory (the trainer's own memory) or spool (files on the trainer's local disk)",
    )
    """Where the trainer keeps the copies of the versions it serves over HTTP (the ``http``
    transport's pieces; the ``broadcast`` transport's catch-up copy for new, restarted and
    dropped workers and for drafters; up to 4 versions). ``memory``: in the trainer's own
    memory, one version more than the policy at each sync, no disk writes (the fastest).
    ``spool``: mapped from files on the trainer's local disk (the pod's ``weight-spool``
    emptyDir), page cache the kernel writes back and can reclaim, so a sync adds at most two
    buckets to the trainer's own memory; each version is written to that disk, and a sync
    waits for it once the node's dirty-page limits are reached (for policies whose copies do
    not fit the trainer's memory)."""


def resolved_transport(weight_sync: WeightSyncSpec, trainer_gpus: int, rollout_gpus: int) -> str:
    """``http`` or ``broadcast``: ``weight_sync.transport`` with ``auto`` decided by whether
    both the trainer and the rollout role have GPUs (the operator and the workers both call
    this, so they agree)."""
    if weight_sync.transport != "auto":
        return weight_sync.transport
    return "broadcast" if trainer_gpus >= 1 and rollout_gpus >= 1 else "http"
