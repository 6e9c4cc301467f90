"""``longtail worker verifier``: run the verifier service until SIGTERM or SIGINT.

The CLI routes ``longtail worker verifier ARGS...`` to :func:`main` (``ARGS`` as a list); a
verifier pod's command is exactly that, and local mode starts the same command as a process.
Once the socket is bound, one line is printed to stdout::

    longtail verifier listening on http://127.0.0.1:8100

(with ``--port 0`` the port in it is the free one the OS picked), so a parent process can read
the URL. SIGTERM/SIGINT trigger a graceful stop: readiness turns 503, the listener closes, and
in-flight requests get ``--grace-seconds`` to finish. ``python -m
longtail_workers.verifier.service`` works too. ``POST /v1/verify`` requires the job's token
(``LONGTAIL_AUTH_TOKEN``); without one the verifier refuses to start unless
``--insecure-no-auth`` is given (``longtail_workers.auth``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import threading
from collections.abc import Callable

from longtail_workers.auth import AuthConfigError, add_auth_args, server_token
from longtail_workers.rewards import (
    DEFAULT_TIMEOUT_S,
    CheckerUnavailable,
    UnknownRewardError,
    configure_math_checker,
    get_reward,
    known_rewards,
)
from longtail_workers.signals import install_stop_signals
from longtail_workers.verifier.server import VerifierConfig, VerifierServer

LISTENING_PREFIX = "longtail verifier listening on "
"""Start of the line printed on stdout once the server is bound; the URL follows."""


def _int_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            upper = f" and <= {maximum}" if maximum is not None else ""
            raise argparse.ArgumentTypeError(f"must be >= {minimum}{upper}, got {value}")
        return value

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    defaults = VerifierConfig()
    ap = argparse.ArgumentParser(
        prog="longtail worker verifier",
        description="Score model answers against gold answers over HTTP (POST /v1/verify).",
    )
    ap.add_argument(
        "--host",
        default=defaults.host,
        help="address to bind (default %(default)s; use 0.0.0.0 in a pod so other pods reach it)",
    )
    ap.add_argument(
        "--port",
        type=_int_at_least(0, 65535),
        default=defaults.port,
        help="TCP port (default %(default)s; 0 picks a free port and prints it)",
    )
    ap.add_argument(
        "--max-batch",
        type=_int_at_least(1),
        default=defaults.max_batch,
        help="most items per request; larger batches get HTTP 413 (default %(default)s)",
    )
    ap.add_argument(
        "--max-answer-chars",
        type=_int_at_least(1),
        default=defaults.max_answer_chars,
        help="longest answer or gold string; longer ones get HTTP 413 (default %(default)s)",
    )
    ap.add_argument(
        "--max-body-bytes",
        type=_int_at_least(1024),
        default=defaults.max_body_bytes,
        help="largest request body; larger ones get HTTP 413 (default %(default)s)",
    )
    ap.add_argument(
        "--reward",
        default=defaults.default_reward,
        help="reward used when a request names none (default %(default)s)",
    )
    ap.add_argument(
        "--reward-module",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first, so its @register_reward functions exist (repeatable)",
    )
    ap.add_argument(
        "--answer-timeout-seconds",
        type=_positive_float,
        default=DEFAULT_TIMEOUT_S,
        help="the math reward's limit per answer (parse and compare); an answer that takes "
        "longer scores 0 with the reason logged (default %(default)s)",
    )
    ap.add_argument(
        "--math-processes",
        type=_int_at_least(1, 256),
        default=None,
        help="math-verify checker processes, and items of a request scored at once (default: "
        "the CPUs this process may use, at most 4)",
    )
    ap.add_argument(
        "--grace-seconds",
        type=float,
        default=5.0,
        help="on SIGTERM, how long in-flight requests may take to finish (default %(default)s)",
    )
    ap.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level (default %(default)s; DEBUG logs every request)",
    )
    add_auth_args(ap)
    return ap


def main(argv: list[str] | None = None, *, stop: threading.Event | None = None) -> int:
    """Run the verifier until SIGTERM/SIGINT (or until ``stop`` is set, for in-process use).

    Returns 0 on a clean stop, 1 when the port cannot be bound, 2 on bad arguments, an
    unknown default reward or no job token (argparse itself exits 2 on unparsable flags).
    """
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    error = _load_rewards(args.reward_module, args.reward)
    if error is not None:
        print(f"error: {error}", file=sys.stderr)
        return 2
    checker = configure_math_checker(args.answer_timeout_seconds, args.math_processes)
    try:
        checker.start()  # a missing math-verify stops the verifier here, not at the first answer
    except CheckerUnavailable as exc:
        print(f"error: math reward: {exc}", file=sys.stderr)
        return 2
    try:
        token = server_token("verifier", args.insecure_no_auth)
    except AuthConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    config = VerifierConfig(
        host=args.host,
        port=args.port,
        max_batch=args.max_batch,
        max_answer_chars=args.max_answer_chars,
        max_body_bytes=args.max_body_bytes,
        default_reward=args.reward,
        score_threads=checker.processes,
    )
    server = VerifierServer(config)
    server.auth_token = token
    stop = stop if stop is not None else threading.Event()
    restore = install_stop_signals(stop)  # before the URL is announced: see signals.py
    try:
        try:
            server.start()
        except OSError as exc:
            print(
                f"error: cannot listen on {args.host}:{args.port}: {exc} "
                f"(pick another --port, or --port 0 for a free one)",
                file=sys.stderr,
            )
            return 1
        print(f"{LISTENING_PREFIX}{server.url}", flush=True)
        try:
            stop.wait()
        finally:
            server.stop(grace_s=args.grace_seconds)
    finally:
        restore()
    return 0


def _load_rewards(modules: list[str], default_reward: str) -> str | None:
    """Import plugin modules and check the default reward exists; an error message or None."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return (
                f"--reward-module {module}: cannot import it: {exc} "
                f"(is it installed, and on PYTHONPATH?)"
            )
    try:
        get_reward(default_reward)
    except UnknownRewardError as exc:
        return f"--reward: {exc}"
    logging.getLogger(__name__).info("rewards available: %s", ", ".join(known_rewards()))
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
