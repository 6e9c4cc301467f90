"""The GRPO step driver: prompts -> rollout workers -> verifier -> policy update -> publish.

:class:`StepDriver` is the trainer role's loop, run by ``trainer/service.py`` (a pod, or a
process of ``longtail run``). One RL step:

1. draw ``promptsPerStep`` prompts (seeded order; a resumed run continues the same sequence)
   and build ``groupSize`` sampling requests per prompt with per-answer seeds;
2. roll out on the :class:`~longtail_workers.trainer.dispatch.RolloutPool` with policy
   version ``v`` (lost workers' shards are re-dispatched); with trainer harvesting on
   (``harvest`` below), the trainer then ends its own drafter-train window
   (``trainer/drafter_window.py``), so nothing trains while the policy changes. The rollout
   workers' windows are ended by the harvest loop, their only role writer, once it sees the
   rollout over; the merge (4.) waits for them, bounded (``DriverConfig.window_end_grace_s``);
3. score the answers with the verifier, compute group advantages, build the batch and run
   :func:`~longtail_workers.trainer.optim.train_step` on every trainer rank (``policy``:
   :class:`~longtail_workers.trainer.group.PolicyLeader`, which brings the follower ranks of a
   sharded trainer along; they also join each weight gather and checkpoint);
4. publish policy ``v + 1`` (weight sync) and merge the drafter candidates into a new drafter
   version (loaded by the workers at the start of the next rollout), weighed and judged by what
   the trainer can check (``checks``: ``trainer/candidate_checks.py``, which books the answer
   tokens each rollout hands out);
5. record the step's row (metrics JSONL), evaluate greedily every ``evalEverySteps``, and
   checkpoint every ``checkpoint.everySteps``; hand the step's answers to the trainer's harvest
   (the data of its next drafter-train window) and, once the step's policy and drafter versions
   are published, keep them as :attr:`StepDriver.latest_samples` (``GET /v1/samples/latest``:
   the data of the dedicated drafter workers, ``drafter_worker/``).

``stop`` (SIGTERM/SIGINT) is honoured between phases, during the rollout and during the policy
update (between micro-batches and before the optimiser step: ``optim.train_step``): the step in
progress is abandoned, its half-done update never applied, and the driver writes a checkpoint of
the last completed step and returns.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from longtail_api.acceptance import acceptance_collapsed
from longtail_api.protocol import VerifyItem
from longtail_api.spec import RLJobSpec
from longtail_api.steprow import StepRow
from longtail_workers.data import Example, format_example, iterate_batches, reward_name
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.trainer.batch import GrpoBatch
from longtail_workers.trainer.candidate_checks import CandidateChecks
from longtail_workers.trainer.dispatch import RolloutAborted, RolloutOutcome, RolloutPool
from longtail_workers.trainer.drafter_window import TrainerHarvestee
from longtail_workers.trainer.group import PolicyLeader
from longtail_workers.trainer.grpo import group_advantages, sequence_logprobs
from longtail_workers.trainer.optim import UpdateAbandoned
from longtail_workers.trainer.policy import build_policy
from longtail_workers.trainer.rollout_batch import build_grpo_batch
from longtail_workers.trainer.syncbook import SyncBook
from longtail_workers.trainer.world import TrainerWorld
from longtail_workers.verifier.client import VerifierClient
from longtail_workers.weights.sync import Published, SyncPhases, WeightPublisher
from longtail_workers.wire.rollout import Sample, source_figures
from longtail_workers.wire.samples import StepSamples

log = logging.getLogger(__name__)


@dataclass
class DriverState:
    """What the status endpoint reports; updated by the driver thread."""

    step: int = 0
    total_steps: int = 0
    phase: str = "running"
    policy_version: int = 0
    drafter_version: int = -1
    rollout_active: bool = False
    rollout_started: float | None = None
    """Unix time the current step's rollout began (the trainer waits from then on)."""
    answers_done: int = 0
    answers_total: int = 0
    pending_workers: set[str] = field(default_factory=set)
    last_row: StepRow | None = None
    eval_accuracy: float | None = None
    eval_sampled_accuracy: float | None = None
    accepted_lengths: list[float] = field(default_factory=list)
    """Mean accepted length of every step so far (0: no speculation), for the collapse rule."""
    last_checkpoint_step: int | None = None
    message: str = ""


