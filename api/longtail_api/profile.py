"""An engine profile: measured (or roofline) latencies the step simulator is calibrated with.

Written by ``longtail profile`` (``longtail_workers.profile``, measured on the current machine)
and by the documented roofline builder (``longtail_workers.sim.roofline``, first principles,
used only where no measured profile exists); read by ``longtail simulate``
(``longtail_workers.sim``). A file is JSON: :meth:`EngineProfile.to_dict` /
:meth:`EngineProfile.from_dict`, which rejects a bad file with a :class:`ProfileError` naming the
field, the value and the fix. Seconds are wall-clock seconds of one call on one rollout worker
(one engine instance, all its GPUs).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from longtail_api.policies import DRAFT_SOURCES

PROFILE_FORMAT = "longtail-profile/2"
Source = Literal["measured", "roofline"]
SOURCES: tuple[str, ...] = ("measured", "roofline")


class ProfileError(ValueError):
    """A profile file or value is invalid (message: field, value, fix)."""


@dataclass(frozen=True)
class ModelShape:
    """The decoder the profile was taken on (latencies depend on the shape, not the weights)."""

    hidden_size: int
    """Model width."""
    num_layers: int
    """Decoder layers."""
    num_heads: int
    """Attention heads."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int
    """MLP width."""
    vocab_size: int
    """Vocabulary size."""
    params: int
    """Parameter count."""
    dtype: str
    """Weight dtype, e.g. ``float32`` or ``bfloat16``."""


@dataclass(frozen=True)
class StepPoint:
    """One timed forward: ``batch`` sequences at ``context`` tokens, ``tokens`` new positions each
    (1: a plain decode step; k+1: a verify pass of k draft tokens; 1 on the drafter: one draft
    step)."""

    batch: int
    """Sequences in the running batch."""
    context: int
    """Tokens already in each sequence's KV cache."""
    tokens: int
    """New positions per sequence in this forward."""
    seconds: float
    """Wall-clock seconds of the forward (median of the repeats)."""


