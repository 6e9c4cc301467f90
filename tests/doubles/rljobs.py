"""RLJob manifests the API tests start from: the smallest valid job and the fields a vLLM job
needs (imported by the API tests)."""

from __future__ import annotations

from typing import Any

MINIMAL: dict[str, Any] = {
    "apiVersion": "longtail.dev/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "job"},
    "spec": {"model": {"path": "builtin:tiny"}, "dataset": {"path": "builtin:arith"}},
}
VLLM: dict[str, Any] = {"rollout": {"engine": "vllm"}, "drafterTraining": {"layout": "eagle1"}}