@dataclass(frozen=True)
class DriverConfig:
    run_dir: Path
    checkpoint_dir: Path
    eval_max_new_tokens: int | None = None
    window_end_grace_s: float = 30.0
    """How long the drafter merge waits, beyond two harvest polls, for the harvest loop to end
    the rollout workers' drafter-train windows (their candidates are submitted as they end)."""


EVAL_SEED_STEP = 2**31
"""The ``step`` of eval answers' seeds: outside every training step, the same at every eval."""


def answer_seed(seed: int, step: int, prompt: int, answer: int) -> int:
    """The sampling seed of one answer: a pure function of (job seed, step, prompt, answer)."""
    return int(np.random.SeedSequence([seed, step, prompt, answer]).generate_state(1)[0])


class StepDriver:
    """Runs RL steps (see the module text)."""

    def __init__(
        self,
        spec: RLJobSpec,
        model: torch.nn.Module,
        tokenizer: Any,
        train_set: Sequence[Example],
        eval_set: Sequence[Example],
        pool: RolloutPool,
        verifier: VerifierClient,
        publisher: WeightPublisher,
        config: DriverConfig,
        *,
        registry: Any = None,
        harvest: TrainerHarvestee | None = None,
        checks: CandidateChecks | None = None,
        on_row: Callable[[StepRow], None] = lambda row: None,
        policy: PolicyLeader | None = None,
    ) -> None:
        self.spec, self.model, self.tok = spec, model, tokenizer
        self.train_set, self.eval_set = train_set, eval_set
        self.pool, self.verifier, self.publisher = pool, verifier, publisher
        self.config, self.registry, self.on_row = config, registry, on_row
        self.harvest = harvest
        """The trainer's own drafter training during rollouts (None: off, the default)."""
        self.checks = checks
        """What the trainer checks of drafter candidates at the merge (None: their word)."""
        self._trainer_harvested_s = 0.0
        self._workers: int | None = None  # rollout workers of the last step (log on changes)
        self.latest_samples: StepSamples | None = None
        """The last completed step's answers and the policy version published after it."""
        if policy is None:  # a lone trainer on ``model`` as given (world 1)
            policy = PolicyLeader(build_policy(spec, TrainerWorld(), model)[0])
        self.policy = policy
        """Every update, gather and checkpoint goes through it (all trainer ranks take part)."""
        self.train_cfg, self.optimizer = policy.policy.cfg, policy.policy.optimizer
        # The KL reference is the policy as loaded (before any checkpoint is applied on resume).
        self.reference = policy.policy.reference
        self._published: Published | None = None  # the last publish (its sha256 for checkpoints)
        self.last_sync: SyncPhases | None = None
        """The last publish's phases (gather, pack, wire; bytes): the manifest's."""
        self.syncs = SyncBook()
        """Each version's sync, phase by phase, and each worker's held version (status)."""
        self.state = DriverState(total_steps=spec.algorithm.total_steps)
        self.lock = threading.RLock()  # model + optimizer: train step vs checkpoint
        self.stop = threading.Event()
        self._eos = [int(tokenizer.eos_token_id)]

    # --- prompts and requests ---------------------------------------------------------------

    def _encode(self, example: Example) -> list[int]:
        text = format_example(self.tok, example, self.spec.dataset.apply_chat_template)
        return list(self.tok.encode(text, add_special_tokens=False))

    def step_requests(self, step: int, prompts: Sequence[Example]) -> list[GenerationRequest]:
        algo = self.spec.algorithm
        return [
            GenerationRequest(
                self._encode(ex),
                algo.max_new_tokens,
                temperature=algo.temperature,
                top_p=algo.top_p,
                seed=answer_seed(algo.seed, step, i, g),
                stop_token_ids=self._eos,
                request_id=f"s{step}-p{i}-g{g}",
            )
            for i, ex in enumerate(prompts)
            for g in range(algo.group_size)
        ]

    # --- the loop ---------------------------------------------------------------------------

    def publish_policy(self) -> float:
        """Publish the current policy version (every trainer rank gathers it tensor by tensor,
        rank 0 packs and sends: ``PolicyLeader.publish``); returns the wall seconds and keeps
        the publish's phases in :attr:`last_sync`."""
        t0 = time.monotonic()
        with self.lock:
            version = self.state.policy_version
            published = self.policy.publish(self.publisher, version)
            self.last_sync = published.phases
            # The checkpoint's model_sha256 is the model state dict's checksum: the published
            # version's (hashed in the background meanwhile) only when it travels in the
            # model's own dtypes (else None: the checkpoint computes it).
            native = self.policy.policy.wire_is_native
            self._published = published if native else None
        return time.monotonic() - t0

    def run(self, start_step: int) -> str:
        """Steps ``start_step + 1 .. totalSteps``; returns ``complete`` or ``stopped``."""
        self.state.step = start_step
        self._book_sync(self.publish_policy())
        try:
            self._steps(start_step)
        except (RolloutAborted, UpdateAbandoned) as exc:
            log.info("the step in progress is abandoned: %s", exc)
            return self._stop()
        if self.stop.is_set():
            return self._stop()
        self.state.phase = "complete"
        return "complete"

    def _steps(self, start_step: int) -> None:
        algo = self.spec.algorithm
        batches = iterate_batches(self.train_set, algo.prompts_per_step, algo.seed, start_step)
        if start_step == 0 and self.eval_set:
            self.evaluate()
        for step in range(start_step + 1, algo.total_steps + 1):
            if self.stop.is_set():
                return
            row = self.one_step(step, next(batches))
            evaluate = algo.eval_every_steps and step % algo.eval_every_steps == 0
            if self.eval_set and (evaluate or step == algo.total_steps):
                try:
                    row.eval_accuracy = self.evaluate()
                    row.eval_sampled_accuracy = self.state.eval_sampled_accuracy
                except RolloutAborted:
                    self._completed(row)  # the step itself completed: keep its row
                    raise
            self._completed(row)
            every = self.spec.checkpoint.every_steps
            if step % every == 0 or step == algo.total_steps:
                self.checkpoint()

    def _completed(self, row: StepRow) -> None:
        """``row``'s step is complete (trained, published, evaluated if due): the status
        carries its figures from now on (``figures_step``), and ``on_row`` records it."""
        self.state.last_row = row
        self.on_row(row)

    def _check_stop(self, where: str) -> None:
        """Abandon the step in progress (:class:`UpdateAbandoned`) once a stop is asked for."""
        if self.stop.is_set():
            raise UpdateAbandoned(f"stop requested {where}")

    def _stop(self) -> str:
        log.info("stop requested: checkpointing step %d and stopping", self.state.step)
        if self.state.last_checkpoint_step != self.state.step:
            self.checkpoint()
        return "stopped"

    def one_step(self, step: int, prompts: Sequence[Example]) -> StepRow:
        algo = self.spec.algorithm
        t_step = time.monotonic()
        used = self.state.policy_version  # the version this step's rollout generates with
        self.pool.revive()  # the workers the job names now; those that answer take prompts
        requests = self.step_requests(step, prompts)
        out = self._rollout(step, requests)
        self._handed_out(out)
        answered = [ex for ex in prompts for _ in range(algo.group_size)]
        t_train = time.monotonic()
        self._check_stop("before scoring")
        rewards, correct = self._score(out.samples, answered)
        adv = group_advantages(torch.tensor(rewards), algo.group_size)
        batch = build_grpo_batch(out.samples, adv.tolist(), pad_id=int(self.tok.pad_token_id))
        if self.reference is not None:
            batch = dataclasses.replace(batch, ref_logprobs=self._ref_logprobs(batch))
        self._check_stop("before the policy update")
        with self.lock:
            stats = self.policy.train(batch, step, self.stop.is_set)
            self.state.policy_version += 1
            self.state.step = step
        if self.harvest is not None:
            self.harvest.set_samples(out.samples, step)
        train_s = time.monotonic() - t_train
        sync_s = self.publish_policy()
        self._book_sync(sync_s)
        sync_s += self._merge_drafters(out.samples)
        # After both publishes: a drafter worker loads this policy version and trains on top of
        # the drafter version just merged, so its candidate counts at the next step's merge.
        self.latest_samples = StepSamples.of(step, self.state.policy_version, out.samples)
        row = self._row(step, out, rewards, correct, stats.as_dict(), train_s, sync_s)
        if self.registry is not None:  # what became of the drafter candidates
            row.drafter_candidates = self.registry.last_merge_candidates
            row.drafter_refused = self.registry.refusals.take_new()
            row.drafter_candidates_rejected = sum(row.drafter_refused.values())
            if self.registry.latest_version() is None:
                row.drafter_unpublished = self.registry.refusals.unpublished()
        self.syncs.fill(row, used)
        now, was = row.rollout_workers or 0, self._workers
        if was is not None and now != was:
            how = "shrank" if now < was else "grew"
            log.info("step %d: the rollout %s to %d workers (was %d)", step, how, now, was)
        self._workers = row.rollout_workers
        self.state.accepted_lengths.append(row.mean_accepted_length or 0.0)
        row.acceptance_collapsed = acceptance_collapsed(self.state.accepted_lengths)
        if row.acceptance_collapsed:
            log.warning("step %d: speculative decoding accepts almost nothing (mean accepted "
                        "length %.2f) after it once worked: the drafter no longer matches the "
                        "policy", step, row.mean_accepted_length)  # fmt: skip
        row.step_s = time.monotonic() - t_step
        return row

    @torch.no_grad()
    def _ref_logprobs(self, batch: GrpoBatch, rows_per_pass: int = 32) -> torch.Tensor:
        """Reference-policy log-probs ``[B, T]`` of the batch, a few rows per forward pass."""
        assert self.reference is not None
        device = next(self.reference.parameters()).device
        parts = []
        for lo in range(0, batch.num_sequences, rows_per_pass):
            self._check_stop("while scoring the reference log-probs")
            sl = slice(lo, lo + rows_per_pass)
            parts.append(sequence_logprobs(
                self.reference, batch.input_ids[sl].to(device),
                batch.attention_mask[sl].to(device), batch.response_mask[sl].to(device),
                self.train_cfg.temperature,
            ).cpu())  # fmt: skip
        return torch.cat(parts)

    def _rollout(self, step: int, requests: list[GenerationRequest]) -> RolloutOutcome:
        st = self.state
        if self.harvest is not None:  # before rollout_active: it may be harvested from then on
            self.harvest.begin_rollout(st.policy_version)
        st.answers_done, st.answers_total = 0, len(requests)

        def started() -> None:  # the pool has marked the workers it handed shards to
            st.rollout_started, st.rollout_active = time.time(), True

        try:
            group = self.spec.algorithm.group_size
            out = self.pool.run(
                requests, step, st.policy_version, self.stop, group=group, started=started
            )
        finally:
            st.rollout_active, st.rollout_started = False, None
            st.pending_workers.clear()
            if self.harvest is not None:  # stopped (bounded wait) before the policy update
                self._trainer_harvested_s = self.harvest.end_rollout()
        st.answers_done = len(requests)
        return out

    def _score(
        self, samples: Sequence[Sample], examples: Sequence[Example]
    ) -> tuple[list[float], list[bool]]:
        """Rewards of ``samples`` (answers to ``examples``, in order), each example scored by
        its reward (``dataset.rewardBySource`` routes a row's data_source)."""
        texts = self.tok.batch_decode(
            [s.output_token_ids for s in samples], skip_special_tokens=True
        )
        ds = self.spec.dataset
        items = [
            VerifyItem(text, ex.answer, reward_name(ex, ds))
            for text, ex in zip(texts, examples, strict=True)
        ]
        resp = self.verifier.verify(items, reward=ds.reward, format_weight=ds.format_weight)
        return [r.reward for r in resp.results], [r.correct for r in resp.results]

    def _merge_drafters(self, samples: Sequence[Sample]) -> float:
        """Merge the step's drafter candidates, judged on ``samples`` (the step's answers) under
        the policy just trained when the trainer checks them (``candidate_checks.py``)."""
        if self.registry is None:
            return 0.0
        t0 = time.monotonic()
        harvest = self.spec.harvest
        if harvest.enabled:  # the harvest loop ends the rollout's windows meanwhile
            bound = self.config.window_end_grace_s + 2 * harvest.poll_period_seconds
            late = self.pool.wait_windows_ended(bound)
            if late:
                log.warning("%s still in drafter-train %gs after the rollout; merging without "
                            "their candidates", ", ".join(late), bound)  # fmt: skip
        checks = self.checks
        if checks is not None and checks.sample is not None:
            sample, version = checks.sample, self.state.policy_version

            def refresh() -> None:  # under the policy just trained: nothing trains before it
                with self.lock:
                    sample.refresh(self.model, samples, version)

            checks.refresh_when_needed(refresh)
        published = self.registry.merge_candidates(
            self.model, target_id=self.spec.model.path, gate=checks
        )
        if published is not None:
            self.state.drafter_version = published.version
            if checks is not None:
                checks.initial = None  # the current version is a published one from now on
        if checks is not None:  # the data of the windows trained from the version now latest
            checks.ledger.record_step(self.registry.latest_version(), samples)
        return time.monotonic() - t0

    def _book_sync(self, seconds: float) -> None:
        """Book the publish just made: its wall ``seconds`` and the publisher's phases
        (:attr:`last_sync`, from the manifest; None from a publisher that does not time them)."""
        self.syncs.published(self.state.policy_version, seconds, self.last_sync)

    def _handed_out(self, out: RolloutOutcome) -> None:
        """Book each worker's answer tokens to the drafter version they were generated with,
        and its load of the policy version (``syncbook.py``: the rollout pause it saw)."""
        self.syncs.replied(out.replies)
        if self.checks is not None and self.registry is not None:
            self.checks.ledger.record_rollout(self.registry.latest_version(), out.replies)

    def _row(self, step: int, out: RolloutOutcome, rewards: list[float], correct: list[bool],
             stats: dict[str, float], train_s: float, sync_s: float) -> StepRow:  # fmt: skip
        lengths = [len(s.output_token_ids) for s in out.samples]
        group = self.spec.algorithm.group_size
        prompt_lengths = [len(s.prompt_token_ids) for s in out.samples[::group]]
        eng = [r.engine for r in out.replies]
        worker_seconds: dict[str, float] = {}
        for reply in out.replies:  # a worker answers more than once after a re-dispatch
            seconds = reply.engine.seconds
            worker_seconds[reply.worker] = worker_seconds.get(reply.worker, 0.0) + seconds
        tokens = sum(e.tokens for e in eng)
        sd_tokens = sum(e.sd_tokens for e in eng)
        rows = sum(e.accepted_rows for e in eng)
        acc_len = sum(e.mean_accepted_length * e.accepted_rows for e in eng)
        fractions, lengths_by_source = source_figures(eng)
        return StepRow(
            step=step,
            policy_version=self.state.policy_version,
            drafter_version=self.state.drafter_version,
            reward_mean=float(np.mean(rewards)),
            reward_std=float(np.std(rewards)),
            accuracy=float(np.mean(correct)),
            answers=len(out.samples),
            mean_length=float(np.mean(lengths)),
            max_length=int(max(lengths)),
            rollout_s=out.seconds,
            tail_s=out.seconds - out.first_done_s,
            sd_fraction=sd_tokens / tokens if tokens else 0.0,
            mean_accepted_length=acc_len / rows if rows else 0.0,
            sd_fraction_by_source=fractions,
            accepted_length_by_source=lengths_by_source,
            redispatched=out.redispatched,
            failed_workers=sorted(out.failed_workers),
            rollout_workers=out.workers_present,
            train=dict(stats),
            trainer_harvested_s=None if self.harvest is None else self._trainer_harvested_s,
            train_s=train_s,
            sync_s=sync_s,
            step_s=0.0,  # set by one_step once the step is over
            worker_generate_s=worker_seconds,
            response_lengths=lengths,
            prompt_lengths=prompt_lengths,
            answer_spec_steps=[s.spec_steps for s in out.samples],
            answer_accepted_drafts=[s.accepted_tokens for s in out.samples],
            answer_ids=[s.request_id or "" for s in out.samples],
            answer_workers=list(out.answered_by),
        )

    # --- eval and checkpoints ---------------------------------------------------------------

    def evaluate(self) -> float:
        """Greedy accuracy on the eval set and, with ``algorithm.evalSamples`` > 0, the sampled
        accuracy (share of correct answers among that many per prompt, sampled at the rollout
        temperature and top-p with fixed seeds); one rollout on the workers (SD included).
        Returns the greedy one."""
        algo, n = self.spec.algorithm, len(self.eval_set)
        budget = self.config.eval_max_new_tokens or algo.max_new_tokens
        prompts = [self._encode(ex) for ex in self.eval_set]
        reqs = [
            GenerationRequest(p, budget, temperature=0.0, stop_token_ids=self._eos,
                              request_id=f"eval-{i}")
            for i, p in enumerate(prompts)
        ]  # fmt: skip
        reqs += [
            GenerationRequest(p, budget, temperature=algo.temperature, top_p=algo.top_p,
                              seed=answer_seed(algo.seed, EVAL_SEED_STEP, i, j),
                              stop_token_ids=self._eos, request_id=f"eval-{i}-{j}")
            for j in range(algo.eval_samples) for i, p in enumerate(prompts)
        ]  # fmt: skip
        out = self.pool.run(reqs, self.state.step, self.state.policy_version, self.stop)
        self._handed_out(out)
        answered = list(self.eval_set) * (1 + algo.eval_samples)
        rewards, correct = self._score(out.samples, answered)
        acc = float(np.mean(correct[:n]))
        sampled = float(np.mean(correct[n:])) if algo.eval_samples else None
        self.state.eval_accuracy, self.state.eval_sampled_accuracy = acc, sampled
        self._write_eval(out.samples, correct, rewards, n)
        log.info("step %d: eval accuracy greedy %.3f, sampled %s", self.state.step, acc,
                 "-" if sampled is None else f"{sampled:.3f}")  # fmt: skip
        return acc

    def _write_eval(self, samples: Sequence[Sample], correct: Sequence[bool],
                    rewards: Sequence[float], n: int) -> None:  # fmt: skip
        """``eval/step-N.jsonl``: greedy answers (``i``), then sampled ones (``i``, ``sample``)."""
        import json

        d = self.config.run_dir / "eval"
        d.mkdir(parents=True, exist_ok=True)
        texts = self.tok.batch_decode(
            [s.output_token_ids for s in samples], skip_special_tokens=True
        )
        lines = []
        for k, (t, c, r) in enumerate(zip(texts, correct, rewards, strict=True)):
            row = {"i": k % n, "correct": c, "reward": r, "output": t}
            lines.append(json.dumps(row if k < n else {**row, "sample": k // n - 1}))
        (d / f"step-{self.state.step:06d}.jsonl").write_text("\n".join(lines) + "\n")

    def checkpoint(self) -> Path:
        prev = self.state.phase
        self.state.phase = "checkpointing"
        try:
            with self.lock:
                published = self._published
                version = self.state.policy_version
                path = self.policy.save(
                    self.config.checkpoint_dir,
                    step=self.state.step,
                    model_sha256=(
                        published.content_sha256()
                        if published and published.version == version
                        else None
                    ),
                    policy_version=version,
                    drafter_version=self.state.drafter_version,
                    keep_last=self.spec.checkpoint.keep_last,
                    extra={
                        "eval_accuracy": self.state.eval_accuracy,
                        "eval_sampled_accuracy": self.state.eval_sampled_accuracy,
                    },
                )
                self.state.last_checkpoint_step = self.state.step
        finally:
            self.state.phase = prev
        return path
