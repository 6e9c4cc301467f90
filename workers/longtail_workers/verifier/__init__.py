"""The verifier worker role: rewards over HTTP.

``longtail worker verifier`` runs :func:`~longtail_workers.verifier.service.main`, which serves
``POST /v1/verify`` (score a batch of answers with a registered reward, see
``longtail_workers.rewards``), ``/healthz``, ``/readyz`` and ``/metrics``. In-process users
start a :class:`~longtail_workers.verifier.server.VerifierServer` and talk to it with
:class:`~longtail_workers.verifier.client.VerifierClient`; :func:`score_request` scores without
HTTP.
"""

from __future__ import annotations

from longtail_workers.verifier.client import VerifierClient, VerifierError
from longtail_workers.verifier.scoring import RewardFailedError, ScoredBatch, score_request
from longtail_workers.verifier.server import VerifierConfig, VerifierServer

__all__ = [
    "RewardFailedError",
    "ScoredBatch",
    "VerifierClient",
    "VerifierConfig",
    "VerifierError",
    "VerifierServer",
    "score_request",
]
