"""Defaults that depend on other fields of the spec, applied once after parsing.

Called by :func:`longtail_api.manifest.validate_manifest` (so by every reader of an RLJob: the
CLI, ``longtail run``, the workers and the operator) between parsing and the cross-field rules,
as a Kubernetes defaulting step fills a field from its neighbours. The CRD carries no default
for these fields, so the API server stores what the user wrote and every reader resolves it
the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from longtail_api.policies import default_strategies
from longtail_api.spec import RLJobSpec


def apply_defaults(spec: RLJobSpec, raw: Any) -> RLJobSpec:
    """``spec`` (parsed from the mapping ``raw``) with its engine-dependent defaults filled:
    ``speculative.strategies``, when the user lists none, becomes the set of the job's
    ``rollout.engine`` (:func:`~longtail_api.policies.default_strategies`)."""
    speculative = raw.get("speculative") if isinstance(raw, Mapping) else None
    if isinstance(speculative, Mapping) and speculative.get("strategies") is not None:
        return spec
    training = spec.drafter_training
    learned = training.enabled or bool(training.initial_drafter)
    strategies = default_strategies(spec.rollout.engine, learned=learned)
    return dataclasses.replace(
        spec, speculative=dataclasses.replace(spec.speculative, strategies=strategies)
    )
