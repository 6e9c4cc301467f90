"""Who may talk to a job's pods: the job's token, its Secret and its NetworkPolicy (pure builders).

- **Token**: ``HMAC-SHA256(key, "<namespace>/<name>/<uid>")`` (:func:`job_token`), base64url.
  ``key`` is one operator-wide key, the Secret ``LONGTAIL_OPERATOR_TOKEN_KEY_SECRET`` in the
  operator's own namespace (:func:`key_secret`, :func:`token_key`), read by name at start-up
  (``handlers.py``) and made there when absent. So the operator knows every job's token without
  reading any job's Secret: its RBAC grants ``get`` on that one Secret only, never on Secrets
  in the jobs' namespaces.
- **Secret** ``<job>-auth`` (:func:`job_secret`): key ``token``, created by ``reconcile.py``
  with the derived token when the job has none (409: it exists), owned by the RLJob
  (garbage-collected with it) and ``immutable``. Every pod reads it as
  ``LONGTAIL_AUTH_TOKEN`` (``builders.token_env``); the operator never reads it back: it
  derives the same token for its own role switches and checkpoint requests. Tokens are never
  logged or written to the status. Label ``longtail.dev/token-key`` names the key's
  fingerprint (:func:`key_id`, not secret), so ``kubectl get secrets -L longtail.dev/token-key``
  shows which jobs predate a key rotation.
- **NetworkPolicy** ``<job>-workers`` (:func:`network_policy`, when
  ``LONGTAIL_OPERATOR_NETWORK_POLICY`` is true): ingress to the job's pods only on the worker
  ports (trainer, weights, verifier, rollout) and only from the job's own pods, the operator's
  pods (by labels, in the operator's namespace: :func:`operator_namespace_selector`) and, when
  set, from namespaces matching ``..._METRICS_NAMESPACE_LABELS`` (Prometheus).
- **NetworkPolicy** ``<job>-trainers`` (:func:`trainer_network_policy`, same setting): the
  job's trainer pods reach each other on every TCP port: the rendezvous port on pod 0, and the
  ephemeral ports torch.distributed's gloo and NCCL pick for their own connections. A second
  policy, because a policy's rules cannot narrow the pods it selects: one rule in the first
  would open every port of every pod of the job to the trainer pods.
- **NetworkPolicy** ``<job>-weight-sync`` (:func:`weight_sync_network_policy`, same setting,
  only while the job's resolved ``spec.weightSync`` transport is ``broadcast``): the job's
  rollout pods reach the weight-sync store's port on the trainer pods, and the job's trainer
  and rollout pods reach each other on every TCP port, for the process group each broadcast
  attempt builds (gloo and NCCL's socket transport connect every member to every other on
  ports they pick themselves). A third policy for the same reason as the second.

Threat model: docs/reliability.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterable
from typing import Any

from longtail_api.auth import TOKEN_KEY
from longtail_operator.builders import (
    LABEL_JOB,
    LABEL_ROLE,
    JobRef,
    labels,
    owner_reference,
    secret_name,
)
from longtail_operator.settings import Settings

KEY_FIELD = "key"
"""Key of the token key in the operator's key Secret."""
KEY_BYTES = 32
"""Length of a key the operator makes; the shortest it accepts."""
LABEL_KEY_ID = "longtail.dev/token-key"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Set on every namespace by Kubernetes >= 1.21 (absent on 1.20 unless an admin adds it)."""


class TokenKeyError(ValueError):
    """The operator's key Secret exists but holds no usable key (the message says the fix)."""


def network_policy_name(job: str) -> str:
    return f"{job}-workers"


def trainer_policy_name(job: str) -> str:
    return f"{job}-trainers"


def weight_sync_policy_name(job: str) -> str:
    return f"{job}-weight-sync"


POLICY_API = "networking.k8s.io/v1"


def policy_names(job: str) -> tuple[str, ...]:
    """Every NetworkPolicy a job may own (``reconcile.py`` reads them by name)."""
    return network_policy_name(job), trainer_policy_name(job), weight_sync_policy_name(job)


def _metadata(job: JobRef, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": labels(job.name),
        "ownerReferences": [owner_reference(job)],
    }


def key_id(key: bytes) -> str:
    """A fingerprint of ``key`` that reveals nothing of it (for labels and log lines)."""
    return hmac.new(key, b"longtail key id", hashlib.sha256).hexdigest()[:16]


def job_token(key: bytes, job: JobRef) -> str:
    """The job's token: the same for one RLJob (namespace, name, uid) under one key; a new
    RLJob of the same name (another uid) gets another."""
    message = f"{job.namespace}/{job.name}/{job.uid}".encode()
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def key_secret(namespace: str, name: str, key: bytes) -> dict[str, Any]:
    """The operator's key Secret, as it makes it when absent (``immutable``: rotate by
    deleting it, see docs/operator.md)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "longtail",
                "app.kubernetes.io/component": "operator",
            },
        },
        "type": "Opaque",
        "immutable": True,
        "data": {KEY_FIELD: base64.b64encode(key).decode("ascii")},
    }


def token_key(secret: dict[str, Any]) -> bytes:
    """The key in the operator's key Secret as the API returns it; :class:`TokenKeyError`
    naming the Secret and the fix when it holds none, or one shorter than 32 bytes."""
    meta = secret.get("metadata") or {}
    where = f"Secret {meta.get('namespace')}/{meta.get('name')}"
    raw = (secret.get("data") or {}).get(KEY_FIELD, "")
    try:
        key = base64.b64decode(raw, validate=True)
    except binascii.Error:
        key = b""
    if len(key) < KEY_BYTES:
        raise TokenKeyError(
            f"{where}: data.{KEY_FIELD} must hold at least {KEY_BYTES} random bytes "
            f"(base64), got {len(key)}; delete the Secret and restart the operator to make a "
            f"new key, or create it with `kubectl -n {meta.get('namespace')} create secret "
            f"generic {meta.get('name')} --from-literal={KEY_FIELD}=$(openssl rand -hex 32)`"
            " (running jobs keep their old tokens: see docs/operator.md, key rotation)"
        )
    return key


def job_secret(job: JobRef, token: str, key: bytes) -> dict[str, Any]:
    """The job's token Secret (``stringData``: the API server stores it base64-encoded)."""
    meta = _metadata(job, secret_name(job.name))
    meta["labels"] = {**meta["labels"], LABEL_KEY_ID: key_id(key)}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "immutable": True,
        "stringData": {TOKEN_KEY: token},
    }


