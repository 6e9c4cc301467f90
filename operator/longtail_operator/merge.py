"""Merge a user's pod-template override into a generated pod, strategic-merge style.

Called by ``builders.worker_pod`` with ``spec.<role>.template``. Kubernetes' strategic merge
patch is approximated with the rules that matter for pod templates, so users *add* to the
generated pod instead of replacing it:

- mappings merge key by key, recursively;
- lists of mappings that all carry a ``name`` (containers, env, volumes, volumeMounts, ports)
  merge item by item on ``name``: an override item with a known name is merged into it, a new
  name is appended;
- every other value (scalars, other lists such as tolerations or args) is replaced.

A ``null`` in the override deletes the key, as in a merge patch. Inputs are never mutated.
"""

from __future__ import annotations

import copy
from typing import Any


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(i, dict) and "name" in i for i in items)


def merge_named_lists(base: list[Any], override: list[Any]) -> list[Any]:
    """Merge two lists of ``{name: ...}`` mappings on ``name`` (order: base, then new)."""
    out = [copy.deepcopy(item) for item in base]
    index = {item["name"]: i for i, item in enumerate(out)}
    for item in override:
        at = index.get(item["name"])
        if at is None:
            index[item["name"]] = len(out)
            out.append(copy.deepcopy(item))
        else:
            out[at] = deep_merge(out[at], item)
    return out


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` merged in (see the module text); a new dict."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
            continue
        current = out.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            out[key] = deep_merge(current, value)
        elif isinstance(current, list) and isinstance(value, list) and _named(value):
            if current and not _named(current):
                out[key] = copy.deepcopy(value)  # base is not keyed: replace, like SMP
            else:
                out[key] = merge_named_lists(current, value)
        else:
            out[key] = copy.deepcopy(value)
    return out
