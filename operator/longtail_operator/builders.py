"""Pure manifest builders: an RLJob's spec in, the pods, Services and ConfigMap it needs out.

No Kubernetes client here: every function takes plain values (the job's identity, the parsed
:class:`~longtail_api.spec.RLJobSpec`, :class:`~longtail_operator.settings.Settings`) and
returns plain dicts, so the unit tests read them directly and ``children.py`` puts them in the
job's desired set. Names and labels are ``naming.py``'s (re-exported here: the pod contract's
public face). A worker pod (:func:`worker_pod`) is a base pod plus the parts of its role
(:data:`PARTS`: ports, environment, volumes, mounts, labels, flags from small functions), folded
in one place; a template (``spec.<role>.template``) is merged over it and cannot replace the
operator's own variables; the gang's labels and the job's ``priorityClassName`` come last.
The trainer pods form one torch.distributed group: each gets the rendezvous environment
(:func:`trainer_rendezvous`, ``longtail_api.rendezvous``) with pod 0's stable DNS name as
``MASTER_ADDR``, and labels naming its group and world (``trainergroup.py`` plans it). The
worker contract (args, the environment typed as ``longtail_api.podenv.PodEnv``,
:func:`pod_env`) is documented in docs/operator.md;
``spec.weightSync``'s flags are :func:`weight_sync_args`. Every pod gets the job's token
(``TOKEN_ENV``) from the Secret ``<job>-auth`` (:func:`token_env`); the Secret and the
NetworkPolicies themselves are built in ``access.py``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import yaml

from longtail_api import API_VERSION, KIND
from longtail_api.podenv import WEIGHT_SPOOL_DIR
from longtail_api.scheduling import GangSpec, effective_gang
from longtail_api.spec import RLJobSpec, RoleSpec
from longtail_operator import gang as gangs
from longtail_operator.merge import deep_merge
from longtail_operator.naming import (
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_ROLE,
    LABEL_TRAINER_GROUP,
    LABEL_TRAINER_WORLD,
    MANAGER,
    ROLES,
    WORK_DIR,
    JobRef,
    checkpoint_path,
    configmap_name,
    desired_pods,
    gpus_of,
    job_metadata,
    labels,
    owner_reference,
    pod_name,
    role_port,
    role_specs,
    secret_name,
    service_name,
    trainer_host,
    trainer_local_world_size,
    trainer_world,
)
from longtail_operator.naming import metadata as _metadata
from longtail_operator.settings import Settings
from longtail_operator.workerenv import (
    CONFIG_DIR,
    CONFIG_FILE,
    DRAFTERS_SUBDIR,
    RENDEZVOUS_PORT,
    container_env,
    pod_env,
    token_env,
    tracking_env,
    trainer_rendezvous,
    weight_sync_address,
    weight_sync_args,
)

__all__ = [
    "CONFIG_DIR",
    "CONFIG_FILE",
    "CONTAINER",
    "DRAFTERS_SUBDIR",
    "GPU_RESOURCE",
    "LABEL_INDEX",
    "LABEL_JOB",
    "LABEL_ROLE",
    "LABEL_TRAINER_GROUP",
    "LABEL_TRAINER_WORLD",
    "MANAGER",
    "PARTS",
    "RENDEZVOUS_PORT",
    "ROLES",
    "STARTUP_PROBE_FAILURES",
    "WORK_DIR",
    "JobRef",
    "PodFacts",
    "PodPart",
    "checkpoint_path",
    "configmap_name",
    "container_env",
    "desired_pods",
    "gang_group",
    "gpus_of",
    "job_configmap",
    "job_gang",
    "job_metadata",
    "labels",
    "owner_reference",
    "pod_env",
    "pod_name",
    "role_port",
    "role_service",
    "role_specs",
    "secret_name",
    "service_name",
    "token_env",
    "tracking_env",
    "trainer_host",
    "trainer_local_world_size",
    "trainer_rendezvous",
    "trainer_world",
    "weight_sync_address",
    "weight_sync_args",
    "worker_pod",
]

GPU_RESOURCE = "nvidia.com/gpu"
CONTAINER = "worker"
STARTUP_PROBE_FAILURES = 90
"""Startup-probe failures, 10 s apart, before the kubelet restarts a loading worker (15 min)."""


def _resources(role: RoleSpec) -> dict[str, Any]:
    amounts: dict[str, str] = {"cpu": str(role.resources.cpu), "memory": str(role.resources.memory)}
    if role.resources.gpus > 0:
        amounts[GPU_RESOURCE] = str(role.resources.gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)}


@dataclass(frozen=True)
class PodFacts:
    """What the parts of one worker pod are built from."""

    job: JobRef
    spec: RLJobSpec
    settings: Settings
    role: str
    index: int
    trainer_group: int = 0
    """A trainer pod's group number (``status.trainer.restarts``)."""


