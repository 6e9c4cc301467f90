"""Who may talk to a job's pods: the job's token Secret and its NetworkPolicy (pure builders).

- **Secret** ``<job>-auth`` (:func:`job_secret`): key ``token``, made once by ``reconcile.py``
  when the job has none, owned by the RLJob (garbage-collected with it), ``immutable`` and never
  regenerated while the job exists. Every pod reads it as ``LONGTAIL_AUTH_TOKEN``
  (``builders.token_env``); the operator reads it back (:func:`secret_token`) for its own role
  switches and checkpoint requests. The token is never logged or written to the status.
- **NetworkPolicy** ``<job>-workers`` (:func:`network_policy`, when
  ``LONGTAIL_OPERATOR_NETWORK_POLICY`` is true): ingress to the job's pods only on the worker
  ports (trainer, weights, verifier, rollout) and only from the job's own pods, the operator's
  pods (by labels, in namespaces matching ``..._OPERATOR_NAMESPACE_LABELS``, any when empty)
  and, when set, from namespaces matching ``..._METRICS_NAMESPACE_LABELS`` (Prometheus).
- **NetworkPolicy** ``<job>-trainers`` (:func:`trainer_network_policy`, same setting): the
  job's trainer pods reach each other on every TCP port: the rendezvous port on pod 0, and the
  ephemeral ports torch.distributed's gloo and NCCL pick for their own connections. A second
  policy, because a policy's rules cannot narrow the pods it selects: one rule in the first
  would open every port of every pod of the job to the trainer pods.

Threat model: docs/reliability.md.
"""

from __future__ import annotations

import base64
import binascii
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


class SecretError(ValueError):
    """The job's Secret exists but cannot be used (not this job's, or no token in it)."""


def network_policy_name(job: str) -> str:
    return f"{job}-workers"


def trainer_policy_name(job: str) -> str:
    return f"{job}-trainers"


def _metadata(job: JobRef, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": labels(job.name),
        "ownerReferences": [owner_reference(job)],
    }


def job_secret(job: JobRef, token: str) -> dict[str, Any]:
    """The job's token Secret (``stringData``: the API server stores it base64-encoded)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(job, secret_name(job.name)),
        "type": "Opaque",
        "immutable": True,
        "stringData": {TOKEN_KEY: token},
    }


def secret_token(secret: dict[str, Any], job: JobRef) -> str:
    """The token in the job's Secret as the API returns it; :class:`SecretError` when the
    Secret is not owned by this RLJob or holds no token (the message says how to fix it)."""
    meta = secret.get("metadata") or {}
    where = f"Secret {job.namespace}/{secret_name(job.name)}"
    owners = [r.get("uid") for r in meta.get("ownerReferences") or []]
    if job.uid not in owners:
        raise SecretError(
            f"{where} exists but is not owned by RLJob {job.name} (uid {job.uid}), so it is not "
            f"this job's token; delete it (kubectl -n {job.namespace} delete secret "
            f"{secret_name(job.name)}) and the operator makes a new one"
        )
    raw = (secret.get("data") or {}).get(TOKEN_KEY, "")
    try:
        token = base64.b64decode(raw, validate=True).decode("ascii").strip()
    except (binascii.Error, UnicodeDecodeError):
        token = ""
    if not token:
        raise SecretError(
            f"{where}: data.{TOKEN_KEY} is missing or not base64 text; delete the Secret and "
            "the operator makes a new one (the job's pods must then be recreated)"
        )
    return token


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


def network_policy(job: JobRef, settings: Settings) -> dict[str, Any]:
    """Ingress to the job's pods: its own pods, the operator, optionally Prometheus."""
    ports = worker_ports(settings)
    operator_peer: dict[str, Any] = {
        "namespaceSelector": {
            "matchLabels": label_map(settings.network_policy_operator_namespace_labels)
        },
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
        "apiVersion": "networking.k8s.io/v1",
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
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, trainer_policy_name(job.name)),
        "spec": {
            "podSelector": trainers,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": trainers}], "ports": [{"protocol": "TCP"}]}],
        },
    }
