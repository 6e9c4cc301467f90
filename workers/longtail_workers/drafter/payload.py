"""One drafter as one in-memory body: what the drafter exchange sends and receives.

Used by ``exchange.py`` on both sides (the trainer's endpoints and the rollout workers'
``RemoteDrafterRegistry``) and by tests that build upload bodies. Layout: an 8-byte
little-endian manifest length, a JSON manifest ``{"format", "config", "meta", "weightsBytes",
"weightsSha256"}`` (the drafter's ``config.json``, a published version's ``version.json`` or
null for a candidate, and the size and sha256 of the weights), then the ``model.safetensors``
bytes ``save_drafter`` writes. Built and parsed in memory like the policy weights
(``weights/http_sync.py``); a payload that does not parse or hash is a ``ValueError`` naming
its source.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longtail_workers.drafter.checkpoint import CONFIG_FILE, WEIGHTS_FILE, config_text
from longtail_workers.drafter.registry import DRAFTER_FILES, META_FILE
from longtail_workers.weights.checksum import sha256_hex

PAYLOAD_FORMAT = "longtail-drafter-payload/1"
_MANIFEST_LEN = struct.Struct("<Q")
MAX_MANIFEST_BYTES = 1 << 20
"""Largest manifest a payload may carry (it holds two small JSON objects)."""


@dataclass(frozen=True)
class DrafterPayload:
    """One drafter as the exchange sends it (see the module text for the byte layout)."""

    config: dict[str, Any]
    """The drafter's ``config.json`` (``checkpoint.drafter_config``)."""
    weights: bytes
    """The ``model.safetensors`` bytes (``checkpoint.drafter_weights_bytes``)."""
    meta: dict[str, Any] | None = None
    """A published version's ``version.json``; None for a candidate."""

    def pack(self) -> bytes:
        """The payload's bytes: manifest length, manifest, weights."""
        manifest = json.dumps({
            "format": PAYLOAD_FORMAT, "config": self.config, "meta": self.meta,
            "weightsBytes": len(self.weights), "weightsSha256": sha256_hex(self.weights),
        }, sort_keys=True).encode()  # fmt: skip
        return _MANIFEST_LEN.pack(len(manifest)) + manifest + self.weights

    @classmethod
    def unpack(cls, data: bytes, source: str) -> DrafterPayload:
        """Parse and check a payload; ``ValueError`` naming ``source`` and the problem."""
        head = _MANIFEST_LEN.size
        size = _MANIFEST_LEN.unpack_from(data)[0] if len(data) >= head else -1
        if not 0 < size <= min(MAX_MANIFEST_BYTES, len(data) - head):
            raise ValueError(
                f"{source}: not a drafter payload (no manifest length in the first {head} "
                f"bytes); send DrafterPayload.pack()'s bytes ({PAYLOAD_FORMAT})"
            )
        try:
            manifest = json.loads(data[head : head + size])
            if manifest["format"] != PAYLOAD_FORMAT:
                raise ValueError(f"format {manifest['format']!r}, expected {PAYLOAD_FORMAT!r}")
            config, meta = manifest["config"], manifest["meta"]
            weights = data[head + size :]
            if len(weights) != manifest["weightsBytes"]:
                raise ValueError(f"{len(weights)} weight bytes, manifest says "
                                 f"{manifest['weightsBytes']}")  # fmt: skip
            if sha256_hex(weights) != manifest["weightsSha256"]:
                raise ValueError("the weights do not hash to the manifest's weightsSha256")
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{source}: not a drafter payload ({exc})") from exc
        if not isinstance(config, dict) or not isinstance(meta, dict | None):
            raise ValueError(f"{source}: the payload's config and meta must be JSON objects")
        return cls(config, weights, meta)

    @classmethod
    def of_files(cls, files: Mapping[str, bytes], source: str) -> DrafterPayload:
        """The payload of a drafter directory's files: ``config.json``, ``model.safetensors``
        and, for a published version, ``version.json``."""
        unknown = sorted(set(files) - {*DRAFTER_FILES, META_FILE})
        missing = [name for name in DRAFTER_FILES if name not in files]
        if unknown or missing:
            raise ValueError(f"{source}: a drafter is {', '.join(DRAFTER_FILES)} [+ {META_FILE}]; "
                             f"unexpected {unknown}, missing {missing}")  # fmt: skip
        try:
            meta = json.loads(files[META_FILE]) if META_FILE in files else None
            return cls(json.loads(files[CONFIG_FILE]), files[WEIGHTS_FILE], meta)
        except ValueError as exc:
            raise ValueError(f"{source}: {CONFIG_FILE} or {META_FILE} is not JSON ({exc})") from exc

    def files(self) -> dict[str, bytes]:
        """The drafter's files as ``save_drafter`` writes them (what the registry stores)."""
        return {CONFIG_FILE: config_text(self.config).encode(), WEIGHTS_FILE: self.weights}


def pack_files(files: Mapping[str, bytes]) -> bytes:
    """The payload bytes of a drafter directory's files (see :meth:`DrafterPayload.of_files`)."""
    return DrafterPayload.of_files(files, "pack_files").pack()


def read_files(directory: Path, names: tuple[str, ...]) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in names}
