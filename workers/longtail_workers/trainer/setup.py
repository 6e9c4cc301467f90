"""Building the trainer's :class:`~longtail_workers.trainer.driver.StepDriver` from a job spec.

Called once by ``trainer/service.py``: policy and tokenizer (``load_policy``), train and eval
datasets (``resolve_dataset``), the rollout pool and verifier client from the command line, the
weight publisher (HTTP server, or torch.distributed rank 0 with ``--weight-sync dist``) and the
drafter registry (``--drafters``; the trainer's HTTP port serves it to the rollout workers,
``spot/remote.py``) and, when the job makes the trainer a harvest target
(``trainer/harvest.py``), the trainer's own drafter training. Returns the driver and a function
that stops the publisher.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from longtail_api.spec import RLJobSpec
from longtail_workers.data import resolve_dataset
from longtail_workers.data.loader import DEFAULT_BUILTIN_TRAIN_SIZE
from longtail_workers.models.loading import load_policy
from longtail_workers.runtime import init_dist
from longtail_workers.spot.publish import DrafterRegistry
from longtail_workers.trainer.dispatch import RolloutPool
from longtail_workers.trainer.driver import DriverConfig, StepDriver
from longtail_workers.trainer.harvest import (
    TrainerHarvest,
    build_trainer_harvest,
    trainer_harvest_enabled,
)
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


def make_publisher(
    args: argparse.Namespace, keep_last: int
) -> tuple[WeightPublisher, Callable[[], None]]:
    if args.weight_sync == "dist":
        from longtail_workers.weights.dist_sync import DistWeightPublisher

        init_dist(args.dist_init, 0, args.dist_world, timeout_s=300.0)
        return DistWeightPublisher(), lambda: None
    from longtail_workers.weights.http_sync import WeightServer

    server = WeightServer(args.host, args.weights_port, keep_last=keep_last).start()
    return server, server.stop


def build_driver(
    spec: RLJobSpec, args: argparse.Namespace, run_dir: Path, ckpt_dir: Path
) -> tuple[StepDriver, Callable[[], None]]:
    algo = spec.algorithm
    model, tokenizer = load_policy(spec.model.path, dtype=spec.model.dtype)
    size = max(DEFAULT_BUILTIN_TRAIN_SIZE, algo.prompts_per_step * algo.total_steps)
    train = resolve_dataset(spec.dataset, "train", seed=algo.seed, builtin_train_size=size)
    evals = resolve_dataset(spec.dataset, "eval", seed=algo.seed)
    pool = RolloutPool(parse_rollouts(args.rollout), timeout_s=args.rollout_timeout)
    verifier = VerifierClient(args.verifier_url)
    publisher, stop_publisher = make_publisher(args, keep_last=3)
    registry = DrafterRegistry(args.drafters) if args.drafters else None
    run_dir.mkdir(parents=True, exist_ok=True)
    driver = StepDriver(
        spec, model, tokenizer, train, evals, pool, verifier, publisher,
        DriverConfig(run_dir=run_dir, checkpoint_dir=ckpt_dir), registry=registry,
        harvest=_trainer_harvest(spec, model, registry),
    )  # fmt: skip
    pool.on_assign = lambda name, busy: (
        driver.state.pending_workers.add(name)
        if busy
        else driver.state.pending_workers.discard(name)
    )
    return driver, stop_publisher


def _trainer_harvest(
    spec: RLJobSpec, model: Any, registry: DrafterRegistry | None
) -> TrainerHarvest | None:
    """The trainer's own drafter training when the job asks for it (else None)."""
    if not trainer_harvest_enabled(spec):
        return None
    if registry is None:
        log.warning(
            "harvest.eligibleRoles has 'trainer' but this trainer keeps no drafter registry; "
            "start it with --drafters DIR (the operator and longtail run do) to harvest it"
        )
        return None
    log.info("trainer harvest on: the trainer trains the drafter while it waits for rollouts")
    return build_trainer_harvest(spec, model, registry)
