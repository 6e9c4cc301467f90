"""Building the trainer's :class:`~longtail_workers.trainer.driver.StepDriver` from a job spec.

Called once by ``trainer/service.py``: policy and tokenizer (``load_policy``), train and eval
datasets (``resolve_dataset``; :func:`check_context` fails at once when the longest prompt
plus ``algorithm.maxNewTokens`` does not fit the model), the rollout pool and verifier client
from the command line (in a pod the pool follows the job's live ``spec.rollout.replicas``,
``trainer/membership.py``), the weight publisher (:func:`make_publisher`: the HTTP server, and the
broadcast to the rollout workers with ``--weight-sync broadcast``) and the drafter registry
(``--drafters``; the trainer's HTTP port serves it to the rollout workers,
``drafter/exchange.py``; candidates are checked against the job's drafter,
``drafter/vetting.py``, and weighed and scored by the trainer at the merge,
``trainer/candidate_checks.py``) and, when the job makes the trainer a harvest target
(``trainer/drafter_window.py``), the trainer's own drafter training. Returns the driver and a
function that stops the publisher. On a sharded trainer (``trainer/world.py``) this runs on rank
0 only, after the group is joined: the policy is loaded and sharded on every rank
(``trainer/policy.py``), and the driver reaches the followers through
:class:`~longtail_workers.trainer.group.PolicyLeader`.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from longtail_api.context import context_error
from longtail_api.podenv import WEIGHT_SPOOL_DIR
from longtail_api.spec import RLJobSpec
from longtail_workers.data import Example, format_example, resolve_dataset
from longtail_workers.data.loader import DEFAULT_BUILTIN_TRAIN_SIZE
from longtail_workers.drafter.checkpoint import DrafterMismatchError
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.registry import DrafterRegistry
from longtail_workers.drafter.vetting import DrafterReference
from longtail_workers.runtime import initial_drafter
from longtail_workers.trainer.candidate_checks import (
    CandidateChecks,
    HeldoutSample,
    WindowLedger,
)
from longtail_workers.trainer.dispatch import RolloutPool
from longtail_workers.trainer.drafter_window import (
    TrainerHarvestee,
    build_trainer_harvest,
    trainer_harvest_enabled,
)
from longtail_workers.trainer.driver import DriverConfig, StepDriver
from longtail_workers.trainer.group import CommandChannel, PolicyLeader
from longtail_workers.trainer.liveness import Liveness
from longtail_workers.trainer.membership import spec_membership
from longtail_workers.trainer.policy import build_policy
from longtail_workers.trainer.world import TrainerWorld
from longtail_workers.verifier.client import VerifierClient
from longtail_workers.weights.sync import WeightPublisher

log = logging.getLogger(__name__)


def parse_rollouts(items: list[str]) -> dict[str, str]:
    """``["rollout-0=http://...", ...]`` -> ``{name: url}``."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not name or not url.startswith("http"):
            raise ValueError(f"--rollout {item!r}: expected NAME=http://HOST:PORT")
        if name in out:
            raise ValueError(f"--rollout: worker name {name!r} given twice")
        out[name] = url.rstrip("/")
    return out


def weight_spool(args: argparse.Namespace, spec: RLJobSpec) -> Path | None:
    """Where the served versions are mapped from (created): ``--weight-spool-dir``, else
    ``RUN_DIR/weight-spool`` when ``spec.weightSync.hostCopy`` is ``spool``; None (anonymous
    memory) for ``--weight-spool-dir memory`` or ``hostCopy: memory`` (the default)."""
    if args.weight_spool_dir == "memory":
        return None
    if args.weight_spool_dir is None and spec.weight_sync.host_copy == "memory":
        return None
    spool = Path(args.weight_spool_dir or Path(args.run_dir) / WEIGHT_SPOOL_DIR)
    spool.mkdir(parents=True, exist_ok=True)
    return spool