def label_map(items: Iterable[str]) -> dict[str, str]:
    """``("k=v", ...)`` (settings, already checked) as a label map."""
    return dict(item.split("=", 1) for item in items)


def worker_ports(settings: Settings) -> list[dict[str, Any]]:
    """Every port a job's pods listen on, as NetworkPolicy ports."""
    numbers = sorted(
        {
            settings.trainer_port,
            settings.weights_port,
            settings.verifier_port,
            settings.worker_port,
        }
    )
    return [{"protocol": "TCP", "port": port} for port in numbers]


def operator_namespace_selector(settings: Settings) -> dict[str, Any]:
    """The operator's namespace: the configured labels, else its name label. Never empty (an
    empty selector would admit pods with the operator's labels from every namespace)."""
    labels = label_map(settings.network_policy_operator_namespace_labels)
    return {"matchLabels": labels or {NAMESPACE_NAME_LABEL: settings.operator_namespace}}


def network_policy(job: JobRef, settings: Settings) -> dict[str, Any]:
    """Ingress to the job's pods: its own pods, the operator, optionally Prometheus."""
    ports = worker_ports(settings)
    operator_peer: dict[str, Any] = {
        "namespaceSelector": operator_namespace_selector(settings),
        "podSelector": {"matchLabels": label_map(settings.network_policy_operator_labels)},
    }
    rules: list[dict[str, Any]] = [
        {"from": [{"podSelector": {"matchLabels": {LABEL_JOB: job.name}}}], "ports": ports},
        {"from": [operator_peer], "ports": ports},
    ]
    if settings.network_policy_metrics_namespace_labels:
        scraper = label_map(settings.network_policy_metrics_namespace_labels)
        rules.append({"from": [{"namespaceSelector": {"matchLabels": scraper}}], "ports": ports})
    return {
        "apiVersion": POLICY_API,
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, network_policy_name(job.name)),
        "spec": {
            "podSelector": {"matchLabels": {LABEL_JOB: job.name}},
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }


def trainer_network_policy(job: JobRef) -> dict[str, Any]:
    """Ingress to the job's trainer pods from its trainer pods, every TCP port."""
    trainers = {"matchLabels": {LABEL_JOB: job.name, LABEL_ROLE: "trainer"}}
    return {
        "apiVersion": POLICY_API,
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, trainer_policy_name(job.name)),
        "spec": {
            "podSelector": trainers,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": trainers}], "ports": [{"protocol": "TCP"}]}],
        },
    }


WEIGHT_SYNC_ROLES = ("trainer", "rollout")
"""The roles of a ``broadcast`` job's weight-sync groups: trainer rank 0 sends, every rollout
worker receives (drafter pods pull over HTTP, through ``<job>-workers``)."""


def weight_sync_network_policy(job: JobRef, settings: Settings) -> dict[str, Any]:
    """Ingress among a ``broadcast`` job's trainer and rollout pods (``spec.weightSync``).

    Two rules. The first admits the one port a worker dials by number: the rollout pods
    reach the store rank 0 hosts on :attr:`Settings.weight_sync_port` (registration,
    heartbeats, each attempt's acks). The second admits every TCP port among the trainer and
    rollout pods, in both directions, which also covers the first: the process group of each
    broadcast attempt is built from that store, and gloo (and NCCL's socket transport) then
    connect every member to every other member, trainer to rollout, rollout to trainer and
    rollout to rollout, on ports each process picks itself (ephemeral, unknown in advance),
    as for the trainer group in :func:`trainer_network_policy`. The first rule is kept so the
    policy names the port the workers are configured with. Made only for ``broadcast`` jobs:
    an ``http`` job's pods talk on the worker ports alone."""
    member = {
        "matchLabels": {LABEL_JOB: job.name},
        "matchExpressions": [
            {"key": LABEL_ROLE, "operator": "In", "values": list(WEIGHT_SYNC_ROLES)}
        ],
    }
    rollouts = {"matchLabels": {LABEL_JOB: job.name, LABEL_ROLE: "rollout"}}
    store = {"protocol": "TCP", "port": settings.weight_sync_port}
    return {
        "apiVersion": POLICY_API,
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, weight_sync_policy_name(job.name)),
        "spec": {
            "podSelector": member,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": rollouts}], "ports": [store]},
                {"from": [{"podSelector": member}], "ports": [{"protocol": "TCP"}]},
            ],
        },
    }
