"""Read RLJob manifests (YAML files or dicts) and validate them as a whole.

Entry point for ``longtail validate``, ``longtail run`` and the operator's admission of a
spec. YAML is read the way kubectl reads it (YAML 1.2 numbers, so ``1e-6`` is a float, and
duplicate keys are an error rather than silently last-wins). Validation covers the envelope
(apiVersion, kind, metadata.name), every spec field, and the cross-field rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from longtail_api import API_VERSION, KIND, rules
from longtail_api.defaulting import apply_defaults
from longtail_api.spec import RLJobSpec
from longtail_api.validation import FieldError, parse

MAX_NAME_LENGTH = 40
"""Longest RLJob name: pod names ``<name>-<role>-<index>`` must stay within 63 characters."""

_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_ENVELOPE_KEYS = ("apiVersion", "kind", "metadata", "spec", "status")


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 floats and an error on duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML's default) reads 1e-6 as a string; YAML 1.2 and kubectl read a float.
_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:float"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
        r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


class ManifestError(ValueError):
    """A file that cannot be read as YAML at all (syntax, duplicate keys, missing file)."""


def load_yaml_documents(path: str | Path) -> list[Any]:
    """All non-empty YAML documents of a file, read like kubectl reads them."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError(f"{p}: cannot read file: {exc.strerror or exc}") from exc
    try:
        return [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(f"{p}: not valid YAML: {exc}") from exc


@dataclass
class ValidationResult:
    """Outcome of validating one RLJob manifest."""

    name: str | None
    """metadata.name, when present."""
    spec: RLJobSpec | None
    """The parsed spec with defaults filled in; None when it could not be built."""
    errors: list[FieldError] = field(default_factory=list)
    """Every problem found, field-level first, then cross-field."""
    labels: dict[str, str] = field(default_factory=dict)
    """metadata.labels (string values only): what the job asks of the cluster beside its spec
    (Kueue's queue label), for checks that need them (``rules.placement_errors``)."""

    @property
    def ok(self) -> bool:
        return not self.errors


def _envelope(obj: dict[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    if obj.get("apiVersion") != API_VERSION:
        errors.append(FieldError("apiVersion", f"must be '{API_VERSION}'", obj.get("apiVersion")))
    if obj.get("kind") != KIND:
        errors.append(FieldError("kind", f"must be '{KIND}'", obj.get("kind")))
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        errors.append(FieldError("metadata", "must be a mapping with a name", meta))
        return errors
    name = meta.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > MAX_NAME_LENGTH:
        errors.append(
            FieldError(
                "metadata.name",
                f"must be a lowercase DNS label of at most {MAX_NAME_LENGTH} characters",
                name,
                "use letters, digits and '-', starting with a letter",
            )
        )
    for key in obj:
        if key not in _ENVELOPE_KEYS:
            errors.append(FieldError(str(key), "unknown top-level field", fix="remove it"))
    return errors


def validate_manifest(obj: Any) -> ValidationResult:
    """Validate one RLJob object (a dict as read from YAML or from the API server)."""
    if not isinstance(obj, dict):
        return ValidationResult(None, None, [FieldError("(document)", "must be a mapping", obj)])
    errors = _envelope(obj)
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if "spec" not in obj:
        errors.append(FieldError("spec", "is required"))
        return ValidationResult(name if isinstance(name, str) else None, None, errors)
    spec, field_errors = parse(RLJobSpec, obj["spec"], "spec")
    errors += field_errors
    if spec is not None:
        spec = apply_defaults(spec, obj["spec"])
        errors += rules.check(spec, field_errors)
    raw_labels = meta.get("labels") if isinstance(meta, dict) else None
    labels = (
        {str(k): v for k, v in raw_labels.items() if isinstance(v, str)}
        if isinstance(raw_labels, dict)
        else {}
    )
    return ValidationResult(name if isinstance(name, str) else None, spec, errors, labels)


def validate_file(path: str | Path) -> list[ValidationResult]:
    """Validate every RLJob document in a file. Raises :class:`ManifestError` if unreadable."""
    docs = load_yaml_documents(path)
    if not docs:
        raise ManifestError(f"{path}: no YAML documents found")
    return [validate_manifest(d) for d in docs]
