"""The job token in a worker process: what its servers require and its clients send.

Each worker entry point (``longtail worker verifier|rollout|trainer``) calls
:func:`server_token` once at start: the token comes from ``LONGTAIL_AUTH_TOKEN`` (the operator
sets it from the RLJob's Secret; ``longtail run`` from the token it made for the run). A worker
with no token **refuses to start** (exit 2, :class:`AuthConfigError` names the variable and the
opt-out) unless ``--insecure-no-auth`` or ``LONGTAIL_INSECURE_NO_AUTH=1`` says that running
open is meant (development by hand); then it logs a warning. The token goes on the server
(``BackgroundHTTPServer.auth_token``, checked in ``httprequest.py``) and, through
:func:`client_token`, on every write request the process sends to its peers (rollout
dispatch, role switches, drafter uploads, verify calls).
"""

from __future__ import annotations

import argparse
import logging
import os

from longtail_api.auth import (
    NO_AUTH_ENV,
    NO_AUTH_OPTION,
    TOKEN_ENV,
    bearer_headers,
    env_token,
    new_token,
    no_auth_requested,
)

log = logging.getLogger(__name__)


class AuthConfigError(ValueError):
    """A worker was started without a token and without the explicit opt-out."""


def add_auth_args(ap: argparse.ArgumentParser) -> None:
    """The ``--insecure-no-auth`` option of every worker role."""
    ap.add_argument(
        NO_AUTH_OPTION,
        action="store_true",
        help=f"serve write endpoints without a token when {TOKEN_ENV} is unset (development "
        "only: anyone who reaches the port can change roles, checkpoint, upload drafters)",
    )


def server_token(role: str, insecure_no_auth: bool = False) -> str | None:
    """The token this worker's server requires, or None when running open was asked for."""
    token = env_token(os.environ)
    if token is not None:
        return token
    if insecure_no_auth or no_auth_requested(os.environ):
        log.warning(
            "%s: no %s: write endpoints are OPEN to anyone who reaches the port (%s)",
            role, TOKEN_ENV, NO_AUTH_OPTION,
        )  # fmt: skip
        return None
    raise AuthConfigError(
        f"worker {role}: {TOKEN_ENV} is not set, so its write endpoints would be open; set "
        f"{TOKEN_ENV} to the job's token (the operator injects it from the RLJob's Secret "
        f"<job>-auth, `longtail run` makes one per run), or pass {NO_AUTH_OPTION} (or "
        f"{NO_AUTH_ENV}=1) to run without authentication for development"
    )


def client_token(token: str | None = None) -> str | None:
    """``token`` when given, else this process's job token (``LONGTAIL_AUTH_TOKEN``)."""
    return token if token is not None else env_token(os.environ)


def auth_headers(token: str | None = None) -> dict[str, str]:
    """``Authorization`` header for a write request (see :func:`client_token`)."""
    return bearer_headers(client_token(token))


def export_run_token() -> str:
    """A fresh token for one ``longtail run``, put in this process's environment.

    The children inherit it (``local/launcher.py`` copies the environment, restarts included):
    never on a command line, where ``ps`` would show it. The parent's own clients (harvest
    coordinator) read it the same way."""
    token = new_token()
    os.environ[TOKEN_ENV] = token
    return token
