"""Longtail's shared, pure package: the RLJob API and everything both sides agree on.

The operator (``longtail_operator``) and the workers (``longtail_workers``) both import this
package; it imports neither of them, nor torch, transformers, vllm or kopf (an import-linter
contract in ``make test`` enforces that). It holds the typed RLJob spec and status, their
validation, the CRD generated from them, worker protocol types and metric names.
"""

__version__ = "0.1.0"

GROUP = "longtail.dev"
"""API group of every Longtail custom resource."""

VERSION = "v1alpha1"
"""Served and stored version of the RLJob resource."""

API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLJob"
PLURAL = "rljobs"
SINGULAR = "rljob"
SHORT_NAMES = ("rlj",)
