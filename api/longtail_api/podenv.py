"""The worker pod's environment: every ``LONGTAIL_*`` variable, named once.

The operator (``longtail_operator.builders.worker_pod``) builds a :class:`PodEnv` per pod and
writes :meth:`PodEnv.to_env` (plus :data:`FIELD_REFS`, the downward-API values only the kubelet
knows, and the token from the job's Secret) into the container; the workers
(``longtail_workers.podenv.pod_args``) read it back with :meth:`PodEnv.from_env` and turn it into
command-line defaults. The variables of a worker process that are not about the pod (the token,
``longtail run``'s parent pid, the model cache) are named here too, so ``LONGTAIL_`` is spelled
in one module; ``tests/unit/api/test_podenv_contract.py`` checks both sides stay joined. The
trainer group's rendezvous (torchrun's names) is :mod:`longtail_api.rendezvous`. The contract
for users is documented in docs/operator.md.

Pure module: standard library and ``longtail_api`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

JOB_NAME = "LONGTAIL_JOB_NAME"
NAMESPACE = "LONGTAIL_NAMESPACE"
ROLE = "LONGTAIL_ROLE"
REPLICA_INDEX = "LONGTAIL_REPLICA_INDEX"
REPLICAS = "LONGTAIL_REPLICAS"
CONFIG = "LONGTAIL_CONFIG"
CHECKPOINT_DIR = "LONGTAIL_CHECKPOINT_DIR"
RESUME = "LONGTAIL_RESUME"
TRAINER_URL = "LONGTAIL_TRAINER_URL"
WEIGHTS_URL = "LONGTAIL_WEIGHTS_URL"
DRAFTER_DIR = "LONGTAIL_DRAFTER_DIR"
DRAFTER_URL = "LONGTAIL_DRAFTER_URL"
MIN_POLICY_VERSION = "LONGTAIL_MIN_POLICY_VERSION"
MIN_DRAFTER_VERSION = "LONGTAIL_MIN_DRAFTER_VERSION"
POD_NAME = "LONGTAIL_POD_NAME"
POD_IP = "LONGTAIL_POD_IP"
RUN_DIR = "LONGTAIL_RUN_DIR"
"""Optional, never written by the operator: ``--run-dir`` of a trainer pod (default ``.``)."""
WEIGHT_SPOOL_DIR = "weight-spool"
"""Not a variable: the trainer's weight spool directory, relative to its run directory (the
default of ``--weight-spool-dir``); the operator mounts an emptyDir there, so the spooled
policy versions sit on the node's local disk, not in the container's writable layer."""

AUTH_TOKEN = "LONGTAIL_AUTH_TOKEN"
"""The job's token (``longtail_api.auth``): from the job's Secret in a pod, set by
``longtail run`` for its children."""
INSECURE_NO_AUTH = "LONGTAIL_INSECURE_NO_AUTH"
"""``1``/``true``: run a worker without a token (development only, ``--insecure-no-auth``)."""
PARENT_PID = "LONGTAIL_PARENT_PID"
"""Set by ``longtail run`` on each child: the pid its watchdog (``parentwatch.py``) follows."""
CACHE_DIR = "LONGTAIL_CACHE_DIR"
"""Root of the model/drafter cache (``models/cache.py``; default ``~/.cache/longtail``)."""
WEIGHT_SYNC_ADDR = "LONGTAIL_WEIGHT_SYNC_ADDR"
"""Optional, never written by the operator (it passes ``--weight-sync-addr``): a broadcast
receiver's default ``--weight-sync-addr HOST:PORT``, the trainer's weight-sync store."""
WEIGHT_SYNC_PORT = "LONGTAIL_WEIGHT_SYNC_PORT"
"""Optional, never written by the operator (it passes ``--weight-sync-port``): the trainer's
default ``--weight-sync-port``, where rank 0 serves the weight-sync store."""

ROLES = ("trainer", "verifier", "rollout", "drafter")
"""Roles that can have a peer Service (``LONGTAIL_<ROLE>_SERVICE`` / ``_PORT``)."""
FIELD_REFS: Mapping[str, str] = {POD_NAME: "metadata.name", POD_IP: "status.podIP"}
"""Variables the operator fills from the downward API (``valueFrom.fieldRef``), not a value."""


class PodEnvError(ValueError):
    """A ``LONGTAIL_*`` variable is missing or malformed; the message names it and its value."""


def service_var(role: str) -> str:
    """``LONGTAIL_<ROLE>_SERVICE``: the DNS name of ``role``'s headless Service."""
    return f"LONGTAIL_{role.upper()}_SERVICE"