@dataclass(frozen=True)
class SyncCosts:
    """What moving one policy version costs, phase by phase (``longtail_api.steprow.SYNC_PHASES``),
    as byte rates the simulator scales to the transport a job uses (``sim/sync.py``). Every
    rate says in :attr:`sources` whether it was measured here or assumed (and from what)."""

    version_bytes: int
    """Bytes of one version as it travels: the profiled model's weights in its dtype."""
    http_pack_bytes_per_s: float
    """Trainer, ``http``: packing a version into checksummed pieces (cast, copy, sha256)."""
    http_pull_bytes_per_s: float
    """Rollout worker, ``http``: pulling a version's pieces and verifying them (the HTTP
    transport's wire)."""
    load_bytes_per_s: float
    """Rollout worker: copying a received, verified version into its model."""
    broadcast_pack_bytes_per_s: float | None = None
    """Trainer, ``broadcast``: casting and copying tensors into bucket buffers (no hashing on
    the critical path); None: not measured."""
    broadcast_wire_bytes_per_s: float | None = None
    """``broadcast``: the buckets' rate on the wire to :attr:`broadcast_receivers` receivers;
    None: not measured."""
    broadcast_receivers: int = 1
    """Receivers the broadcast rate was timed with."""
    gather_bytes_per_s: float | None = None
    """A sharded trainer's all-gather of the whole version (bytes of the version per second);
    None: not measured (a world-1 trainer holds whole tensors and gathers nothing)."""
    sources: dict[str, str] = field(default_factory=dict)
    """How each rate was obtained, by field name: ``measured: ...`` or ``assumed: ...``."""

    def __post_init__(self) -> None:
        if self.version_bytes < 1:
            raise ProfileError(f"weight_sync.version_bytes={self.version_bytes!r}: must be >= 1")
        for name in ("http_pack_bytes_per_s", "http_pull_bytes_per_s", "load_bytes_per_s",
                     "broadcast_pack_bytes_per_s", "broadcast_wire_bytes_per_s",
                     "gather_bytes_per_s"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ProfileError(
                    f"weight_sync.{name}={value!r}: must be > 0 (bytes/s), or null if not measured"
                )
        if self.broadcast_receivers < 1:
            raise ProfileError(
                f"weight_sync.broadcast_receivers={self.broadcast_receivers!r}: must be >= 1"
            )


@dataclass(frozen=True)
class Overheads:
    """What an RL step costs beyond the engine's steps, the update and the weight sync, each
    measured by ``longtail profile`` through the real code path (``profile/calls.py``,
    ``profile/merge.py``, ``profile/training.py``); the simulator charges them
    (``sim/step.py``)."""

    call_s: float
    """Per generate call: the request and reply over HTTP (answers encoded, sent, decoded), the
    worker's drafter refresh and its capture of the answers' hidden states."""
    engine_step_s: float
    """Per engine step: the engine's work between the steps it times (admitting and retiring
    rows, moving rows, its loop)."""
    engine_warmup_s: float
    """The first generate call of a fresh engine, beyond a warm one (allocation, first-use
    kernels, CUDA-graph capture): the job's first step pays it."""
    trainer_warmup_s: float
    """The first GRPO update, beyond a later one (optimizer state, allocator): the first step."""
    merge_s: float
    """Merging one drafter candidate after the update: the held-out sample (the policy's
    forward over the step's answers), scoring, averaging and publishing the new version."""
    merge_candidate_s: float
    """Each further candidate of the same merge (loading, checking, scoring it)."""

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not value >= 0:
                raise ProfileError(f"overheads.{name}={value!r}: must be >= 0 (seconds)")


@dataclass(frozen=True)
class EngineProfile:
    """Everything the simulator needs to time one rollout worker and the trainer."""

    source: Source
    """``measured`` (``longtail profile``) or ``roofline`` (first principles; labelled in every
    output that uses it)."""
    device: str
    """Where it was taken, e.g. ``cpu (2 cores)`` or ``NVIDIA H100 80GB HBM3``."""
    engine: str
    """``torch``, ``vllm`` or ``roofline``."""
    model: ModelShape
    """The target (policy) model's shape."""
    decode: list[StepPoint]
    """Plain decode steps (1 new token per sequence). Measured: the engine's whole step
    (forward, sampling, stop checks, cache bookkeeping); roofline: the forward."""
    verify: list[StepPoint]
    """Target forwards of k+1 tokens per sequence (SD verify), for the profiled depths k."""
    draft: list[StepPoint]
    """Drafter forwards of 1 token per sequence (one draft step)."""
    prefill_tokens_per_s: float
    """Prompt tokens per second in prefill."""
    drafter_train_tokens_per_s: float
    """Training-pair tokens per second of the online drafter trainer."""
    trainer_seconds_per_token: float
    """GRPO update seconds per token of the update's sequences, prompt and response tokens
    alike (forward + backward + optimizer, one trainer): every token of a sequence goes through
    the forward and backward passes, not only the ones that carry loss."""
    weight_sync_s: float = 0.0
    """Seconds to move a new policy version to a rollout worker over HTTP (publish, pull, load;
    workers pull in parallel); 0: not measured."""
    weight_sync: SyncCosts | None = None
    """The weight sync's costs phase by phase, for both transports (None: a profile written
    before they were measured; the simulator then needs ``--weight-sync-s``)."""
    kv_cache_tokens: int | None = None
    """Tokens (prompt + generated, all running answers together) one rollout worker's KV cache
    holds; None: not bounded (the torch engine grows its cache as needed)."""
    drafter_catch_up_tokens_per_s: float | None = None
    """Response tokens per second the drafter reads when speculation switches on (it catches
    up on every running row's response so far before its first draft), measured through the
    engine as the first speculative step's excess over the next ones; None: not measured
    (the switch is free in the simulation)."""
    overheads: Overheads | None = None
    """What a step costs beyond engine steps, update and sync (None: a profile written before
    they were measured, or the roofline; the simulator then leaves them out, with a note)."""
    speculative: list[StepPoint] = field(default_factory=list)
    """Whole speculative steps of depth k (``tokens`` = k+1) measured through the engine: k draft
    steps, the verify, the rejection sampler. Empty (roofline): the simulator adds k draft
    steps and one verify."""
    history_speculative: list[StepPoint] = field(default_factory=list)
    """Whole history-only speculative steps of depth k (``tokens`` = k+1) measured through the
    torch engine: the verify of drafts staged from the history index and the rejection sampler,
    no drafter forward; the host's proposals are taken out (they are :attr:`history_propose`).
    Empty (a profile written before the history drafter, vLLM, the roofline): the simulator
    charges the speculative step less its k draft steps."""
    history_propose: list[StepPoint] = field(default_factory=list)
    """Host seconds of one row's history proposal (``engine/native/history.py``: the longest
    match of the answer's newest tokens and its continuation) with ``context`` tokens in the answer
    and ``tokens`` = the depth k asked for; ``batch`` is 1: a step pays its rows x this. Empty: not
    measured (the simulator then uses its documented default, with a note)."""
    accepted_length: dict[str, float] = field(default_factory=dict)
    """Accepted length (accepted drafts + 1) per draft source (``learned``, ``history``: every
    row of a history step, matched or not) that the speculative steps were timed with and that
    the simulator uses when the job's strategies name that drafter. Empty: a profile written
    before these were recorded (the simulator then uses its defaults, with a note)."""
    hybrid_history_share: float | None = None
    """Share of a ``hybrid`` step's rows whose history match reaches ``hybridMinMatch`` (they
    take the history's drafts); None: not recorded."""
    hybrid_history_accepted_length: float | None = None
    """Accepted length of those rows (longer than a history step's over all rows: only long
    matches are taken); None: not recorded (the simulator's default, with a note)."""
    notes: list[str] = field(default_factory=list)
    """Assumptions and caveats, printed with every result that uses this profile."""
    format: str = PROFILE_FORMAT
    """File format tag."""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ProfileError(f"source={self.source!r}: use one of {', '.join(SOURCES)}")
        for name in ("decode", "verify", "draft", "speculative", "history_speculative",
                     "history_propose"):  # fmt: skip
            points: list[StepPoint] = getattr(self, name)
            if not points and name in ("decode", "verify", "draft"):
                raise ProfileError(f"{name}: no points; profile at least one batch size")
            for i, p in enumerate(points):
                if p.batch < 1 or p.context < 0 or p.tokens < 1 or not p.seconds > 0:
                    raise ProfileError(
                        f"{name}[{i}]={p}: need batch >= 1, context >= 0, tokens >= 1, seconds > 0"
                    )
        if not self.weight_sync_s >= 0:
            raise ProfileError(f"weight_sync_s={self.weight_sync_s!r}: must be >= 0")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < 1:
            raise ProfileError(
                f"kv_cache_tokens={self.kv_cache_tokens!r}: must be >= 1, or null for unbounded"
            )
        rate = self.drafter_catch_up_tokens_per_s
        if rate is not None and not rate > 0:
            raise ProfileError(
                f"drafter_catch_up_tokens_per_s={rate!r}: must be > 0, or null (not measured)"
            )
        for name in ("prefill_tokens_per_s", "drafter_train_tokens_per_s",
                     "trainer_seconds_per_token"):  # fmt: skip
            value = getattr(self, name)
            if not value > 0:
                raise ProfileError(f"{name}={value!r}: must be > 0")
        self._check_acceptance()

    def _check_acceptance(self) -> None:
        for source, length in self.accepted_length.items():
            if source not in DRAFT_SOURCES or not length >= 1:
                raise ProfileError(
                    f"accepted_length[{source!r}]={length!r}: give a draft source "
                    f"({', '.join(DRAFT_SOURCES)}) and a length >= 1 (accepted drafts + 1)"
                )
        share = self.hybrid_history_share
        if share is not None and not 0 <= share <= 1:
            raise ProfileError(
                f"hybrid_history_share={share!r}: must be a share in [0, 1], or null"
            )
        hybrid = self.hybrid_history_accepted_length
        if hybrid is not None and not hybrid >= 1:
            raise ProfileError(f"hybrid_history_accepted_length={hybrid!r}: must be >= 1, or null")

    @property
    def padded_context(self) -> bool:
        """Whether a step's cost follows the longest running sequence rather than the mean.

        The torch engine on a CPU runs its reference attention, masked SDPA over the running
        batch's slots up to the longest row, so every row attends over as many slots as the
        longest one holds (a batch of 80- and 11-token prompts decodes at context 80+). On a
        GPU it runs the Triton slot kernel, which reads each row's own tokens, as vLLM's paged
        attention (and the roofline) do."""
        return self.engine == "torch" and self.device.startswith("cpu")

    def to_dict(self) -> dict[str, Any]:
        """The profile as plain JSON."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object, where: str = "profile") -> EngineProfile:
        """Parse and check a profile; :class:`ProfileError` names the field and the fix."""
        if not isinstance(data, dict):
            raise ProfileError(f"{where}: expected a JSON object, got {type(data).__name__}")
        fmt = data.get("format")
        if fmt != PROFILE_FORMAT:
            raise ProfileError(
                f"{where}.format={fmt!r}: expected {PROFILE_FORMAT!r}; write the file with "
                "`longtail profile`"
            )
        try:

            def points(name: str) -> list[StepPoint]:
                return [StepPoint(**p) for p in data[name]]

            rest = {
                k: v for k, v in data.items()
                if k not in ("model", "decode", "verify", "draft", "speculative", "weight_sync",
                             "overheads", "history_speculative", "history_propose")
            }  # fmt: skip
            sync = data.get("weight_sync")
            return cls(
                model=ModelShape(**data["model"]),
                decode=points("decode"),
                verify=points("verify"),
                draft=points("draft"),
                speculative=points("speculative") if "speculative" in data else [],
                # absent from a profile written before the history drafter: empty
                history_speculative=points("history_speculative")
                if "history_speculative" in data
                else [],
                history_propose=points("history_propose") if "history_propose" in data else [],
                weight_sync=None if sync is None else SyncCosts(**sync),
                overheads=None if data.get("overheads") is None else Overheads(**data["overheads"]),
                **rest,
            )
        except KeyError as exc:
            raise ProfileError(f"{where}: missing field {exc}") from exc
        except TypeError as exc:
            raise ProfileError(f"{where}: {exc}") from exc

    def write(self, path: str | Path) -> None:
        """Write the profile as indented JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def read(cls, path: str | Path) -> EngineProfile:
        """Read and check a profile file."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ProfileError(f"{path}: cannot read a profile ({exc})") from exc
        return cls.from_dict(data, str(path))
