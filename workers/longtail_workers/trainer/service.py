"""``longtail worker trainer``: the trainer process (GRPO updates + the step driver).

The CLI routes ``longtail worker trainer ARGS...`` to :func:`main`; ``longtail run`` starts it once.
It loads the policy and the datasets, serves policy versions to the rollout workers (its
:class:`~longtail_workers.weights.store.WeightStore`, served over HTTP on ``--weights-port`` and,
with ``broadcast``, also broadcast from rank 0), waits for the verifier and the rollout workers to
be healthy (every listed one; in a pod, whose list follows the job's ``spec.rollout.replicas``,
``minReplicas`` of them: ``trainer/membership.py``), then runs
:class:`~longtail_workers.trainer.driver.StepDriver`. Its own HTTP surface (``--port``):
``GET /v1/status`` (:class:`longtail_api.workerapi.TrainerStatus`), ``POST /v1/checkpoint``
(checkpoint now, answer when it is on disk), ``PUT /v1/role`` (``train``, or ``drafter-train``
during a rollout when the trainer is a harvest target, ``trainer/drafter_window.py``; the same
answers as a rollout worker's, ``spot/cycle.py``: 200/202 with the acknowledged role, 409 refused
now, 400 malformed), ``GET /metrics``, ``/healthz``, ``/readyz``, and with ``--drafters DIR`` the
drafter exchange ``/v1/drafters/...`` (``drafter/exchange.py``: rollout workers fetch published
drafter versions and upload their candidates, which the step driver merges from DIR),
``GET /v1/samples/latest[?after=N]`` (the last completed step's answers, for the dedicated drafter
workers: ``wire/samples.py``). Per-step rows go to ``RUN_DIR/metrics.jsonl``. Every write endpoint
(``POST /v1/checkpoint``, ``PUT /v1/role``, candidate uploads) requires the job's token, and the
trainer refuses to start without one unless ``--insecure-no-auth`` (``longtail_workers.auth``); its
own generate, role and verify calls carry it. SIGTERM/SIGINT: stop at the next safe point,
checkpoint the last completed step, exit 0. Exit 1 when the run fails (the error is logged and
reported in the status).

A sharded trainer (``trainer.replicas`` pods x ranks per pod): the entrypoint reads the
:class:`~longtail_api.rendezvous.TrainerRendezvous` from the environment (none: world 1, as
before). A pod with several ranks starts one process per rank (``trainer/ranks.py``); rank 0 is
everything above and leads the policy operations (``trainer/group.py``), the other ranks only
follow them (:func:`~longtail_workers.trainer.ranks.run_follower`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from http import HTTPStatus
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry
from starlette.routing import Route

from longtail_api import metrics as names
from longtail_api.policies import DRAFT_SOURCES
from longtail_api.protocol import ProtocolError
from longtail_api.rendezvous import TrainerRendezvous
from longtail_api.spec import RLJobSpec
from longtail_api.steprow import METRICS_FILE, SYNC_PHASES, StepRow
from longtail_api.wirecodec import to_wire
from longtail_api.workerapi import (
    CHECKPOINT_PATH,
    ROLE_PATH,
    STATUS_PATH,
    TRAINER_ACTIVITIES,
    CheckpointAnswer,
    RoleAck,
    RoleState,
    StepSeconds,
    TrainerStatus,
)
from longtail_workers.auth import AuthConfigError, add_auth_args, server_token
from longtail_workers.drafter.exchange import DrafterEndpoints, drafter_routes
from longtail_workers.drafter.refusals import Refusal
from longtail_workers.httpclient import request
from longtail_workers.httprequest import JSONRequestHandler, fail
from longtail_workers.httpserver import BackgroundHTTPServer, probe_routes, route
from longtail_workers.jobspec import load_job_spec
from longtail_workers.metricspec import counter_from_spec, gauge_from_spec, histogram_from_spec
from longtail_workers.runtime import add_weight_sync_args, role_device, torch_threads
from longtail_workers.signals import install_stop_signals
from longtail_workers.spot.cycle import RoleConflictError, answer_put_role, check_activity
from longtail_workers.tracking import trainer_side as tracking
from longtail_workers.tracking.sink import Tracker
from longtail_workers.tracking.trainer_side import TrackingMetrics
from longtail_workers.trainer.checkpoint import latest_checkpoint
from longtail_workers.trainer.dispatch import RolloutFailed
from longtail_workers.trainer.drafter_artifact import EXPORT_DIR, drafter_artifact
from longtail_workers.trainer.drafter_window import (
    TRAIN,
    WORKER_NAME,
    TrainerHarvestee,
)
from longtail_workers.trainer.driver import StepDriver
from longtail_workers.trainer.membership import wait_for_rollout
from longtail_workers.trainer.ranks import launch_local_ranks, local_rank_of, run_follower
from longtail_workers.trainer.world import TrainerWorld, join_world
from longtail_workers.wire.samples import SAMPLES_PATH, StepSamples, parse_after

log = logging.getLogger(__name__)
LISTENING_PREFIX = "longtail trainer listening on "
CHECKPOINT_JOIN_S = 900.0
"""Longest a ``POST /v1/checkpoint`` waits for the checkpoint another request is writing
(then 503: retry)."""


class TrainerMetrics:
    """The trainer's Prometheus series (names from ``longtail_api.metrics``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.step = gauge_from_spec(names.TRAINER_STEP, r)
        self.last_step = gauge_from_spec(names.TRAINER_LAST_STEP_TIMESTAMP, r)
        self.step_seconds = histogram_from_spec(names.TRAINER_STEP_SECONDS, r)
        self.stage = histogram_from_spec(names.TRAINER_STAGE_SECONDS, r)
        self.reward = gauge_from_spec(names.TRAINER_REWARD_MEAN, r)
        self.accuracy = gauge_from_spec(names.TRAINER_ACCURACY, r)
        self.policy = gauge_from_spec(names.TRAINER_POLICY_VERSION, r)
        self.sd_fraction = gauge_from_spec(names.TRAINER_SD_FRACTION, r)
        self.accepted_length = gauge_from_spec(names.TRAINER_ACCEPTED_LENGTH, r)
        self.harvested = counter_from_spec(names.TRAINER_HARVESTED_SECONDS_TOTAL, r)
        self.rejected = counter_from_spec(names.TRAINER_DRAFTER_CANDIDATES_REJECTED_TOTAL, r)
        self.sync_seconds = histogram_from_spec(names.WEIGHT_SYNC_SECONDS, r)
        self.sync_bytes = gauge_from_spec(names.WEIGHT_SYNC_BYTES, r)
        self.sync_rate = gauge_from_spec(names.WEIGHT_SYNC_BYTES_PER_SECOND, r)
        self.tracking = TrackingMetrics(r)
        self.last_step.set(time.time())

    def observe(self, row: StepRow) -> None:
        self.step.set(row.step)
        self.last_step.set(time.time())
        self.step_seconds.observe(row.step_s)
        self.stage.labels(stage="rollout").observe(row.rollout_s - row.tail_s)
        self.stage.labels(stage="tail").observe(row.tail_s)
        self.stage.labels(stage="train").observe(row.train_s)
        self.stage.labels(stage="sync").observe(row.sync_s)
        self.reward.set(row.reward_mean)
        self.accuracy.set(row.accuracy)
        self.policy.set(row.policy_version)
        # Every source each step (0 when it drafted nothing), so no gauge holds a stale step.
        for source in sorted({*DRAFT_SOURCES, *row.sd_fraction_by_source}):
            self.sd_fraction.labels(source=source).set(row.sd_fraction_by_source.get(source, 0))
            length = row.accepted_length_by_source.get(source, 0.0)
            self.accepted_length.labels(source=source).set(length)
        self.harvested.inc(row.trainer_harvested_s or 0.0)  # None when harvest is off
        self._observe_sync(row)

    def _observe_sync(self, row: StepRow) -> None:
        """The weight sync of the version the row's rollout used (each version in one row)."""
        if row.sync_version is None:
            return
        transport = row.sync_transport or "unknown"
        for phase in SYNC_PHASES:
            seconds = getattr(row, f"sync_{phase}_s")
            if seconds is not None:  # not timed by this publisher, or no worker loaded it yet
                self.sync_seconds.labels(phase=phase, transport=transport).observe(seconds)
        if row.sync_bytes is not None:
            self.sync_bytes.labels(transport=transport).set(row.sync_bytes)
        if row.sync_gb_per_s is not None:
            self.sync_rate.labels(transport=transport).set(row.sync_gb_per_s * 1e9)

    def candidate_rejected(self, refusal: Refusal) -> None:
        """``DrafterRegistry.on_rejected``: count a refused drafter candidate (the registry
        logged it), by stage and reason."""
        self.rejected.labels(stage=refusal.stage, reason=refusal.reason).inc(refusal.candidates)


