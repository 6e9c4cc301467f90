"""``spec.tracking``: parsed, and bad settings refused naming the field, the value and a fix."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from longtail_api.manifest import validate_manifest

MINIMAL: dict[str, Any] = {
    "apiVersion": "longtail.dev/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "job"},
    "spec": {"model": {"path": "builtin:tiny"}, "dataset": {"path": "builtin:arith"}},
}


def errors(tracking: dict[str, Any]) -> list[str]:
    obj = copy.deepcopy(MINIMAL)
    obj["spec"]["tracking"] = tracking
    return [str(e) for e in validate_manifest(obj).errors]


def test_every_backend_parses_with_its_defaults() -> None:
    obj = copy.deepcopy(MINIMAL)
    obj["spec"]["tracking"] = {
        "tensorboard": {"logDir": "/data/tb"},
        "mlflow": {"trackingUri": "http://mlflow.mlflow.svc:5000"},
        "wandb": {"project": "rl", "apiKeySecret": {"name": "wandb"}},
    }
    result = validate_manifest(obj)
    assert result.ok, result.errors
    assert result.spec is not None
    t = result.spec.tracking
    assert t.backends() == ["tensorboard", "mlflow", "wandb"]
    assert t.mlflow is not None and t.mlflow.experiment == "longtail"
    assert t.wandb is not None and t.wandb.mode == "online"
    assert t.wandb.api_key_secret is not None and t.wandb.api_key_secret.key == "api-key"


@pytest.mark.parametrize(
    ("tracking", "expected"),
    [
        ({"comet": {}}, "spec.tracking.comet: unknown field (remove it. Known: tensorboard,"),
        ({"mlflow": {"trackingUri": "mlflow:5000"}},
         "spec.tracking.mlflow.trackingUri: must be an MLflow tracking URI"),
        ({"mlflow": {"trackingUri": "http://"}}, "got 'http://' (e.g. http://mlflow."),
        ({"wandb": {"project": "rl"}},
         "spec.tracking.wandb.apiKeySecret: is required with mode: online"),
        ({"wandb": {"project": "rl", "mode": "cloud"}},
         "spec.tracking.wandb.mode: must be one of 'online', 'offline', got 'cloud'"),
    ],
)  # fmt: skip
def test_bad_settings_are_refused_naming_field_value_and_fix(
    tracking: dict[str, Any], expected: str
) -> None:
    found = errors(tracking)
    assert any(expected in e for e in found), found


def test_offline_wandb_needs_no_secret() -> None:
    assert errors({"wandb": {"project": "rl", "mode": "offline"}}) == []
