"""Field metadata for the typed API dataclasses: bounds, enums, names and docstrings.

The spec and status dataclasses (``spec.py``, ``status.py``) declare each field with
:func:`spec_field` and document it with an attribute docstring (a string literal on the line
after the field, the Sphinx convention). Two readers use what is declared here:
``validation.py`` (turns a user's dict into dataclasses, collecting every error) and
``schema.py`` (writes the CRD's openAPIV3Schema). Keeping bounds and docs on the field itself
is what makes the dataclasses the one source of truth for the RLJob API.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import textwrap
from dataclasses import dataclass
from typing import Any

_META_KEY = "longtail"
DEFAULT_DOC_KEY = "longtail.default_doc"
"""Field metadata: the reference's wording of a default that depends on other fields."""


@dataclass(frozen=True)
class Constraints:
    """Bounds and shape rules of one field, shared by validation and the CRD schema."""

    minimum: float | None = None
    """Smallest allowed value (inclusive)."""
    maximum: float | None = None
    """Largest allowed value (inclusive)."""
    exclusive_minimum: bool = False
    """When true, ``minimum`` itself is not allowed."""
    exclusive_maximum: bool = False
    """When true, ``maximum`` itself is not allowed."""
    pattern: str | None = None
    """Regular expression a string must match (anchored by the pattern itself)."""
    pattern_hint: str | None = None
    """Human wording of ``pattern`` used in error messages."""
    min_length: int | None = None
    """Shortest allowed string."""
    max_length: int | None = None
    """Longest allowed string."""
    min_items: int | None = None
    """Fewest allowed list items."""
    max_items: int | None = None
    """Most allowed list items."""
    free_form: bool = False
    """An object whose content Kubernetes keeps as is (pod template overrides)."""
    finite: bool = False
    """Refuse NaN and infinities (wire bodies: JSON as Python writes it may carry them)."""
    fix: str | None = None
    """Advice appended to every error about this field."""


def spec_field(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    exclusive_maximum: bool = False,
    pattern: str | None = None,
    pattern_hint: str | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    min_items: int | None = None,
    max_items: int | None = None,
    free_form: bool = False,
    fix: str | None = None,
    default_doc: str | None = None,
) -> Any:
    """A ``dataclasses.field`` that also carries :class:`Constraints` for this field;
    ``default_doc`` is what the reference says of a default that depends on other fields
    (defaulting.py), in place of the programmatic default."""
    meta = Constraints(
        minimum=minimum,
        maximum=maximum,
        exclusive_minimum=exclusive_minimum,
        exclusive_maximum=exclusive_maximum,
        pattern=pattern,
        pattern_hint=pattern_hint,
        min_length=min_length,
        max_length=max_length,
        min_items=min_items,
        max_items=max_items,
        free_form=free_form,
        fix=fix,
    )
    kwargs: dict[str, Any] = {"metadata": {_META_KEY: meta}}
    if default_doc is not None:
        kwargs["metadata"][DEFAULT_DOC_KEY] = default_doc
    if default is not dataclasses.MISSING:
        kwargs["default"] = default
    if default_factory is not dataclasses.MISSING:
        kwargs["default_factory"] = default_factory
    return dataclasses.field(**kwargs)


def constraints(f: dataclasses.Field[Any]) -> Constraints:
    """The constraints declared on a field (empty ones when it used a plain field)."""
    meta = f.metadata.get(_META_KEY)
    return meta if isinstance(meta, Constraints) else Constraints()


def format_number(x: float) -> str:
    """A bound as users write it: ``1`` rather than ``1.0``, ``0.5`` as is."""
    return str(int(x)) if float(x).is_integer() else str(x)


ACRONYMS: dict[str, str] = {"mb": "MB"}
"""Name parts written in capitals in JSON, as Kubernetes writes ``podIP``: ``bucket_mb`` ->
``bucketMB``."""


def to_camel(name: str) -> str:
    """Python attribute name -> Kubernetes-style JSON name: ``top_p`` -> ``topP``."""
    head, *rest = name.split("_")
    return head + "".join(ACRONYMS.get(part, part[:1].upper() + part[1:]) for part in rest)


WIRE_NAME = "wire_name"
"""Field metadata key of a JSON name that is not the camelCase of the field's
(``field(metadata={WIRE_NAME: "id"})``)."""


def json_name(f: dataclasses.Field[Any]) -> str:
    """The name a field has in YAML/JSON."""
    return f.metadata.get(WIRE_NAME) or to_camel(f.name)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass and its bases: ``{python_name: doc}``.

    Read from the source with ``ast`` because Python keeps no runtime record of them.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def class_doc(cls: type) -> str:
    """First paragraph of a class docstring, used as the schema description of an object."""
    doc = inspect.getdoc(cls) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()