class TrainerApp(BackgroundHTTPServer):
    """Status / checkpoint / metrics surface of the trainer, and the drafter exchange."""

    service = "trainer"
    thread_name = "trainer-http"
    started_log = "trainer listening on %s"

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port, request_timeout_s=60.0)
        self.driver: StepDriver | None = None
        self.metrics = TrainerMetrics()
        self.failed: str | None = None
        self.drafters: DrafterEndpoints | None = None
        """Set once the driver's drafter registry exists (``--drafters``)."""
        self.harvest: TrainerHarvestee | None = None
        """The trainer's own drafter training (set when the job makes it a harvest target)."""
        self.tracker: Tracker | None = None
        """The experiment trackers of ``spec.tracking`` (``tracking/``)."""
        self.started = time.time()
        self.stop_requested: threading.Event | None = None
        """Set when the trainer is asked to stop (SIGTERM, Ctrl-C): it is no longer ready."""
        self._checkpointing: Future[CheckpointAnswer] | None = None
        """The checkpoint ``POST /v1/checkpoint`` is writing now (others join it)."""
        self._checkpoint_lock = threading.Lock()

    def unready(self) -> str | None:
        """Why ``/readyz`` says 503 (None: ready). Ready once the policy is loaded and the
        weight server serves (both happen in ``build_driver``, before :attr:`driver` is set),
        until it fails or is asked to stop."""
        if self.failed is not None:
            return f"training failed: {self.failed}"
        asked = self.stop_requested is not None and self.stop_requested.is_set()
        if asked or self.stopping:  # a stop asked for, or the server shutting down
            return "stopping"
        if self.driver is None:
            return "starting: loading the policy and starting its weight server"
        return None

    def role(self) -> RoleState:
        if self.harvest is not None:
            return self.harvest.role.activity()
        return RoleState(TRAIN, TRAIN, self.started)

    def set_role(self, role: object) -> RoleAck:
        """``PUT /v1/role``: the harvest's answer, or ``train`` only when it is off."""
        if self.harvest is not None:
            return self.harvest.role.set_role(role)
        started = time.perf_counter()
        if check_activity(role, TRAINER_ACTIVITIES, "the trainer") != TRAIN:
            raise RoleConflictError(
                "trainer harvesting is off: it needs harvest.enabled, drafterTraining.enabled, "
                "'trainer' in harvest.eligibleRoles and a drafter registry (--drafters DIR)"
            )
        return RoleAck(TRAIN, TRAIN, self.started, False, time.perf_counter() - started)

    def samples(self, query: str) -> StepSamples:
        """``GET /v1/samples/latest[?after=N]``: 503 while starting, 400 for a bad ``after``."""
        try:
            after = parse_after(query)
        except ProtocolError as exc:
            fail(HTTPStatus.BAD_REQUEST, str(exc))
        d = self.driver
        if d is None:
            fail(HTTPStatus.SERVICE_UNAVAILABLE, "trainer still starting (loading); retry")
        latest = d.latest_samples or StepSamples(d.state.step, d.state.policy_version)
        return latest.after(after)

    def status(self) -> TrainerStatus:
        d = self.driver
        if d is None:
            return TrainerStatus(0, 0, "running", 0, -1, message="starting", role=self.role())
        st, row = d.state, d.state.last_row
        started = st.rollout_started if st.rollout_active else None
        seconds = None
        if row is not None:
            seconds = StepSeconds(row.rollout_s, row.tail_s, row.train_s, row.sync_pause_s,
                                  row.sync_gb_per_s)  # fmt: skip
        phase = "failed" if self.failed else st.phase
        return TrainerStatus(
            step=st.step,
            total_steps=st.total_steps,
            phase=phase,  # type: ignore[arg-type]
            policy_version=st.policy_version,
            drafter_version=st.drafter_version,
            reward_mean=None if row is None else row.reward_mean,
            accuracy=None if row is None else row.accuracy,
            accepted_length=None if row is None else row.mean_accepted_length,
            acceptance_collapsed=row is not None and row.acceptance_collapsed,
            last_checkpoint_step=st.last_checkpoint_step,
            step_seconds=seconds,
            message=self.failed or st.message,
            eval_accuracy=st.eval_accuracy,
            eval_sampled_accuracy=st.eval_sampled_accuracy,
            sd_fraction=None if row is None else row.sd_fraction,
            rollout_active=st.rollout_active,
            pending_workers=tuple(sorted(st.pending_workers)),
            answers_done=st.answers_done,
            answers_total=st.answers_total,
            role=self.role(),
            idle_since=started,
            idle_seconds=None if started is None else max(0.0, time.time() - started),
            harvested_seconds=0.0 if self.harvest is None else self.harvest.role.harvested_seconds,
            drafter_training=None if self.harvest is None else self.harvest.status(),
            figures_step=None if row is None else row.step,
            worker_policy_versions=d.syncs.held_versions(),
            drafter_merges=None if self.drafters is None else self.drafters.registry.merges(),
            sd_fraction_by_source={} if row is None else dict(row.sd_fraction_by_source),
            accepted_length_by_source={} if row is None else dict(row.accepted_length_by_source),
            tracking_failing={} if self.tracker is None else self.tracker.failing(),
        )

    def routes(self) -> list[Route]:
        def status(handler: JSONRequestHandler) -> None:
            handler.send_json(HTTPStatus.OK, to_wire(self.status()))

        def samples(handler: JSONRequestHandler) -> None:
            handler.send_json(HTTPStatus.OK, to_wire(self.samples(handler.query)))

        def role(handler: JSONRequestHandler) -> None:
            answer_put_role(handler, WORKER_NAME, self.set_role, 64 * 1024)

        return [
            *probe_routes(self.unready, self.metrics.registry),
            route(STATUS_PATH, status, "GET"),
            route(ROLE_PATH, role, "PUT"),
            route(SAMPLES_PATH, samples, "GET"),
            route(CHECKPOINT_PATH, self._checkpoint, "POST"),
            *drafter_routes(self._exchange),
        ]

    def _checkpoint(self, handler: JSONRequestHandler) -> None:
        """``POST /v1/checkpoint``: checkpoint now; the answer goes once it is on disk. A request
        that arrives while one is being written (the operator asks again after a restart, or
        after its call timed out) gets that checkpoint's answer: one write, never two."""
        driver = self.driver
        if driver is None:
            fail(HTTPStatus.SERVICE_UNAVAILABLE, "trainer still starting; retry")
        with self._checkpoint_lock:
            running, mine = self._checkpointing, self._checkpointing is None
            if running is None:
                running = self._checkpointing = Future()
        if mine:
            try:
                where = driver.checkpoint()
                running.set_result(CheckpointAnswer(driver.state.step, str(where)))
            except BaseException as exc:  # the joined requests fail with it (500), as this one
                running.set_exception(exc)
                raise
            finally:
                with self._checkpoint_lock:
                    self._checkpointing = None
        try:
            answer = running.result(timeout=CHECKPOINT_JOIN_S)
        except FutureTimeout:
            fail(HTTPStatus.SERVICE_UNAVAILABLE, "a checkpoint is still being written; retry")
        handler.send_json(HTTPStatus.OK, to_wire(answer))

    def _exchange(self) -> DrafterEndpoints:
        """The drafter exchange; 503 while the trainer loads, 404 when it keeps no registry."""
        if self.drafters is not None:
            return self.drafters
        if self.driver is None:
            fail(HTTPStatus.SERVICE_UNAVAILABLE, "trainer still starting (loading); retry")
        fail(
            HTTPStatus.NOT_FOUND,
            "this trainer keeps no drafter registry; start it with --drafters DIR "
            "(the operator does when drafterTraining is enabled)",
        )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="longtail worker trainer", description=__doc__.split("\n")[0])
    ap.add_argument("--job", required=True, help="RLJob YAML file")
    ap.add_argument("--run-dir", required=True, help="metrics, eval outputs, drafters")
    ap.add_argument("--checkpoint-dir", default=None, help="default: RUN_DIR/<checkpoint.location>")
    ap.add_argument("--rollout", action="append", default=[], metavar="NAME=URL", required=True)
    ap.add_argument("--verifier-url", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8300)
    ap.add_argument("--weights-port", type=int, default=8301)
    ap.add_argument(
        "--weight-spool-dir",
        default=None,
        help="local directory the trainer's copies of the served policy versions are mapped "
        "from (page cache, not the trainer's own memory; room for 4 versions); 'memory' keeps "
        "them in the trainer's memory (default: spec.weightSync.hostCopy, memory or "
        "RUN_DIR/weight-spool)",
    )
    ap.add_argument(
        "--drafters",
        default=None,
        help="drafter registry directory: merged here, served to rollout workers on --port",
    )
    ap.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: trainer.resources.cpu)",
    )
    ap.add_argument("--rollout-timeout", type=float, default=900.0)
    ap.add_argument("--startup-timeout", type=float, default=600.0)
    ap.add_argument(
        "--collective-timeout",
        type=float,
        default=600.0,
        help="seconds any trainer-group collective (and the ranks' rendezvous) may wait",
    )
    add_weight_sync_args(ap)
    ap.add_argument("--log-level", default="INFO")
    add_auth_args(ap)
    return ap


