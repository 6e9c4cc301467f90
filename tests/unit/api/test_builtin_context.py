"""A built-in model's context is part of the spec's validation (issue #48, item 6a): every
caller of ``validate_manifest`` (the operator, ``longtail validate``, ``longtail run``, the
workers) refuses an ``algorithm.maxNewTokens`` that cannot fit it, with one message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from longtail_api.context import BUILTIN_MODEL_POSITIONS
from longtail_api.manifest import validate_manifest

REPO = Path(__file__).resolve().parents[3]


def manifest(model: str, max_new_tokens: int) -> dict[str, Any]:
    m = yaml.safe_load((REPO / "examples" / "01-tiny-arith.yaml").read_text())
    m["spec"]["model"]["path"] = model
    if str(m["spec"]["drafterTraining"].get("initialDrafter", "")).startswith("builtin:"):
        m["spec"]["drafterTraining"]["initialDrafter"] = model  # the model's own drafter
    m["spec"]["algorithm"]["maxNewTokens"] = max_new_tokens
    return m  # type: ignore[no-any-return]


@pytest.mark.parametrize("model", sorted(BUILTIN_MODEL_POSITIONS))
def test_a_builtin_models_context_bounds_max_new_tokens(model: str) -> None:
    positions = BUILTIN_MODEL_POSITIONS[model]
    assert validate_manifest(manifest(model, positions - 1)).ok  # a 1-token prompt fits
    result = validate_manifest(manifest(model, 100000))
    [error] = result.errors
    assert error.path == "spec.algorithm.maxNewTokens"
    assert f"max_position_embeddings {positions}" in str(error) and "got 100000" in str(error)
    assert f"at most {positions - 1}" in str(error)


def test_a_model_whose_context_is_unknown_here_is_not_refused() -> None:
    """A directory inside the worker pods: only they know its context (checked at start)."""
    assert validate_manifest(manifest("/models/qwen", 100000)).ok
