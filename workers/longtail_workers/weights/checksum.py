"""Canonical bytes and sha256 of a state dict, shared by every weight-sync transport.

The trainer hashes what it publishes and each rollout worker hashes what it received; both use
:func:`state_dict_checksum`, so the HTTP and the torch.distributed paths agree on what "the same
weights" means. The canonical form is the safetensors serialisation of the state dict with keys
in sorted order, every tensor detached, contiguous and on the CPU, and no metadata (metadata
would make the hash depend on things other than the weights). safetensors writes a JSON header
(name, dtype, shape, offsets) and the raw little-endian data, so two state dicts have the same
checksum exactly when they have the same names, dtypes, shapes and bits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch
from safetensors.torch import save


def canonical_tensors(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state_dict`` as detached, contiguous CPU tensors in sorted key order.

    Tensors that share storage with an earlier one (tied embedding and LM head, the usual case
    in small Qwen2 models) are cloned: safetensors refuses shared storage, and the receiving
    model re-ties them anyway because ``load_state_dict`` copies into its own parameters.
    """
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for key in sorted(state_dict):
        tensor = state_dict[key]
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"state dict entry {key!r} is a {type(tensor).__name__}, not a tensor; "
                "publish model.state_dict() (tensors only)"
            )
        tensor = tensor.detach().to("cpu").contiguous()
        storage = (tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
        if storage in seen and tensor.numel() > 0:
            tensor = tensor.clone()
        seen.add(storage)
        out[key] = tensor
    return out


def serialize_state_dict(state_dict: Mapping[str, torch.Tensor]) -> bytes:
    """The canonical safetensors bytes of ``state_dict`` (see the module docstring)."""
    if not state_dict:
        raise ValueError("cannot serialise an empty state dict: there are no weights to publish")
    return save(canonical_tensors(state_dict))


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    """Lower-case hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def state_dict_checksum(state_dict: Mapping[str, torch.Tensor]) -> str:
    """sha256 (hex) of the canonical bytes of ``state_dict``."""
    return sha256_hex(serialize_state_dict(state_dict))