def port_var(role: str) -> str:
    """``LONGTAIL_<ROLE>_PORT``: the HTTP port of ``role``'s workers."""
    return f"LONGTAIL_{role.upper()}_PORT"


@dataclass(frozen=True)
class Peer:
    """One role's headless Service, as a pod reaches it."""

    service: str
    """DNS name of the Service (``<job>-<role>.<namespace>.svc``)."""
    port: int
    """The role's HTTP port (status, control, metrics)."""


@dataclass(frozen=True)
class PodEnv:
    """What the operator tells a worker pod. Every field is optional (None: not set), so one
    type serves the writer, which sets what the role needs, and the reader, which checks what
    its role needs (``longtail_workers.podenv``). Fields the workers do not read are kept for
    the people and the user code in the pod (docs/operator.md lists them); each says so."""

    job_name: str | None = None
    """The RLJob's name; a trainer pod names its rollout peers ``<job>-rollout-<i>`` with it."""
    namespace: str | None = None
    """Informational (for users' code and ``kubectl exec``): the job's namespace."""
    role: str | None = None
    """Informational: this pod's role (the container's args say it to the worker)."""
    replica_index: int | None = None
    """Informational: this pod's index in its role."""
    replicas: int | None = None
    """Informational: the role's replica count when the pod was made."""
    config: str | None = None
    """Path of the job's config file in the pod (``--job``). Unset: not in a pod, nothing is
    derived from the environment."""
    checkpoint_dir: str | None = None
    """Trainer: ``--checkpoint-dir`` (``spec.checkpoint.location`` inside the pod)."""
    resume: bool | None = None
    """Trainer: ``--resume`` when true (``spec.checkpoint.resume``)."""
    trainer_url: str | None = None
    """Drafter pods: ``--trainer-url``, trainer pod 0's HTTP base URL."""
    weights_url: str | None = None
    """Rollout/drafter: ``--weights-url``; trainer: its port is ``--weights-port``."""
    drafter_dir: str | None = None
    """Trainer (and a rollout pod with a shared volume): ``--drafters``, the registry dir."""
    drafter_url: str | None = None
    """Rollout/drafter: ``--drafters-url``, the trainer's drafter exchange."""
    min_policy_version: int | None = None
    """Informational: the job's policy version when the pod was made (a rollout worker loads
    the version every generate call names, so it needs no floor)."""
    min_drafter_version: int | None = None
    """Informational: the job's drafter version when the pod was made (-1: none yet)."""
    peers: Mapping[str, Peer] = field(default_factory=dict)
    """Every role's Service; the trainer reads the verifier's and the rollout role's."""
    pod_name: str | None = None
    """Rollout/drafter: ``--name`` (downward API, :data:`FIELD_REFS`; never in :meth:`to_env`)."""
    pod_ip: str | None = None
    """Informational: the pod's IP (downward API, :data:`FIELD_REFS`)."""
    run_dir: str | None = None
    """Trainer: ``--run-dir`` (never written by the operator; a user template may set it)."""

    def __post_init__(self) -> None:
        for name, url in ((TRAINER_URL, self.trainer_url), (WEIGHTS_URL, self.weights_url),
                          (DRAFTER_URL, self.drafter_url)):  # fmt: skip
            if url is not None:
                check_http_url(name, url)
        for role in self.peers:
            if role not in ROLES:
                raise PodEnvError(f"{service_var(role)}: unknown role {role!r} (one of {ROLES})")

    def to_env(self) -> dict[str, str]:
        """The variables with a value, in a fixed order (the downward-API ones excluded)."""
        values: dict[str, object] = {
            JOB_NAME: self.job_name, NAMESPACE: self.namespace, ROLE: self.role,
            REPLICA_INDEX: self.replica_index, REPLICAS: self.replicas, CONFIG: self.config,
            CHECKPOINT_DIR: self.checkpoint_dir,
            RESUME: None if self.resume is None else ("true" if self.resume else "false"),
            TRAINER_URL: self.trainer_url, WEIGHTS_URL: self.weights_url, RUN_DIR: self.run_dir,
        }  # fmt: skip
        for role, peer in self.peers.items():
            values[service_var(role)], values[port_var(role)] = peer.service, peer.port
        values |= {DRAFTER_DIR: self.drafter_dir, DRAFTER_URL: self.drafter_url,
                   MIN_POLICY_VERSION: self.min_policy_version,
                   MIN_DRAFTER_VERSION: self.min_drafter_version}  # fmt: skip
        return {name: str(value) for name, value in values.items() if value is not None}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> PodEnv:
        """The pod's variables in ``environ`` (blank counts as unset). A malformed value raises
        :class:`PodEnvError` naming the variable and the value."""

        def text(name: str) -> str | None:
            return environ.get(name, "").strip() or None

        peers = {}
        for role in ROLES:
            service = text(service_var(role))
            if service is not None:
                port = _int(port_var(role), text(port_var(role)))
                if port is None:
                    raise PodEnvError(f"{service_var(role)} is set but {port_var(role)} is not")
                peers[role] = Peer(service, port)
        resume = text(RESUME)
        return cls(
            job_name=text(JOB_NAME), namespace=text(NAMESPACE), role=text(ROLE),
            replica_index=_int(REPLICA_INDEX, text(REPLICA_INDEX)),
            replicas=_int(REPLICAS, text(REPLICAS)), config=text(CONFIG),
            checkpoint_dir=text(CHECKPOINT_DIR),
            # Anything but "true" is false, as before the type existed (a user template's "1").
            resume=None if resume is None else resume.lower() == "true",
            trainer_url=text(TRAINER_URL), weights_url=text(WEIGHTS_URL),
            drafter_dir=text(DRAFTER_DIR), drafter_url=text(DRAFTER_URL),
            min_policy_version=_int(MIN_POLICY_VERSION, text(MIN_POLICY_VERSION)),
            min_drafter_version=_int(MIN_DRAFTER_VERSION, text(MIN_DRAFTER_VERSION)),
            peers=peers, pod_name=text(POD_NAME), pod_ip=text(POD_IP), run_dir=text(RUN_DIR),
        )  # fmt: skip


def check_http_url(name: str, url: str) -> str:
    """``url`` when it is ``http(s)://HOST:PORT[/...]``; else :class:`PodEnvError` naming
    ``name``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise PodEnvError(f"{name}={url!r}: expected http://HOST:PORT")
    return url


def _int(name: str, raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise PodEnvError(f"{name}={raw!r}: expected an integer") from None


# Every variable this module names; the contract test checks the two sides against it.
NAMES: frozenset[str] = frozenset(
    {JOB_NAME, NAMESPACE, ROLE, REPLICA_INDEX, REPLICAS, CONFIG, CHECKPOINT_DIR, RESUME,
     TRAINER_URL, WEIGHTS_URL, DRAFTER_DIR, DRAFTER_URL, MIN_POLICY_VERSION, MIN_DRAFTER_VERSION,
     POD_NAME, POD_IP, RUN_DIR, AUTH_TOKEN, INSECURE_NO_AUTH, PARENT_PID, CACHE_DIR,
     WEIGHT_SYNC_ADDR, WEIGHT_SYNC_PORT}
    | {service_var(r) for r in ROLES} | {port_var(r) for r in ROLES}
)  # fmt: skip