def make_publisher(
    args: argparse.Namespace, spec: RLJobSpec, keep_last: int, world: TrainerWorld | None = None
) -> tuple[WeightPublisher, Callable[[], None]]:
    """The trainer's weight publisher (its :class:`~longtail_workers.weights.store.WeightStore`)
    and its stop function. The store's HTTP delivery, the weight server, always runs
    (``--weights-port``): it is the ``http`` transport, and with ``broadcast`` (the job's plan,
    ``weights.plan.sync_plan``: ``--weight-sync``, else the job's ``spec.weightSync``) the
    catch-up path of new, restarted or dropped rollout workers and of drafter workers; the
    broadcast is the store's second delivery. Only rank 0 publishes; on a sharded trainer its
    tensor stream is a gather every rank joins (``world`` needs nothing else here)."""
    from longtail_workers.weights.http_sync import WeightServer
    from longtail_workers.weights.plan import sync_plan
    from longtail_workers.weights.store import WeightStore

    plan = sync_plan(spec, args.weight_sync)
    spool = weight_spool(args, spec)
    store = WeightStore(keep_last=keep_last, spool_dir=spool)
    WeightServer(store, args.host, args.weights_port).start()
    where = f"mapped from files in {spool}" if spool else "in the trainer's memory"
    log.info("the served policy versions (up to %d) are kept %s", keep_last + 1, where)
    if plan.transport == "http":
        return store, store.close
    from longtail_workers.weights.broadcast import Broadcast
    from longtail_workers.weights.membership import sync_port

    config = plan.broadcast
    try:
        broadcast = Broadcast(sync_port(args.weight_sync_port), config)
    except (RuntimeError, ValueError):
        store.close()
        raise
    store.attach(broadcast)
    log.info(
        "weight sync: broadcast (%s, %d MiB buckets, %gs phase timeout), rendezvous on port %d",
        "NCCL" if config.device == "cuda" else "gloo", config.bucket_bytes >> 20,
        config.phase_timeout_s, broadcast.port,
    )  # fmt: skip
    return store, store.close


def build_driver(
    spec: RLJobSpec,
    args: argparse.Namespace,
    run_dir: Path,
    ckpt_dir: Path,
    world: TrainerWorld | None = None,
) -> tuple[StepDriver, Callable[[], None]]:
    """The driver of rank 0 (``world``: the trainer group it leads; None: world 1)."""
    algo, world = spec.algorithm, world or TrainerWorld()
    policy, tokenizer = build_policy(spec, world)
    leader = PolicyLeader(policy, CommandChannel(world) if world.sharded else None)
    model = policy.model
    size = max(DEFAULT_BUILTIN_TRAIN_SIZE, algo.prompts_per_step * algo.total_steps)
    train = resolve_dataset(spec.dataset, "train", seed=algo.seed, builtin_train_size=size)
    evals = resolve_dataset(spec.dataset, "eval", seed=algo.seed)
    check_context(spec, model, tokenizer, [*train, *evals])
    workers = parse_rollouts(args.rollout)
    pool = RolloutPool(
        workers,
        timeout_s=args.rollout_timeout,
        liveness=Liveness(unresponsive_s=spec.rollout.unresponsive_seconds),
        wait_s=spec.rollout.below_min_grace_seconds,  # no live worker: wait, as the job does
        membership=spec_membership(args.job, workers, os.environ),
    )
    verifier = VerifierClient(args.verifier_url)
    publisher, stop_publisher = make_publisher(args, spec, keep_last=3, world=world)
    registry, checks, harvest = drafter_parts(spec, model, args.drafters, world)
    run_dir.mkdir(parents=True, exist_ok=True)
    driver = StepDriver(
        spec, model, tokenizer, train, evals, pool, verifier, publisher,
        DriverConfig(run_dir=run_dir, checkpoint_dir=ckpt_dir), registry=registry,
        harvest=harvest, checks=checks, policy=leader,
    )  # fmt: skip
    pool.on_assign = lambda name, busy: (
        driver.state.pending_workers.add(name)
        if busy
        else driver.state.pending_workers.discard(name)
    )
    return driver, stop_publisher


