"""One RL step's record: the row the trainer appends to ``metrics.jsonl`` for every step.

The trainer's step driver (``longtail_workers.trainer.driver``) builds a :class:`StepRow` per
completed step; the trainer service writes :meth:`StepRow.to_dict` as one JSON line, exports it
as Prometheus metrics and serves the latest one in its status; ``longtail run``'s report
(``longtail_workers.local.report``), the resume path (which drops rows past the checkpoint) and
``bench/rl_step.py`` read the file back with :meth:`StepRow.from_dict`. The JSON keys are the
field names (flat, so a row is one CSV line), with the optimizer's statistics spread out as
``train_<name>``; rows written by older versions, which lack the later fields, still load.

Pure module: standard library and ``longtail_api`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from longtail_api.protocol import ProtocolError
from longtail_api.wirecodec import Count, Finite, NonNegative, Version, from_wire

METRICS_FILE = "metrics.jsonl"
"""The trainer's rows in its run directory, one JSON object a line."""
TRAIN_PREFIX = "train_"
"""Prefix of the optimizer statistics' keys (``train_loss``, ``train_grad_norm``, ...)."""
_OPTIONAL = ("trainer_harvested_s", "eval_accuracy", "eval_sampled_accuracy", "idle_s",
             "harvested_s", "drafter_candidates", "drafter_unpublished", "reward_std",
             "rollout_workers")  # fmt: skip
SYNC_PHASES = ("gather", "pack", "wire", "load", "pause")
"""The phases of one policy version's weight sync, in order (metric labels, row keys
``sync_<phase>_s``, docs): ``gather`` (the trainer producing whole tensors: a sharded trainer's
all-gathers), ``pack`` (casting and copying them into pieces/buckets, hashing), ``wire`` (the
broadcast's buckets on the wire; 0 over HTTP, where the workers pull during ``load``),
``load`` (the slowest rollout worker obtaining and loading the version at its first generate
call: the HTTP pull included, or the copy of the broadcast buckets into its engine) and
``pause`` (all of it: from the trainer starting the publish until the last worker holds the
version, the time the sync adds to the step)."""
_SYNC = ("sync_version", "sync_transport", "sync_bytes", "sync_gb_per_s",
         *(f"sync_{p}_s" for p in SYNC_PHASES))  # fmt: skip
_BY_SOURCE = ("sd_fraction_by_source", "accepted_length_by_source")
# Per-answer lists come last in a row: they are long, and not CSV columns.
_LISTS = ("response_lengths", "prompt_lengths", "answer_spec_steps", "answer_accepted_drafts",
          "answer_ids", "answer_workers")  # fmt: skip