def wait_healthy(urls: list[str], timeout_s: float, stop: threading.Event) -> None:
    """Block until every ``url + /healthz`` answers; TimeoutError names the missing ones."""
    deadline, delay = time.monotonic() + timeout_s, 0.1
    missing = list(urls)
    while missing:
        for url in list(missing):
            try:
                request("GET", url + "/healthz", timeout_s=2.0)
                missing.remove(url)
            except OSError:
                continue  # not up yet: polled again until the deadline, which names it
        if not missing or stop.is_set():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not healthy after {timeout_s:g}s: {', '.join(missing)}")
        time.sleep(delay)
        delay = min(2.0, delay * 1.5)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s trainer %(message)s")
    try:
        rendezvous = TrainerRendezvous.from_env(os.environ)
        local_rank = local_rank_of(os.environ)
    except (ProtocolError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if rendezvous is not None and rendezvous.local_world_size > 1 and local_rank is None:
        return launch_local_ranks(rendezvous, argv)  # this process only supervises the ranks
    local_rank = local_rank or 0
    if rendezvous is not None and rendezvous.rank(local_rank) != 0:
        return run_follower(args, rendezvous, local_rank)
    try:
        token = server_token("trainer", args.insecure_no_auth)
    except AuthConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    stop = threading.Event()
    restore = install_stop_signals(stop)
    app = TrainerApp(args.host, args.port)
    app.auth_token = token
    app.stop_requested = stop
    app.start()
    print(f"{LISTENING_PREFIX}{app.url}", flush=True)
    try:
        return _run(args, app, stop, rendezvous)
    except (RolloutFailed, TimeoutError, OSError, ValueError, RuntimeError) as exc:
        app.failed = f"{type(exc).__name__}: {exc}"
        log.error("training failed: %s", app.failed)
        print(f"error: {app.failed}", file=sys.stderr, flush=True)
        time.sleep(1.0)  # let a polling parent read the failed status
        return 1
    finally:
        restore()
        app.stop(grace_s=1.0)


def _run(
    args: argparse.Namespace,
    app: TrainerApp,
    stop: threading.Event,
    rendezvous: TrainerRendezvous | None,
) -> int:
    spec = load_job_spec(args.job)
    log.info("torch threads: %d", torch_threads(args.threads, spec.trainer.resources))
    device = role_device(spec.trainer.resources)
    world = join_world(rendezvous, 0, device, timeout_s=args.collective_timeout)
    try:
        return _lead(args, app, stop, spec, world)
    finally:
        world.close()


def _lead(
    args: argparse.Namespace,
    app: TrainerApp,
    stop: threading.Event,
    spec: RLJobSpec,
    world: TrainerWorld,
) -> int:
    """Rank 0's run: build the driver, resume, run the steps; release the followers."""
    from longtail_workers.trainer.setup import build_driver

    run_dir = Path(args.run_dir)
    ckpt_dir = Path(args.checkpoint_dir or run_dir / spec.checkpoint.location)
    driver, publisher_stop = build_driver(spec, args, run_dir, ckpt_dir, world)
    ok = False
    try:
        outcome = _drive(args, app, stop, driver, run_dir, ckpt_dir)
        ok = True
    finally:
        driver.policy.close(ok)
        if driver.harvest is not None:
            driver.harvest.close()
        publisher_stop()
    log.info("trainer finished: %s at step %d", outcome, driver.state.step)
    return 0


def _drive(
    args: argparse.Namespace,
    app: TrainerApp,
    stop: threading.Event,
    driver: StepDriver,
    run_dir: Path,
    ckpt_dir: Path,
) -> str:
    driver.stop = stop
    if driver.registry is not None:
        driver.registry.on_rejected = app.metrics.candidate_rejected
        # An upload's policy_version is checked against the trainer's.
        app.drafters = DrafterEndpoints(
            driver.registry, policy_version=lambda: driver.state.policy_version
        )
    metrics_path = run_dir / METRICS_FILE
    start_step = 0
    found = latest_checkpoint(ckpt_dir) if args.resume else None
    if found is not None:
        state = driver.policy.load(found)
        start_step = state.step
        driver.state.policy_version = state.policy_version
        driver.state.drafter_version = state.drafter_version
        driver.state.last_checkpoint_step = state.step
        driver.state.eval_accuracy = state.extra.get("eval_accuracy")
        driver.state.eval_sampled_accuracy = state.extra.get("eval_sampled_accuracy")
        _truncate_rows(metrics_path, state.step)
        log.info("resumed from %s (step %d)", found, state.step)
    elif args.resume:
        log.info("--resume: no checkpoint under %s; starting at step 0", ckpt_dir)
    resumed = start_step if found is not None else None
    tracker = app.tracker = tracking.start(driver.spec, run_dir, ckpt_dir, resumed,
                                           app.metrics.tracking)  # fmt: skip

    def on_row(row: StepRow) -> None:
        with metrics_path.open("a") as f:
            f.write(json.dumps(row.to_dict()) + "\n")
        app.metrics.observe(row)
        tracker.step(row)

    driver.on_row = on_row
    app.harvest = driver.harvest
    app.driver = driver
    outcome = "failed"
    try:
        wait_healthy([driver.verifier.base_url], args.startup_timeout, stop)
        pool, rollout = driver.pool, driver.spec.rollout
        if pool.membership is None:  # a fixed list (longtail run): every worker, as listed
            wait_for_rollout(pool, len(pool.workers), None, args.startup_timeout, stop)
        else:  # Kueue may have admitted fewer pods than replicas: start with those there
            need, grace = rollout.fewest(), rollout.below_min_grace_seconds
            wait_for_rollout(pool, need, grace, args.startup_timeout, stop)
        outcome = driver.run(start_step)
    finally:
        drafters = None if driver.registry is None else driver.registry.root
        drafter = None
        if tracker.sinks:  # the export is for the trackers only
            drafter = drafter_artifact(drafters, driver.spec.model.path, run_dir / EXPORT_DIR)
        tracking.finish(tracker, outcome, drafter)
    return outcome


def _truncate_rows(path: Path, step: int) -> None:
    """Drop metric rows of steps after ``step`` (they were not checkpointed; they rerun)."""
    if not path.is_file():
        return
    lines = [ln for ln in path.read_text().splitlines() if ln]
    kept = [ln for ln in lines if StepRow.from_dict(json.loads(ln)).step <= step]
    path.write_text("".join(ln + "\n" for ln in kept))