def drafter_parts(
    spec: RLJobSpec, model: Any, drafters: str | None, world: TrainerWorld
) -> tuple[DrafterRegistry | None, CandidateChecks | None, TrainerHarvestee | None]:
    """The drafter registry (``--drafters``; None without), the checks its candidates go
    through and the trainer's own harvest, all from one build of the job's initial drafter
    (a ``builtin:`` one may be fitted on the way)."""
    registry = checks = initial = None
    if drafters:
        initial = job_drafter(spec, model)
        reference = None if initial is None else DrafterReference.of(initial)
        registry = DrafterRegistry(drafters, reference=reference)
        # A sharded policy's forward pass needs every rank: no held-out sample there.
        sample = None if world.sharded else HeldoutSample(spec.drafter_training)
        checks = CandidateChecks(WindowLedger(), sample, initial)
    return registry, checks, _trainer_harvest(spec, model, registry, world, initial)


def job_drafter(spec: RLJobSpec, model: Any) -> EagleDrafter | None:
    """The job's initial drafter on ``model``: every candidate must match it
    (``drafter/vetting.py``), and the first merge's candidates are judged against it
    (``candidate_checks.py``). None, with a warning, when this trainer cannot read
    ``drafterTraining.initialDrafter`` (a path mounted on the rollout pods only): candidates are
    then checked against each other at the merge, and at upload for a readable, non-empty,
    finite weights file."""
    try:
        drafter: EagleDrafter = initial_drafter(spec, model, spec.model.path)
    except (DrafterMismatchError, OSError) as exc:
        log.warning(
            "drafter candidates are not checked against the job's drafter: %s (mount "
            "drafterTraining.initialDrafter on the trainer too)",
            exc,
        )
        return None
    return drafter


def check_context(spec: RLJobSpec, model: Any, tokenizer: Any, examples: Sequence[Example]) -> None:
    """Fail at start, naming ``spec.algorithm.maxNewTokens`` and the fix, when the job's longest
    prompt plus ``maxNewTokens`` does not fit the model's context (``longtail_api.context``);
    otherwise every rollout worker would refuse the first step's generate calls."""
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions is None or not examples:
        return
    template = spec.dataset.apply_chat_template
    longest = max(
        len(tokenizer.encode(format_example(tokenizer, ex, template), add_special_tokens=False))
        for ex in examples
    )
    error = context_error(spec.algorithm.max_new_tokens, int(positions), spec.model.path, longest)
    if error is not None:
        raise ValueError(str(error))


def _trainer_harvest(
    spec: RLJobSpec,
    model: Any,
    registry: DrafterRegistry | None,
    world: TrainerWorld,
    initial: EagleDrafter | None,
) -> TrainerHarvestee | None:
    """The trainer's own drafter training when the job asks for it (else None)."""
    if not trainer_harvest_enabled(spec):
        return None
    if world.sharded:
        # Its forward passes through the policy would be collectives the followers never join;
        # the spec rules refuse this job (rules._harvest), so only a hand-made spec gets here.
        raise ValueError(
            f"harvest.eligibleRoles has 'trainer' but the trainer is sharded over {world.size} "
            "ranks: remove 'trainer' from harvest.eligibleRoles or use one trainer rank"
        )
    if registry is None:
        log.warning(
            "harvest.eligibleRoles has 'trainer' but this trainer keeps no drafter registry; "
            "start it with --drafters DIR (the operator and longtail run do) to harvest it"
        )
        return None
    if initial is None:
        raise ValueError(
            "harvest.eligibleRoles has 'trainer' but this trainer cannot read "
            f"drafterTraining.initialDrafter={spec.drafter_training.initial_drafter!r}: mount it "
            "on the trainer too or remove 'trainer' from harvest.eligibleRoles"
        )
    log.info("trainer harvest on: the trainer trains the drafter while it waits for rollouts")
    # A copy: the harvest trains its drafter in place; the checks keep the job's drafter.
    return build_trainer_harvest(spec, model, registry, copy.deepcopy(initial))