@dataclass
class StepRow:
    """What one RL step did: versions, rewards, answer lengths, time split, speculation."""

    step: Count
    """The RL step, 1-based."""
    policy_version: Count
    """Policy weights version after this step's update."""
    drafter_version: Version
    """Drafter version the rollout workers drafted with at the end of the step (-1: none)."""
    reward_mean: Finite
    """Mean reward of the step's answers."""
    accuracy: Finite
    """Fraction of the step's answers the verifier scored correct."""
    rollout_s: Finite
    """Step start until the last answer arrived (includes :attr:`tail_s`)."""
    tail_s: Finite
    """From the first rollout worker running out of work until the last answer: the long tail."""
    train_s: Finite
    """Rewards, advantages and the policy update."""
    step_s: Finite
    """Wall time of the whole step."""
    sync_s: Finite = 0.0
    """Publishing the new policy weights (and merging drafter candidates)."""
    answers: Count = 0
    """Answers generated (prompts x group size)."""
    mean_length: Finite = 0.0
    """Mean answer length in tokens."""
    max_length: Count = 0
    """Longest answer in tokens."""
    sd_fraction: Finite | None = None
    """Share of the generated tokens that came from speculative steps."""
    mean_accepted_length: Finite | None = None
    """Mean tokens gained per sequence per speculative step (0: no speculation this step)."""
    sd_fraction_by_source: dict[str, NonNegative] = field(default_factory=dict)
    """:attr:`sd_fraction` split by what drafted the rows (``longtail_api.policies.
    DRAFT_SOURCES``: ``learned``, ``history``): the share of all the step's generated tokens
    committed in speculative steps by the rows each source drafted (sums to :attr:`sd_fraction`
    when every worker reports it); a source that drafted nothing is absent, and so is the key
    in rows written before the split."""
    accepted_length_by_source: dict[str, NonNegative] = field(default_factory=dict)
    """:attr:`mean_accepted_length` of the rows each draft source drafted."""
    redispatched: Count = 0
    """Requests sent again to another worker after theirs failed."""
    failed_workers: list[str] = field(default_factory=list)
    """Rollout workers that failed during the step, sorted."""
    rollout_workers: Count | None = None
    """Rollout workers present when the step's rollout ended (live in the trainer's pool, not
    marked down): a lost worker leaves the count at the step that lost it, a returning one
    counts from the step it answers again (elastic rollout). None: a row written before it was
    recorded."""
    drafter_candidates_rejected: Count = 0
    """Drafter candidates the trainer refused during the step (all reasons)."""
    drafter_refused: dict[str, Count] = field(default_factory=dict)
    """Those refusals by reason (``longtail_api.drafterstatus.REFUSAL_REASONS``: bad input,
    a stale base, scoring below the current version, superseded, ...); empty: none."""
    drafter_unpublished: str | None = None
    """Why no online drafter version has been published yet, as of this step (None: one has,
    or the job trains no drafter)."""
    drafter_candidates: Count | None = None
    """Drafter candidates waiting for the merge after this step's update (each worker's
    newest; 0: no merge ran; None: a row written before it was recorded). The step simulator
    replays a run's merges with it (``sim/runs.py``)."""
    train: dict[str, float] = field(default_factory=dict)
    """The optimizer's statistics (loss, grad norm, ...), ``train_<name>`` in the JSON."""
    acceptance_collapsed: bool = False
    """Speculation accepts almost nothing after it once worked: the drafter went stale."""
    trainer_harvested_s: Finite | None = None
    """Seconds of the trainer's waits spent training the drafter (None: trainer harvest off)."""
    eval_accuracy: Finite | None = None
    """Greedy held-out accuracy, on the steps that evaluate."""
    eval_sampled_accuracy: Finite | None = None
    """Sampled held-out accuracy, on the steps that evaluate."""
    idle_s: Finite | None = None
    """``longtail run`` only: GPU-seconds rollout workers sat idle (from the harvest books)."""
    harvested_s: Finite | None = None
    """``longtail run`` only: of those, seconds spent training the drafter."""
    reward_std: Finite | None = None
    """Standard deviation of the step's answers' rewards (None: a row written before it was
    recorded)."""
    worker_generate_s: dict[str, float] = field(default_factory=dict)
    """Seconds each rollout worker spent in its generate call (drafter refresh, engine, capture
    for drafter training), by worker: the rollout less the slowest of these is dispatch, the
    policy pull and transport."""
    sync_version: Count | None = None
    """The policy version the ``sync_*`` figures describe: the one this step's rollout generated
    with (published at the end of the previous step, or at the start for the first)."""
    sync_transport: str | None = None
    """How it travelled: ``http`` or ``broadcast`` (None: the publisher did not say)."""
    sync_gather_s: NonNegative | None = None
    """Trainer: producing the whole tensors (:data:`SYNC_PHASES` says what each phase is)."""
    sync_pack_s: NonNegative | None = None
    """Trainer: casting, copying and hashing them into pieces/buckets."""
    sync_wire_s: NonNegative | None = None
    """Trainer: waiting for the broadcast buckets on the wire (0 over HTTP)."""
    sync_load_s: NonNegative | None = None
    """The slowest rollout worker's load of the version (HTTP: its pull included)."""
    sync_pause_s: NonNegative | None = None
    """The trainer's publish (wall time) plus the slowest load: what the sync adds to a step."""
    sync_bytes: Count | None = None
    """Bytes of the version as it travels (the engine's dtype)."""
    sync_gb_per_s: NonNegative | None = None
    """``sync_bytes`` / ``sync_pause_s`` in GB/s (1e9 bytes): the end-to-end rate."""
    worker_load_s: dict[str, float] = field(default_factory=dict)
    """Seconds each rollout worker spent obtaining and loading version :attr:`sync_version` at
    its first generate call with it (the rollout pause each one saw), by worker."""
    response_lengths: list[Count] = field(default_factory=list)
    """Response tokens of every answer, in request order (prompt i's answers are
    ``[i*group:(i+1)*group]``): the long tail ``longtail simulate --lengths run:DIR`` replays."""
    prompt_lengths: list[Count] = field(default_factory=list)
    """Prompt tokens of every prompt of the step, in order."""
    answer_spec_steps: list[Count] = field(default_factory=list)
    """Speculative steps of every answer, in request order (0: it never speculated)."""
    answer_accepted_drafts: list[Count] = field(default_factory=list)
    """Draft tokens accepted for every answer over those steps: its accepted length is
    ``1 + accepted / steps``, which the simulator replays per answer (the long answers of the
    tail accept fewer than the step's mean)."""
    answer_ids: list[str] = field(default_factory=list)
    """Each answer's request id as the worker sent it back (``s<step>-p<prompt>-g<answer>``),
    in request order: every request of the step is answered once, re-dispatched or not."""
    answer_workers: list[str] = field(default_factory=list)
    """The rollout worker whose answer the step kept, per answer in request order (a lost
    worker's share shows the workers it was re-dispatched to)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON line's object; optional fields without a value are left out."""
        out: dict[str, Any] = {
            "step": self.step, "policy_version": self.policy_version,
            "drafter_version": self.drafter_version, "reward_mean": self.reward_mean,
            "accuracy": self.accuracy, "answers": self.answers, "mean_length": self.mean_length,
            "max_length": self.max_length, "rollout_s": self.rollout_s, "tail_s": self.tail_s,
            "sd_fraction": self.sd_fraction, "mean_accepted_length": self.mean_accepted_length,
            "redispatched": self.redispatched, "failed_workers": list(self.failed_workers),
            "drafter_candidates_rejected": self.drafter_candidates_rejected,
        }  # fmt: skip
        out |= {TRAIN_PREFIX + k: v for k, v in self.train.items()}
        out |= {"acceptance_collapsed": self.acceptance_collapsed, "train_s": self.train_s,
                "sync_s": self.sync_s, "step_s": self.step_s}  # fmt: skip
        out |= {k: getattr(self, k) for k in _OPTIONAL if getattr(self, k) is not None}
        for key in _BY_SOURCE:
            if getattr(self, key):
                out[key] = dict(getattr(self, key))
        if self.drafter_refused:
            out["drafter_refused"] = dict(self.drafter_refused)
        if self.worker_generate_s:
            out["worker_generate_s"] = dict(self.worker_generate_s)
        out |= {k: getattr(self, k) for k in _SYNC if getattr(self, k) is not None}
        if self.worker_load_s:
            out["worker_load_s"] = dict(self.worker_load_s)
        out |= {k: list(getattr(self, k)) for k in _LISTS if getattr(self, k)}
        return out

    @classmethod
    def from_dict(cls, data: object, path: str = "row") -> StepRow:
        """A row read back; a missing required key or a value of the wrong type raises
        :class:`~longtail_api.protocol.ProtocolError` naming it (``row.reward_mean``)."""
        if not isinstance(data, Mapping):
            raise ProtocolError(path, "must be a JSON object", data)
        train: dict[str, float] = {}
        for key, value in data.items():  # a diverged loss (NaN, inf) is kept as is
            if key.startswith(TRAIN_PREFIX) and key != "train_s":
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ProtocolError(f"{path}.{key}", "must be a number", value)
                train[key.removeprefix(TRAIN_PREFIX)] = value
        return from_wire(cls, {**data, "train": train}, path, snake_case=True)