@dataclass(frozen=True)
class PodPart:
    """One concern's share of a worker pod, folded into the base pod by :func:`worker_pod`.
    ``env``: variables the operator owns (a template can neither replace nor delete them)."""

    ports: tuple[dict[str, Any], ...] = ()
    env: tuple[dict[str, Any], ...] = ()
    volumes: tuple[dict[str, Any], ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()

    def __add__(self, other: PodPart) -> PodPart:
        return PodPart(*(a + b for a, b in zip(_fields(self), _fields(other), strict=True)))


def _fields(part: PodPart) -> tuple[tuple[Any, ...], ...]:
    return (part.ports, part.env, part.volumes, part.mounts, part.labels, part.args)


def _tcp(name: str, port: int) -> dict[str, Any]:
    return {"name": name, "containerPort": port, "protocol": "TCP"}


def _volume(name: str, path: str, source: dict[str, Any]) -> PodPart:
    return PodPart(volumes=({"name": name, **source},), mounts=({"name": name, "mountPath": path},))


def _rendezvous(f: PodFacts) -> PodPart:
    """The trainer's torch.distributed rendezvous (rank 0 on pod 0 serves the store)."""
    env = trainer_rendezvous(f.job, f.spec, f.index).to_env()
    return PodPart(
        ports=(_tcp("rendezvous", RENDEZVOUS_PORT),),
        env=tuple({"name": k, "value": v} for k, v in env.items()),
    )


def _weight_sync_store(f: PodFacts) -> PodPart:
    """The trainer's ``spec.weightSync`` flags, and the store's port when it broadcasts."""
    args = tuple(weight_sync_args(f.job, f.spec, f.settings, f.role))
    ports = (_tcp("weight-sync", f.settings.weight_sync_port),) if args else ()
    return PodPart(ports=ports, args=args)


def _weight_sync_client(f: PodFacts) -> PodPart:
    """A rollout worker's ``spec.weightSync`` flags (the store's address when broadcast)."""
    return PodPart(args=tuple(weight_sync_args(f.job, f.spec, f.settings, f.role)))


def _token(f: PodFacts) -> PodPart:
    return PodPart(env=(token_env(f.job.name),))


def _tracking(f: PodFacts) -> PodPart:
    return PodPart(env=tuple(tracking_env(f.spec)))


def _checkpoints(f: PodFacts) -> PodPart:
    claim = f.spec.checkpoint.persistent_volume_claim
    source = {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
    return _volume("checkpoints", checkpoint_path(f.spec), source)


def _weight_spool(f: PodFacts) -> PodPart:
    """With ``spec.weightSync.hostCopy: spool``, the copies of the policy versions the trainer
    serves are mapped from files here (page cache, reclaimable) on the node's disk:
    RUN_DIR/weight-spool with RUN_DIR=".". Mounted always: empty and unused otherwise."""
    return _volume("weight-spool", posixpath.join(WORK_DIR, WEIGHT_SPOOL_DIR), {"emptyDir": {}})


def _shared_memory(f: PodFacts) -> PodPart:
    """vLLM's engine processes talk through shared memory; a pod's /dev/shm is 64 MiB."""
    if f.spec.rollout.engine != "vllm":
        return PodPart()
    return _volume("dshm", "/dev/shm", {"emptyDir": {"medium": "Memory"}})


def _trainer_group(f: PodFacts) -> PodPart:
    """Which group and world the pod belongs to (``trainergroup.py``)."""
    group = (
        (LABEL_TRAINER_GROUP, str(f.trainer_group)),
        (LABEL_TRAINER_WORLD, trainer_world(f.spec)),
    )
    return PodPart(labels=group)


PARTS: dict[str, tuple[Callable[[PodFacts], PodPart], ...]] = {
    "trainer": (
        _rendezvous,
        _weight_sync_store,
        _token,
        _tracking,
        _checkpoints,
        _weight_spool,
        _trainer_group,
    ),
    "verifier": (_token,),
    "rollout": (_weight_sync_client, _token, _shared_memory),
    "drafter": (_token,),
}
"""The parts of each role's pods, in the order their ports, variables and volumes appear."""


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
    """One worker pod: the base pod plus its role's :data:`PARTS`, then its template, then its
    gang. ``min_*_version``: what the job has published so far; a (re)created pod gets them as
    ``PodEnv.min_*_version`` (informational); the trainer names the policy version in every
    generate call, so the pod loads it (and the newest drafter) before it generates.
    ``trainer_group``: a trainer pod's group number (``status.trainer.restarts``)."""
    facts = PodFacts(job, spec, settings, role, index, trainer_group)
    part = sum((make(facts) for make in PARTS[role]), PodPart())
    told = replace(
        pod_env(job, spec, settings, role, index),
        min_policy_version=min_policy_version,
        min_drafter_version=min_drafter_version,
    )
    pod = _base_pod(facts, container_env(told), part)
    template = role_specs(spec)[role].template
    if template:
        pod = _with_template(pod, template, facts, part)
    placement = job_gang(spec, settings)
    if placement is not None:  # joins its job's group (gang.py), whatever a template says
        joins = gangs.pod_gang(job.name, placement, role)
        pod["metadata"]["labels"].update(joins.labels)
        pod["metadata"].setdefault("annotations", {}).update(joins.annotations)
        pod["spec"].update(joins.pod_spec, schedulerName=joins.scheduler_name)
    if spec.scheduling.priority_class_name:  # the job's class, whatever a template says
        pod["spec"]["priorityClassName"] = spec.scheduling.priority_class_name
    return {"apiVersion": "v1", "kind": "Pod", **pod}


def _with_template(
    pod: dict[str, Any], template: dict[str, Any], f: PodFacts, part: PodPart
) -> dict[str, Any]:
    """``template`` merged over ``pod``; the identity, the owner and the operator's own
    variables stay the operator's."""
    pod = deep_merge(pod, {k: v for k, v in template.items() if k in ("metadata", "spec")})
    meta = pod["metadata"]
    meta["name"], meta["namespace"] = pod_name(f.job.name, f.role, f.index), f.job.namespace
    meta["labels"] = {**meta.get("labels", {}), **_identity(f, part)}
    meta["ownerReferences"] = [owner_reference(f.job)]
    _keep_owned_env(pod["spec"], list(part.env))
    return pod


def _identity(f: PodFacts, part: PodPart) -> dict[str, str]:
    return {**labels(f.job.name, f.role, f.index), **dict(part.labels)}


def _base_pod(f: PodFacts, env: list[dict[str, Any]], part: PodPart) -> dict[str, Any]:
    """The pod every role shares, with ``part`` folded in."""
    port = role_port(f.settings, f.role)
    name = pod_name(f.job.name, f.role, f.index)
    config = _volume("config", CONFIG_DIR, {"configMap": {"name": configmap_name(f.job.name)}})
    mounts = [{**config.mounts[0], "readOnly": True}, *part.mounts]
    health = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10}
    container = {
        "name": CONTAINER,
        "image": role_specs(f.spec)[f.role].image or f.settings.worker_image,
        "imagePullPolicy": f.settings.image_pull_policy,
        "command": ["longtail"],
        "args": ["worker", f.role, "--host", "0.0.0.0", "--port", str(port), *part.args],
        "workingDir": WORK_DIR,
        "ports": [_tcp("http", port), *part.ports],
        "env": [*env, *part.env],
        "resources": _resources(role_specs(f.spec)[f.role]),
        "volumeMounts": mounts,
        # A crash's last log lines (a traceback) become the termination message, which the
        # operator puts in the WorkerFailed event before it deletes the failed pod.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5},
        # The port opens once the model is loaded (and vLLM's engine started): minutes for a
        # large model, so liveness only counts from then on.
        "startupProbe": {**health, "failureThreshold": STARTUP_PROBE_FAILURES},
        "livenessProbe": {**health, "failureThreshold": 6},
    }
    return {
        "metadata": {**_metadata(f.job, name, _identity(f, part)), "annotations": {}},
        "spec": {
            # Never: a crashed worker shows up as a Failed pod, which the operator counts
            # against backoffLimit and replaces (an in-place restart would hide it).
            "restartPolicy": "Never",
            # Workers never call the Kubernetes API: no service account token in the pod (a
            # template may mount one for code of its own).
            "automountServiceAccountToken": False,
            "hostname": name,
            "subdomain": service_name(f.job.name, f.role),
            "containers": [container],
            "volumes": [*config.volumes, *part.volumes],
        },
    }


def job_gang(spec: RLJobSpec, settings: Settings) -> GangSpec | None:
    """The gang the job is placed by: its own ``spec.scheduling.gang``, else the install's
    default (``backend: none`` opts out of it)."""
    return effective_gang(spec.scheduling.gang, settings.default_gang)


def gang_group(
    job: JobRef, spec: RLJobSpec, settings: Settings, kueue: bool = False
) -> dict[str, Any]:
    """The job's gang group object (it has a gang, :func:`job_gang`): every pod of every role,
    with the job's topology unless Kueue places it (``kueue``: the job has the queue label)."""
    placement = job_gang(spec, settings)
    if placement is None:
        raise ValueError(f"RLJob {job.namespace}/{job.name} has no gang")
    minimums = {role: rs.replicas for role, rs in role_specs(spec).items()}
    meta = _metadata(job, gangs.group_name(job.name), labels(job.name))
    topology = [] if kueue else spec.scheduling.topology
    replicas = {role: rs.replicas for role, rs in role_specs(spec).items()}
    return gangs.group_object(
        placement, minimums, meta, topology, spec.scheduling.priority_class_name, replicas
    )


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
