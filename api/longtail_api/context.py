"""Does a job's answer budget fit its model's context window?

Every prompt plus ``algorithm.maxNewTokens`` must fit the model's ``max_position_embeddings``,
or the rollout workers refuse the job's generate calls (400) and the run fails. Checked with
what each caller can see cheaply, always naming ``spec.algorithm.maxNewTokens`` and the fix:

- a built-in model (:data:`BUILTIN_MODEL_POSITIONS`): by the spec's validation itself
  (``rules._context``), so whatever validates a spec refuses it, the operator included (an
  invalid edit: a running job keeps its last accepted spec);
- ``longtail validate`` (``longtail_cli/main.py``) and ``longtail run`` (``local/run.py``)
  before anything starts, when :func:`model_positions` knows the context without loading the
  model (also a local directory's ``config.json``, which only they can read); a prompt counts
  as at least one token there;
- the trainer at start (``trainer/setup.py``), with the loaded model's context and the
  longest tokenized prompt of the job's datasets.

Pure module: standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path

from longtail_api.spec import RLJobSpec
from longtail_api.validation import FieldError

BUILTIN_MODEL_POSITIONS: dict[str, int] = {"builtin:tiny": 2048, "builtin:small": 4096}
"""Context of the built-in models (their recipes' ``max_position_embeddings``,
``workers/longtail_workers/models/recipe.py``; a test keeps them equal)."""

FIELD = "spec.algorithm.maxNewTokens"


def model_positions(model_path: str) -> int | None:
    """``max_position_embeddings`` of ``model.path`` when known without loading the model.

    None when it is not known here: another built-in name, or a directory that is not on this
    machine (a path inside the worker pods) or whose ``config.json`` does not say.
    """
    if model_path in BUILTIN_MODEL_POSITIONS:
        return BUILTIN_MODEL_POSITIONS[model_path]
    if model_path.startswith("builtin:"):
        return None
    config = Path(model_path).expanduser() / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # not readable from here: the workers check it when they load the model
    value = data.get("max_position_embeddings") if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def context_error(
    max_new_tokens: int, positions: int, model: str, longest_prompt: int | None = None
) -> FieldError | None:
    """The error when ``max_new_tokens`` + the longest prompt exceeds ``positions``, else None.

    ``longest_prompt``: tokens of the job's longest prompt; None when unknown (counted as 1).
    """
    prompt = 1 if longest_prompt is None else longest_prompt
    if max_new_tokens + prompt <= positions:
        return None
    room = positions - prompt
    what = (
        "the prompt (at least 1 token)"
        if longest_prompt is None
        else f"the job's longest prompt ({longest_prompt} tokens)"
    )
    fix = f"set algorithm.maxNewTokens to at most {room}" if room >= 1 else "shorten the prompts"
    if longest_prompt is None:
        fix += " minus the longest prompt's tokens"
    return FieldError(
        FIELD,
        f"plus {what} does not fit the context of {model} (max_position_embeddings "
        f"{positions}); the rollout workers would refuse every generate call",
        max_new_tokens,
        f"{fix}, or use a model with a longer context",
    )


def spec_context_error(spec: RLJobSpec) -> FieldError | None:
    """:func:`context_error` of a validated spec when its model's context is known here."""
    positions = model_positions(spec.model.path)
    if positions is None:
        return None
    return context_error(spec.algorithm.max_new_tokens, positions, spec.model.path)
