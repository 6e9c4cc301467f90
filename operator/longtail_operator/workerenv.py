"""What a worker pod is told: its environment, its rendezvous and its weight-sync flags.

Pure, called by ``builders.worker_pod`` (re-exported there, with the rest of the pod contract):
the :class:`~longtail_api.podenv.PodEnv` of a pod (:func:`pod_env`, documented in
docs/operator.md) and its ``env`` entries (:func:`container_env`), the job's token from its
Secret (:func:`token_env`), the trainer's W&B key (:func:`tracking_env`), the trainer group's
torch.distributed rendezvous (:func:`trainer_rendezvous`) and ``spec.weightSync``'s worker flags
(:func:`weight_sync_args`).
"""

from __future__ import annotations

import posixpath
from typing import Any

from longtail_api.auth import TOKEN_ENV, TOKEN_KEY
from longtail_api.podenv import FIELD_REFS, Peer, PodEnv
from longtail_api.rendezvous import DEFAULT_PORT, TrainerRendezvous
from longtail_api.spec import RLJobSpec
from longtail_api.tracking import WANDB_API_KEY_ENV
from longtail_operator.naming import (
    JobRef,
    checkpoint_path,
    role_port,
    role_specs,
    secret_name,
    service_name,
    trainer_host,
    trainer_local_world_size,
)
from longtail_operator.settings import Settings

RENDEZVOUS_PORT = DEFAULT_PORT
"""Where pod 0's rank 0 serves the torch.distributed rendezvous store (torchrun's default)."""
CONFIG_DIR = "/etc/longtail"
CONFIG_FILE = "rljob.yaml"
DRAFTERS_SUBDIR = "drafters"
"""The trainer's drafter registry, under its checkpoint volume (survives trainer restarts)."""


def token_env(job: str) -> dict[str, Any]:
    """The token variable (``TOKEN_ENV``) from the job's Secret: an environment variable
    rather than a mounted file, so ``longtail run`` and pods hand it over the same way, the
    value never appears in the pod spec, and no volume or file mode meets the user's template
    (a token that never changes while the job exists gains nothing from a file's live
    updates)."""
    ref = {"name": secret_name(job), "key": TOKEN_KEY}
    return {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}}


def tracking_env(spec: RLJobSpec) -> list[dict[str, Any]]:
    """The trainer's W&B key (``WANDB_API_KEY``) from the Secret that
    ``spec.tracking.wandb.apiKeySecret`` names; none without one. The key never enters the spec
    or the operator: the kubelet reads the Secret."""
    wandb = spec.tracking.wandb
    if wandb is None or wandb.api_key_secret is None:
        return []
    ref = {"name": wandb.api_key_secret.name, "key": wandb.api_key_secret.key}
    return [{"name": WANDB_API_KEY_ENV, "valueFrom": {"secretKeyRef": ref}}]


def trainer_rendezvous(job: JobRef, spec: RLJobSpec, index: int) -> TrainerRendezvous:
    """Trainer pod ``index``'s rendezvous: rank 0 on pod 0 behind the headless Service. The
    pod gets no ``RANK``/``LOCAL_RANK``: it holds ``LOCAL_WORLD_SIZE`` ranks, and the trainer
    entrypoint sets both for each rank it starts, as torchrun does."""
    return TrainerRendezvous(
        master_addr=trainer_host(job),
        master_port=RENDEZVOUS_PORT,
        nnodes=spec.trainer.replicas,
        node_rank=index,
        local_world_size=trainer_local_world_size(spec),
    )


def pod_env(job: JobRef, spec: RLJobSpec, settings: Settings, role: str, index: int) -> PodEnv:
    """What a worker pod is told about its job, its config and its peers (the variables are
    named in ``longtail_api.podenv``; docs/operator.md documents them). With
    ``drafterTraining`` enabled, the trainer keeps the drafter registry under its checkpoint
    volume (``drafter_dir``) and serves it on its HTTP port, which rollout workers and
    dedicated drafter pods (``spec.drafter``) reach through ``drafter_url``; no shared volume.
    (A spec with ``drafter`` but without ``drafterTraining`` fails validation, so a drafter
    pod always gets the URL it needs.)"""
    trainer = trainer_host(job)
    drafters = spec.drafter_training.enabled
    peers = {
        peer: Peer(f"{service_name(job.name, peer)}.{job.namespace}.svc", role_port(settings, peer))
        for peer in role_specs(spec)
    }
    return PodEnv(
        job_name=job.name,
        namespace=job.namespace,
        role=role,
        replica_index=index,
        replicas=role_specs(spec)[role].replicas,
        config=posixpath.join(CONFIG_DIR, CONFIG_FILE),
        checkpoint_dir=checkpoint_path(spec),
        resume=spec.checkpoint.resume,
        trainer_url=f"http://{trainer}:{settings.trainer_port}",
        weights_url=f"http://{trainer}:{settings.weights_port}",
        peers=peers,
        drafter_dir=(
            posixpath.join(checkpoint_path(spec), DRAFTERS_SUBDIR)
            if drafters and role == "trainer"
            else None
        ),
        # Both pull the newest drafter and upload candidates.
        drafter_url=(
            f"http://{trainer}:{settings.trainer_port}"
            if drafters and role in ("rollout", "drafter")
            else None
        ),
    )


def weight_sync_address(job: JobRef, settings: Settings) -> str:
    """``HOST:PORT`` of the job's weight-sync store: trainer pod 0's stable DNS name (rank 0
    hosts the store) and :attr:`Settings.weight_sync_port`."""
    return f"{trainer_host(job)}:{settings.weight_sync_port}"


def weight_sync_args(job: JobRef, spec: RLJobSpec, settings: Settings, role: str) -> list[str]:
    """The worker flags of ``spec.weightSync`` for ``role`` (the workers' command-line names,
    written here as strings: the operator does not import the workers). ``http`` jobs get
    none, so their pods start exactly as before the field existed. ``broadcast`` jobs: every
    trainer pod gets the transport and the store's port (rank 0, on pod 0, hosts the store;
    the other ranks follow it and never bind), every rollout pod the transport and the
    store's address; the rollout pod also keeps its ``LONGTAIL_WEIGHTS_URL`` (a new or
    restarted worker catches up over HTTP before it joins the next broadcast). A rollout
    worker registers under its ``--name``, its pod name (``LONGTAIL_POD_NAME``), which is the
    name the trainer gives it in ``--rollout NAME=URL``: both are ``<job>-rollout-<i>``.
    Drafter pods always pull over HTTP: none."""
    if spec.weight_sync_transport() != "broadcast":
        return []
    if role == "trainer":
        return ["--weight-sync", "broadcast", "--weight-sync-port", str(settings.weight_sync_port)]
    if role == "rollout":
        addr = weight_sync_address(job, settings)
        return ["--weight-sync", "broadcast", "--weight-sync-addr", addr]
    return []


def container_env(told: PodEnv) -> list[dict[str, Any]]:
    """``told`` as a container's ``env``: its values, then the downward-API variables."""
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in told.to_env().items()]
    env += [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in FIELD_REFS.items()]
    return env
