"""Names, labels and identities of an RLJob's objects: the vocabulary every builder shares.

Pure and at the bottom of the operator's builders: ``builders.py`` (pods, Services, the
ConfigMap), ``access.py`` (Secret, NetworkPolicies), ``children.py`` (the desired set) and the
planner name objects with these functions, so each name is spelled in one place. Naming: pod
``<job>-<role>-<index>``, headless Service ``<job>-<role>``, ConfigMap ``<job>-config``, Secret
``<job>-auth``. Every object carries the ``longtail.dev/*`` and ``app.kubernetes.io/*`` labels
and a controller owner reference to the RLJob, so deleting the RLJob garbage-collects it.
``builders.py`` re-exports these names, the public face of the pod contract.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from longtail_api import API_VERSION, KIND
from longtail_api.spec import RLJobSpec, RoleSpec
from longtail_operator.settings import Settings

LABEL_JOB = "longtail.dev/rljob"
LABEL_ROLE = "longtail.dev/role"
LABEL_INDEX = "longtail.dev/replica-index"
LABEL_TRAINER_GROUP = "longtail.dev/trainer-group"
"""Trainer pods: ``status.trainer.restarts`` when the pod was made (its group's number)."""
LABEL_TRAINER_WORLD = "longtail.dev/trainer-world"
"""Trainer pods: ``<replicas>x<ranks per pod>`` of the world the pod was made for."""
ROLES: tuple[str, ...] = ("trainer", "verifier", "rollout", "drafter")
"""Worker roles, in creation order (the trainer first: the others discover it)."""
WORK_DIR = "/var/lib/longtail"
"""Working directory of worker containers; relative checkpoint locations resolve under it."""
MANAGER = "longtail-operator"


@dataclass(frozen=True)
class JobRef:
    """Identity of one RLJob object."""

    name: str
    namespace: str
    uid: str
    generation: int = 1


def role_specs(spec: RLJobSpec) -> dict[str, RoleSpec]:
    """The roles this job runs (``drafter`` only when the spec asks for it), in ROLES order."""
    roles: dict[str, RoleSpec | None] = {
        "trainer": spec.trainer,
        "verifier": spec.verifier,
        "rollout": spec.rollout,
        "drafter": spec.drafter,
    }
    return {name: role for name, role in roles.items() if role is not None}


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


def pod_name(job: str, role: str, index: int) -> str:
    return f"{job}-{role}-{index}"


def service_name(job: str, role: str) -> str:
    return f"{job}-{role}"


def configmap_name(job: str) -> str:
    return f"{job}-config"


def secret_name(job: str) -> str:
    """The Secret holding the job's token (``access.job_secret``)."""
    return f"{job}-auth"


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


def metadata(job: JobRef, name: str, lbls: dict[str, str]) -> dict[str, Any]:
    """Metadata of one of the job's objects: name, namespace, labels, owner reference."""
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": lbls,
        "ownerReferences": [owner_reference(job)],
    }


def job_metadata(job: JobRef, name: str) -> dict[str, Any]:
    """Metadata of an object of the job's own (name, namespace, the job's label, owner)."""
    return metadata(job, name, labels(job.name))


def role_port(settings: Settings, role: str) -> int:
    """The HTTP port a role's worker listens on (status, control, health, metrics)."""
    if role == "trainer":
        return settings.trainer_port
    if role == "verifier":
        return settings.verifier_port
    return settings.worker_port


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
