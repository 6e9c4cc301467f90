"""Load a policy (model + tokenizer) from ``model.path`` of an RLJob: one code path for all models.

``builtin:<name>`` is first resolved to a directory in Longtail's cache (``builtin:tiny`` and
``builtin:small`` are built there on first use, see :mod:`longtail_workers.models.builtin`);
from then on a built-in model and a user's Qwen2.5 directory go through exactly the same
``AutoModelForCausalLM.from_pretrained`` + ``AutoTokenizer.from_pretrained`` calls, so the
built-in models exercise the real loading path.

Called by every worker role that needs the policy (rollout engine, trainer, drafter trainer) and
by benchmarks. Errors name the offending value and say how to fix it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from longtail_workers.models.builtin import ensure_small, ensure_tiny

BUILTIN_PREFIX = "builtin:"
# name -> function returning the (possibly freshly built) model directory; api/longtail_api/
# context.py's BUILTIN_MODEL_POSITIONS lists the same names (a test keeps them equal)
BUILTIN_MODELS: dict[str, Callable[[], Path]] = {"tiny": ensure_tiny, "small": ensure_small}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Any of these marks a saved tokenizer. Checked up front because AutoTokenizer on a qwen2
# directory without them silently returns an empty Qwen2Tokenizer instead of failing.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def resolve_model_path(path: str) -> Path:
    """The Hugging Face directory behind ``path``, building a ``builtin:`` model if needed.

    Raises ValueError for an unknown builtin name, FileNotFoundError / NotADirectoryError when
    the directory or its ``config.json`` is missing.
    """
    if path.startswith(BUILTIN_PREFIX):
        name = path[len(BUILTIN_PREFIX) :]
        if name not in BUILTIN_MODELS:
            known = ", ".join(BUILTIN_PREFIX + n for n in sorted(BUILTIN_MODELS))
            raise ValueError(
                f"model.path: unknown built-in model {path!r}; known built-in models: {known} "
                f"(or give a local Hugging Face model directory)"
            )
        return BUILTIN_MODELS[name]()
    directory = Path(path).expanduser()
    if not directory.exists():
        raise FileNotFoundError(
            f"model.path: directory {str(directory)!r} does not exist; give a local Hugging Face "
            f"model directory (config.json, weights, tokenizer files) mounted into the worker, "
            f"or builtin:tiny"
        )
    if not directory.is_dir():
        raise NotADirectoryError(
            f"model.path: {str(directory)!r} is a file, not a directory; give the directory that "
            f"holds config.json, the weights and the tokenizer files"
        )
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"model.path: {str(directory)!r} has no config.json, so it is not a Hugging Face "
            f"model directory; point model.path at the directory saved with save_pretrained "
            f"(the one containing config.json), or use builtin:tiny"
        )
    return directory


def resolve_device(device: str) -> torch.device:
    """``device`` as a torch.device; a CUDA device must exist."""
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise ValueError(
            f"device: {device!r} is not a torch device; use 'cpu', 'cuda' or 'cuda:<index>'"
        ) from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device: {device!r} asked for CUDA but no CUDA GPU is visible to this process; "
            f"use device='cpu' or run the worker on a GPU node"
        )
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` = float32 on CPU, bfloat16 on CUDA; otherwise one of :data:`DTYPES`."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(
            f"model.dtype: {dtype!r} is not supported; use one of auto, {', '.join(DTYPES)}"
        )
    return DTYPES[dtype]


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    """The directory's tokenizer; a missing pad token falls back to EOS (batching needs one)."""
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(
            f"model.path: {str(model_dir)!r} has no tokenizer files (none of "
            f"{', '.join(TOKENIZER_FILES)}); save the tokenizer next to the model with "
            f"tokenizer.save_pretrained({str(model_dir)!r})"
        )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(
    path: str, dtype: str = "auto", device: str = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the policy at ``path`` (a Hugging Face directory or ``builtin:<name>``) in eval mode.

    ``dtype``: auto | float32 | bfloat16 | float16 (auto = float32 on CPU, bfloat16 on CUDA).
    """
    target = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, target)  # checked before a builtin model is built
    model_dir = resolve_model_path(path)
    tokenizer = load_tokenizer(model_dir)  # first: it fails fast, the weights take longer
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype)
    # transformers wraps Module.to with functools.wraps, which mypy cannot bind to the instance.
    model.to(target)  # type: ignore[arg-type]
    model.eval()
    return model, tokenizer
