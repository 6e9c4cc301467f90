"""``spec.tracking``: where the trainer logs each step for experiment trackers.

Typed like the other spec blocks (``spec.py``): ``validation.py`` parses it, ``schema.py``
writes it into the CRD, ``docgen.py`` into docs/rljob-reference.md. Read by the trainer's
tracking sinks (``longtail_workers.tracking``), by ``longtail run --tracking`` (which writes a
backend into the run's job file) and by the operator, which gives the trainer pod the Weights &
Biases key from the named Secret (:data:`WANDB_API_KEY_ENV`). The key itself never appears in
the spec. :func:`tracking_errors` holds the cross-field checks (``rules.py`` runs them).

Pure module: standard library and ``longtail_api`` only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from longtail_api.fields import spec_field
from longtail_api.validation import FieldError

MLFLOW_URI_PATTERN = (
    r"^(https?://[A-Za-z0-9.\-_\[\]:]+(:[0-9]+)?(/\S*)?|file:(//)?/\S+"
    r"|databricks(-uc)?(://\S*)?)$"
)
"""A tracking URI MLflow's client takes: a tracking server, a local file store, Databricks."""
MLFLOW_URI_HINT = (
    "an MLflow tracking URI: http(s)://HOST[:PORT][/PATH] of a tracking server, "
    "file:///ABSOLUTE/PATH, or databricks"
)
MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"
"""Where the URI comes from when ``tracking.mlflow.trackingUri`` is empty."""
WANDB_API_KEY_ENV = "WANDB_API_KEY"
"""The trainer's Weights & Biases key: from ``apiKeySecret`` in a pod, from the environment of
``longtail run``."""
TRACKING_BACKENDS = ("tensorboard", "mlflow", "wandb")
"""The backends, in the order the trainer opens them (``longtail run --tracking NAME``)."""


@dataclass
class SecretKeyRef:
    """A key of a Kubernetes Secret in the job's namespace."""

    name: str = spec_field(min_length=1, fix="name the Secret that holds the key")
    """The Secret's name."""
    key: str = spec_field("api-key", min_length=1)
    """The key within the Secret."""


@dataclass
class TensorBoardSpec:
    """TensorBoard event files (``tensorboard --logdir DIR`` serves them)."""

    log_dir: str | None = spec_field(None, min_length=1)
    """Directory of the event files; empty: ``tensorboard/`` in the trainer's run directory.
    In a pod, name a mounted volume (``trainer.template``) so the files outlive the pod."""


@dataclass
class MlflowSpec:
    """An MLflow tracking server (or store): one MLflow run per RLJob."""

    tracking_uri: str | None = spec_field(
        None, pattern=MLFLOW_URI_PATTERN, pattern_hint=MLFLOW_URI_HINT,
        fix="e.g. http://mlflow.mlflow.svc:5000; or leave it empty and set MLFLOW_TRACKING_URI",
    )  # fmt: skip
    """Tracking URI; empty: the trainer's ``MLFLOW_TRACKING_URI`` environment variable, and
    with neither, MLflow tracking is off for the run (a warning says so)."""
    experiment: str = spec_field("longtail", min_length=1, max_length=500)
    """Experiment the run is logged under (created when missing)."""


@dataclass
class WandbSpec:
    """Weights & Biases: one W&B run per RLJob."""

    project: str = spec_field(min_length=1, max_length=128, fix="name the W&B project")
    """W&B project."""
    entity: str | None = spec_field(None, min_length=1)
    """W&B entity (user or team); empty: the key's default entity."""
    mode: Literal["online", "offline"] = spec_field("online")
    """``online`` sends to the W&B server; ``offline`` writes the run under the trainer's run
    directory (``wandb/``) for a later ``wandb sync``."""
    api_key_secret: SecretKeyRef | None = spec_field(None)
    """Secret holding the API key (online mode): the operator sets the trainer pod's
    ``WANDB_API_KEY`` from it; ``longtail run`` reads ``WANDB_API_KEY`` from its environment."""


@dataclass
class TrackingSpec:
    """Experiment trackers the trainer (rank 0) logs the run to: the spec as parameters, every
    step's figures, and the report and exported drafter at the end. Any of the three; a tracker
    that is down never stops training (its records wait in a bounded buffer)."""

    tensorboard: TensorBoardSpec | None = spec_field(None)
    """TensorBoard event files."""
    mlflow: MlflowSpec | None = spec_field(None)
    """An MLflow tracking server."""
    wandb: WandbSpec | None = spec_field(None)
    """Weights & Biases."""
    buffer_records: int = spec_field(10000, minimum=10, maximum=1_000_000)
    """Records (one per step and backend) held while a tracker is unreachable; past this the
    oldest are dropped and counted (``longtail_trainer_tracking_dropped_total``)."""

    def backends(self) -> list[str]:
        """The configured backends, in :data:`TRACKING_BACKENDS` order."""
        return [name for name in TRACKING_BACKENDS if getattr(self, name) is not None]


def tracking_errors(tracking: TrackingSpec) -> Iterator[FieldError]:
    """Cross-field errors of ``spec.tracking`` (field bounds are checked by the parser)."""
    wandb = tracking.wandb
    if wandb is not None and wandb.mode == "online" and wandb.api_key_secret is None:
        yield FieldError(
            "spec.tracking.wandb.apiKeySecret",
            "is required with mode: online (the key never goes in the spec)",
            fix="create a Secret with the key (kubectl create secret generic wandb "
            "--from-literal=api-key=KEY) and set apiKeySecret: {name: wandb}, or use "
            "mode: offline",
        )
