"""Pure manifest builders: an RLJob's spec in, the pods, Services and ConfigMap it needs out.

No Kubernetes client here: every function takes plain values (the job's identity, the parsed
:class:`~longtail_api.spec.RLJobSpec`, :class:`~longtail_operator.settings.Settings`) and
returns plain dicts, so the unit tests read them directly and ``reconcile.py`` hands them to the
API. Naming: pod ``<job>-<role>-<index>``, headless Service ``<job>-<role>``, ConfigMap
``<job>-config``. The trainer pods form one torch.distributed group: each gets the rendezvous
environment (:func:`trainer_rendezvous`, ``longtail_api.rendezvous``) with pod 0's stable DNS
name as ``MASTER_ADDR``, and labels naming its group and world (``trainergroup.py`` plans
it). Every object carries the ``longtail.dev/*`` and ``app.kubernetes.io/*`` labels and a
controller owner reference to the RLJob, so deleting the RLJob garbage-collects it. The worker
contract (args, the environment typed as ``longtail_api.podenv.PodEnv``, :func:`pod_env`) is
documented in docs/operator.md; ``spec.weightSync``'s flags are :func:`weight_sync_args`.
Every pod gets the job's token (``TOKEN_ENV``) from the Secret
``<job>-auth``
(:func:`token_env`); the Secret and the NetworkPolicy themselves are built in ``access.py``.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, replace
from typing import Any

import yaml

from longtail_api import API_VERSION, KIND
from longtail_api.auth import TOKEN_ENV, TOKEN_KEY
from longtail_api.podenv import FIELD_REFS, WEIGHT_SPOOL_DIR, Peer, PodEnv
from longtail_api.rendezvous import DEFAULT_PORT, TrainerRendezvous
from longtail_api.scheduling import GangSpec, effective_gang
from longtail_api.spec import RLJobSpec, RoleSpec
from longtail_api.tracking import WANDB_API_KEY_ENV
from longtail_operator import gang as gangs
from longtail_operator.merge import deep_merge
from longtail_operator.settings import Settings

LABEL_JOB = "longtail.dev/rljob"
LABEL_ROLE = "longtail.dev/role"
LABEL_INDEX = "longtail.dev/replica-index"
LABEL_TRAINER_GROUP = "longtail.dev/trainer-group"
"""Trainer pods: ``status.trainer.restarts`` when the pod was made (its group's number)."""
LABEL_TRAINER_WORLD = "longtail.dev/trainer-world"
"""Trainer pods: ``<replicas>x<ranks per pod>`` of the world the pod was made for."""
RENDEZVOUS_PORT = DEFAULT_PORT
"""Where pod 0's rank 0 serves the torch.distributed rendezvous store (torchrun's default)."""
ROLES: tuple[str, ...] = ("trainer", "verifier", "rollout", "drafter")
"""Worker roles, in creation order (the trainer first: the others discover it)."""
GPU_RESOURCE = "nvidia.com/gpu"
CONTAINER = "worker"
CONFIG_DIR = "/etc/longtail"
CONFIG_FILE = "rljob.yaml"
WORK_DIR = "/var/lib/longtail"
"""Working directory of worker containers; relative checkpoint locations resolve under it."""
MANAGER = "longtail-operator"
DRAFTERS_SUBDIR = "drafters"
"""The trainer's drafter registry, under its checkpoint volume (survives trainer restarts)."""


@dataclass(frozen=True)
class JobRef:
    """Identity of one RLJob object."""

    name: str
    namespace: str
    uid: str
    generation: int = 1


STARTUP_PROBE_FAILURES = 90
"""Startup-probe failures, 10 s apart, before the kubelet restarts a loading worker (15 min)."""


def role_specs(spec: RLJobSpec) -> dict[str, RoleSpec]:
    """The roles this job runs (``drafter`` only when the spec asks for it), in ROLES order."""
    roles: dict[str, RoleSpec | None] = {
        "trainer": spec.trainer,
        "verifier": spec.verifier,
        "rollout": spec.rollout,
        "drafter": spec.drafter,
    }
    return {name: role for name, role in roles.items() if role is not None}


def pod_name(job: str, role: str, index: int) -> str:
    return f"{job}-{role}-{index}"


def service_name(job: str, role: str) -> str:
    return f"{job}-{role}"


def configmap_name(job: str) -> str:
    return f"{job}-config"


def secret_name(job: str) -> str:
    """The Secret holding the job's token (``access.job_secret``)."""
    return f"{job}-auth"


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


def labels(job: str, role: str | None = None, index: int | None = None) -> dict[str, str]:
    """Identity labels; the ``longtail.dev/*`` ones select, ``app.kubernetes.io/*`` inform."""
    out = {
        LABEL_JOB: job,
        "app.kubernetes.io/name": "longtail",
        "app.kubernetes.io/instance": job,
        "app.kubernetes.io/part-of": "longtail",
        "app.kubernetes.io/managed-by": MANAGER,
    }
    if role is not None:
        out[LABEL_ROLE] = role
        out["app.kubernetes.io/component"] = role
    if index is not None:
        out[LABEL_INDEX] = str(index)
    return out


def owner_reference(job: JobRef) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(job: JobRef, name: str, lbls: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": lbls,
        "ownerReferences": [owner_reference(job)],
    }


def job_metadata(job: JobRef, name: str) -> dict[str, Any]:
    """Metadata of an object of the job's own (name, namespace, the job's label, owner)."""
    return _metadata(job, name, labels(job.name))


def role_port(settings: Settings, role: str) -> int:
    """The HTTP port a role's worker listens on (status, control, health, metrics)."""
    if role == "trainer":
        return settings.trainer_port
    if role == "verifier":
        return settings.verifier_port
    return settings.worker_port


def _resources(role: RoleSpec) -> dict[str, Any]:
    amounts: dict[str, str] = {"cpu": str(role.resources.cpu), "memory": str(role.resources.memory)}
    if role.resources.gpus > 0:
        amounts[GPU_RESOURCE] = str(role.resources.gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def checkpoint_path(spec: RLJobSpec) -> str:
    """Where checkpoints live inside the pods (relative locations resolve under WORK_DIR)."""
    location = spec.checkpoint.location
    return location if location.startswith("/") else posixpath.join(WORK_DIR, location)


def trainer_host(job: JobRef) -> str:
    """Stable DNS name of trainer pod 0 (rank 0), the one trainer pod that serves HTTP (status,
    checkpoint, weights, drafters) and the rendezvous: ``<job>-trainer-0.<job>-trainer.<ns>.svc``.
    """
    svc = f"{service_name(job.name, 'trainer')}.{job.namespace}.svc"
    return f"{pod_name(job.name, 'trainer', 0)}.{svc}"


def trainer_local_world_size(spec: RLJobSpec) -> int:
    """Trainer ranks per pod: one per GPU, one on CPU."""
    return max(1, spec.trainer.resources.gpus)


def trainer_world(spec: RLJobSpec) -> str:
    """The trainer world as a label value, ``<pods>x<ranks per pod>`` (``2x8``)."""
    return f"{spec.trainer.replicas}x{trainer_local_world_size(spec)}"


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


def worker_pod(
    job: JobRef,
    spec: RLJobSpec,
    settings: Settings,
    role: str,
    index: int,
    *,
    min_policy_version: int = 0,
    min_drafter_version: int = -1,
    trainer_group: int = 0,
) -> dict[str, Any]:
    """One worker pod. ``min_*_version``: what the job has published so far; a (re)created
    pod gets them as ``PodEnv.min_*_version`` (informational); the trainer names the policy
    version in every generate call, so the pod loads it (and the newest drafter) before it
    generates.
    ``trainer_group``: a trainer pod's group number (``status.trainer.restarts``)."""
    role_spec = role_specs(spec)[role]
    port = role_port(settings, role)
    told = replace(
        pod_env(job, spec, settings, role, index),
        min_policy_version=min_policy_version,
        min_drafter_version=min_drafter_version,
    )
    env = container_env(told)
    ports = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    rdzv_names: set[str] = set()
    if role == "trainer":
        rdzv = trainer_rendezvous(job, spec, index).to_env()
        rdzv_names = set(rdzv)
        env.extend({"name": k, "value": v} for k, v in rdzv.items())
        ports.append({"name": "rendezvous", "containerPort": RENDEZVOUS_PORT, "protocol": "TCP"})
    sync_args = weight_sync_args(job, spec, settings, role)
    if role == "trainer" and sync_args:
        port_entry = {"containerPort": settings.weight_sync_port, "protocol": "TCP"}
        ports.append({"name": "weight-sync", **port_entry})
    env.append(token_env(job.name))
    if role == "trainer":
        env.extend(tracking_env(spec))
    mounts = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": configmap_name(job.name)}}
    ]
    if role == "trainer":
        claim = spec.checkpoint.persistent_volume_claim
        source = {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
        volumes.append({"name": "checkpoints", **source})
        mounts.append({"name": "checkpoints", "mountPath": checkpoint_path(spec)})
        # With spec.weightSync.hostCopy: spool, the copies of the policy versions the trainer
        # serves are mapped from files here (page cache, reclaimable) on the node's disk:
        # RUN_DIR/weight-spool with RUN_DIR=".". Mounted always: empty and unused otherwise.
        volumes.append({"name": "weight-spool", "emptyDir": {}})
        mounts.append(
            {"name": "weight-spool", "mountPath": posixpath.join(WORK_DIR, WEIGHT_SPOOL_DIR)}
        )
    if role == "rollout" and spec.rollout.engine == "vllm":
        # vLLM's engine processes talk through shared memory; a pod's /dev/shm is 64 MiB.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    probe = {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5}
    container = {
        "name": CONTAINER,
        "image": role_spec.image or settings.worker_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["longtail"],
        "args": ["worker", role, "--host", "0.0.0.0", "--port", str(port), *sync_args],
        "workingDir": WORK_DIR,
        "ports": ports,
        "env": env,
        "resources": _resources(role_spec),
        "volumeMounts": mounts,
        # A crash's last log lines (a traceback) become the termination message, which the
        # operator puts in the WorkerFailed event before it deletes the failed pod.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "readinessProbe": probe,
        # The port opens once the model is loaded (and vLLM's engine started): minutes for a
        # large model, so liveness only counts from then on.
        "startupProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": STARTUP_PROBE_FAILURES,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
    }
    name = pod_name(job.name, role, index)
    identity = labels(job.name, role, index)
    if role == "trainer":  # which group and world the pod belongs to (trainergroup.py)
        identity[LABEL_TRAINER_GROUP] = str(trainer_group)
        identity[LABEL_TRAINER_WORLD] = trainer_world(spec)
    pod: dict[str, Any] = {
        "metadata": {**_metadata(job, name, dict(identity)), "annotations": {}},
        "spec": {
            # Never: a crashed worker shows up as a Failed pod, which the operator counts
            # against backoffLimit and replaces (an in-place restart would hide it).
            "restartPolicy": "Never",
            # Workers never call the Kubernetes API: no service account token in the pod (a
            # template may mount one for code of its own).
            "automountServiceAccountToken": False,
            "hostname": name,
            "subdomain": service_name(job.name, role),
            "containers": [container],
            "volumes": volumes,
        },
    }
    override = role_spec.template
    if override:
        pod = deep_merge(pod, {k: v for k, v in override.items() if k in ("metadata", "spec")})
        pod["metadata"]["name"], pod["metadata"]["namespace"] = name, job.namespace
        pod["metadata"]["labels"] = {**pod["metadata"].get("labels", {}), **identity}
        pod["metadata"]["ownerReferences"] = [owner_reference(job)]
        owned = [token_env(job.name)]
        owned += [e for e in env if role == "trainer" and e["name"] in rdzv_names]
        owned += tracking_env(spec) if role == "trainer" else []
        _keep_owned_env(pod["spec"], owned)
    placement = job_gang(spec, settings)
    if placement is not None:  # joins its job's group (gang.py), whatever a template says
        joins = gangs.pod_gang(job.name, placement, role)
        pod["metadata"]["labels"].update(joins.labels)
        pod["metadata"].setdefault("annotations", {}).update(joins.annotations)
        pod["spec"].update(joins.pod_spec, schedulerName=joins.scheduler_name)
    return {"apiVersion": "v1", "kind": "Pod", **pod}


def job_gang(spec: RLJobSpec, settings: Settings) -> GangSpec | None:
    """The gang the job is placed by: its own ``spec.scheduling.gang``, else the install's
    default (``backend: none`` opts out of it)."""
    return effective_gang(spec.scheduling.gang, settings.default_gang)


def gang_group(job: JobRef, spec: RLJobSpec, settings: Settings) -> dict[str, Any]:
    """The job's gang group object (it has a gang, :func:`job_gang`): every pod of every role."""
    placement = job_gang(spec, settings)
    if placement is None:
        raise ValueError(f"RLJob {job.namespace}/{job.name} has no gang")
    minimums = {role: rs.replicas for role, rs in role_specs(spec).items()}
    meta = _metadata(job, gangs.group_name(job.name), labels(job.name))
    return gangs.group_object(placement, minimums, meta)


def _keep_owned_env(pod_spec: dict[str, Any], owned: list[dict[str, Any]]) -> None:
    """The worker container's token (from the job's Secret) and a trainer's rendezvous always
    come from the operator: a template cannot replace or delete them (a worker without the
    token refuses to start; a rank with another world than its pod's labels say would hang
    the group, and the operator plans restarts from those labels)."""
    names = {e["name"] for e in owned}
    for container in pod_spec.get("containers") or []:
        if container.get("name") == CONTAINER:
            env = [e for e in container.get("env") or [] if e.get("name") not in names]
            container["env"] = [*env, *owned]


def role_service(job: JobRef, role: str, settings: Settings) -> dict[str, Any]:
    """Headless Service of one role: stable DNS for each pod (``<pod>.<svc>``) and the set."""
    port = role_port(settings, role)
    ports = [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}]
    if role == "trainer":  # informational: peers reach pod 0 by its DNS name, not the Service
        ports.append(
            {
                "name": "rendezvous",
                "port": RENDEZVOUS_PORT,
                "targetPort": RENDEZVOUS_PORT,
                "protocol": "TCP",
            }
        )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, service_name(job.name, role), labels(job.name, role)),
        "spec": {
            "clusterIP": "None",
            "selector": {LABEL_JOB: job.name, LABEL_ROLE: role},
            # Peers must resolve each other while starting (rendezvous before readiness).
            "publishNotReadyAddresses": True,
            "ports": ports,
        },
    }


def job_configmap(job: JobRef, raw_spec: dict[str, Any]) -> dict[str, Any]:
    """ConfigMap with the job rendered as an RLJob manifest (the API server's defaults
    included), which workers load with ``longtail_api.manifest.validate_manifest``."""
    manifest = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": job.name, "namespace": job.namespace},
        "spec": raw_spec,
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, configmap_name(job.name), labels(job.name)),
        "data": {CONFIG_FILE: yaml.safe_dump(manifest, sort_keys=True)},
    }


def desired_pods(spec: RLJobSpec) -> dict[str, tuple[str, int]]:
    """``{pod name suffix-free key: (role, index)}`` of every worker pod the spec asks for,
    keyed by ``(role, index)`` rendered as ``<role>-<index>``."""
    return {
        f"{role}-{i}": (role, i)
        for role, role_spec in role_specs(spec).items()
        for i in range(role_spec.replicas)
    }


def gpus_of(spec: RLJobSpec, role: str) -> int:
    """GPUs of one replica of ``role``."""
    return role_specs(spec)[role].resources.gpus
