"""``longtail worker drafter``: the dedicated drafter-training process (``spec.drafter``).

The CLI routes ``longtail worker drafter ARGS...`` to :func:`main`; the operator starts it in
each drafter pod (``--host 0.0.0.0 --port N``, the rest from ``LONGTAIL_*`` variables through
``podenv.py``) and ``longtail run`` once per ``spec.drafter.replicas``. It loads the job's policy
and initial drafter (``runtime.policy_and_drafter``, with the trainer's drafter exchange as the
registry), then runs :class:`~longtail_workers.drafter_worker.worker.DrafterWorker` in a thread:
one drafter window per completed RL step, on that step's answers, through the same
:class:`~longtail_workers.spot.sequences.SequenceWindows` the trainer's harvest uses. It needs
the trainer's base URL (``--trainer-url``: ``GET /v1/samples/latest``; the drafter exchange is
on the same port unless ``--drafters-url`` says otherwise) and its weight server
(``--weights-url``). Its HTTP surface, parallel to a rollout worker's: ``GET /healthz`` (the
process serves), ``GET /readyz`` (503 once the loop ended or while stopping), ``GET /v1/status``
(:meth:`DrafterWorker.status`) and ``GET /metrics``. Prints ``longtail drafter listening on
URL`` once bound. It has no write endpoint; its candidate uploads carry the job's token, and it
refuses to start without one unless ``--insecure-no-auth`` (``longtail_workers.auth``). Exit 0
on SIGTERM/SIGINT, 1 when the loop ended on a crash of the drafter training.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from http import HTTPStatus
from typing import Any

from starlette.routing import Route

from longtail_api.wirecodec import to_wire
from longtail_api.workerapi import STATUS_PATH
from longtail_workers.drafter_worker.worker import DrafterWorker, LoopTimes
from longtail_workers.httpserver import BackgroundHTTPServer, probe_routes, route
from longtail_workers.runtime import (
    ServiceRuntime,
    policy_and_drafter,
    role_device,
    start_service,
    torch_threads,
    worker_parser,
)
from longtail_workers.spot.sequences import SequenceWindows
from longtail_workers.weights.http_sync import HttpWeightClient
from longtail_workers.wire.samples import SampleFeed

log = logging.getLogger(__name__)
LISTENING_PREFIX = "longtail drafter listening on "


class DrafterServer(BackgroundHTTPServer):
    """The drafter worker's read-only HTTP surface (see the module text)."""

    service = "drafter worker"
    thread_name = "drafter-http"
    started_log = "drafter worker listening on %s"

    def __init__(self, worker: DrafterWorker, host: str, port: int) -> None:
        super().__init__(host, port, request_timeout_s=30.0)
        self.worker = worker

    def routes(self) -> list[Route]:
        worker = self.worker
        return [
            *probe_routes(self.unready, worker.metrics_registry),
            route(
                STATUS_PATH, lambda h: h.send_json(HTTPStatus.OK, to_wire(worker.status())), "GET"
            ),
        ]

    def unready(self) -> str | None:
        """Not ready once the loop ended (a crash names itself) or while stopping."""
        if self.worker.stop.is_set():
            return self.worker.fatal or "stopping"
        return super().unready()


def build_parser() -> argparse.ArgumentParser:
    ap = worker_parser(
        "longtail worker drafter",
        "Dedicated drafter worker: trains the drafter on every step's answers.",
        "drafter-0",
    )
    ap.add_argument(
        "--trainer-url", required=True, help="trainer's base URL (its --port): step samples"
    )
    ap.add_argument("--weights-url", required=True, help="trainer weight server base URL")
    ap.add_argument(
        "--drafters-url",
        default=None,
        help="trainer's drafter exchange (default: --trainer-url, where the trainer serves it)",
    )
    ap.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: drafter CPUs)"
    )
    ap.add_argument(
        "--step-wait",
        type=float,
        default=600.0,
        help="seconds without any answer from the trainer before a wait is reported failed",
    )
    return ap


def main(argv: list[str]) -> int:
    started = start_service(build_parser(), argv, "drafter")
    if started is None:
        return 2
    args, spec, token = started.args, started.spec, started.token
    if spec.drafter is None or not spec.drafter_training.enabled:
        print(
            f"error: {args.job}: a drafter worker needs spec.drafter (the dedicated drafter "
            "role) and drafterTraining.enabled: true; add them, or do not start this worker",
            file=sys.stderr,
        )
        return 2
    worker = build_worker(args, spec)
    server = DrafterServer(worker, args.host, args.port)
    server.auth_token = token
    stop = threading.Event()
    # A daemon: a loop stuck in a request to a lost trainer must not keep the process alive.
    loop = threading.Thread(target=_run_loop, args=(worker, stop), name="drafter-loop", daemon=True)
    runtime = ServiceRuntime(server, LISTENING_PREFIX, stop)
    loop.start()
    code = runtime.serve_forever(on_stop=worker.close)
    loop.join(timeout=worker.times.stop_s)
    return 1 if worker.fatal else code


def build_worker(args: argparse.Namespace, spec: Any) -> DrafterWorker:
    """The policy (on the drafter role's device), its initial drafter and the loop around them."""
    threads = torch_threads(args.threads, spec.drafter.resources)
    log.info("torch threads: %d", threads)
    drafters_url = args.drafters_url or args.trainer_url
    device = role_device(spec.drafter.resources)
    loaded = policy_and_drafter(spec, None, drafters_url, device=device)
    assert loaded.registry is not None  # drafters_url is always set: the exchange's client
    windows = SequenceWindows(
        loaded.model,
        loaded.drafter,
        loaded.registry,
        target_id=loaded.target_id,
        training=spec.drafter_training,
    )
    return DrafterWorker(
        windows,
        SampleFeed(args.trainer_url),
        HttpWeightClient(args.weights_url, timeout_s=120.0, retries=5),
        name=args.name,
        times=LoopTimes(step_wait_s=args.step_wait),
    )


def _run_loop(worker: DrafterWorker, stop: threading.Event) -> None:
    """The loop thread; a crash ends the process (exit 1) so that it gets restarted."""
    worker.run()
    if worker.fatal is not None:
        time.sleep(1.0)  # let a poller read the failed status
        stop.set()
