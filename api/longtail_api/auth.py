"""The per-job token that guards the write endpoints of a job's trainer and workers.

One token per RLJob: on a cluster the operator keeps it in a Secret it owns
(``<job>-auth``, key :data:`TOKEN_KEY`) and gives it to every pod of the job as the
environment variable :data:`TOKEN_ENV` (``secretKeyRef``); ``longtail run`` makes a fresh one
per run and hands it to its children the same way (environment, never the command line).
Every request other than GET and HEAD must carry ``Authorization: Bearer <token>``
(:func:`bearer_headers`); the servers compare it in constant time (:func:`token_matches`) and
answer 401 otherwise. Reads (health, readiness, metrics, status, weight and drafter
downloads) stay open. The threat model is in docs/reliability.md.

Shared by the operator, the workers and the CLI: standard library only.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping

from longtail_api import podenv

TOKEN_ENV = podenv.AUTH_TOKEN
"""Environment variable holding the job's token in every worker process."""
NO_AUTH_ENV = podenv.INSECURE_NO_AUTH
"""Set to ``1``/``true`` to run a worker without a token (development only; same as the
``--insecure-no-auth`` option). Without either, a worker with no token refuses to start."""
NO_AUTH_OPTION = "--insecure-no-auth"
TOKEN_KEY = "token"
"""Key of the token in the job's Secret."""
READ_METHODS: frozenset[str] = frozenset({"GET", "HEAD"})
"""Methods that need no token; every other method is a write."""
TOKEN_BYTES = 32


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def is_write(method: str) -> bool:
    """Whether a request with ``method`` needs the token."""
    return method.upper() not in READ_METHODS


def bearer_headers(token: str | None) -> dict[str, str]:
    """The ``Authorization`` header carrying ``token`` (none when ``token`` is empty)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def token_matches(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header value carries ``token`` (constant-time compare)."""
    scheme, _, given = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def env_token(environ: Mapping[str, str]) -> str | None:
    """The token in ``environ`` (:data:`TOKEN_ENV`), or None when unset or blank."""
    value = environ.get(TOKEN_ENV, "").strip()
    return value or None


def no_auth_requested(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` opts out of authentication (:data:`NO_AUTH_ENV`)."""
    return environ.get(NO_AUTH_ENV, "").strip().lower() in ("1", "true", "yes")
