"""Policy weight sync by torch.distributed broadcast: gloo on CPU, NCCL on GPU.

For placements where the trainer and the rollout workers share a process group (one job, one
``init_process_group``), this is faster than HTTP pull: no serialisation server, and NCCL moves
GPU tensors directly. The trainer (rank ``src``, 0 by default) calls
:meth:`DistWeightPublisher.publish`; every other rank calls :meth:`DistWeightReceiver.fetch`
(or ``load_into``) at the same point, because a broadcast is a collective.

Protocol, per publish: one ``broadcast_object_list`` with a header (version, sha256 of the
canonical bytes, size, and ``(name, dtype, shape, nbytes)`` per tensor in sorted key order),
then one ``broadcast`` per tensor, sent as raw bytes (a ``uint8`` view) so every dtype works on
every backend (gloo has no bfloat16 reductions, bytes need none). Receivers verify the checksum
and the version only *after* the last broadcast: raising earlier would leave the sender waiting
in a collective the receiver never joins, and the whole job would hang. The header is pickled by
``broadcast_object_list``, which is fine inside one job's process group (no outside input).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from longtail_workers.weights.checksum import (
    canonical_tensors,
    dtype_map,
    serialize_state_dict,
    sha256_hex,
    state_dict_checksum,
)
from longtail_workers.weights.sync import (
    StateDict,
    WeightIntegrityError,
    WeightPublisher,
    WeightsManifest,
    WeightSource,
    WeightSyncError,
    WeightVersionError,
)


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: str  # e.g. "bfloat16"
    shape: tuple[int, ...]
    nbytes: int


class _DistEndpoint:
    """Shared set-up: the group, the source rank and the device the buffers live on."""

    def __init__(
        self,
        *,
        group: dist.ProcessGroup | None = None,
        src: int = 0,
        device: torch.device | str | None = None,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialised; call dist.init_process_group(...) "
                "(gloo on CPU, nccl on GPU) before creating a distributed weight sync"
            )
        self.group = group
        self.src = src
        self.device = torch.device(device) if device is not None else _default_device(group)

    @property
    def _object_device(self) -> torch.device | None:
        # broadcast_object_list stages the pickled header on this device (NCCL needs CUDA).
        return self.device if self.device.type == "cuda" else None

    def _broadcast_bytes(self, buf: torch.Tensor) -> None:
        if buf.numel() > 0:  # both sides skip empty tensors, so the collectives still pair up
            dist.broadcast(buf, src=self.src, group=self.group)


class DistWeightPublisher(_DistEndpoint, WeightPublisher):
    """Rank ``src``: broadcast a version to every other rank of ``group``."""

    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> WeightsManifest:
        if dist.get_rank() != self.src:
            raise RuntimeError(
                f"DistWeightPublisher.publish on rank {dist.get_rank()}: only the source rank "
                f"{self.src} publishes; other ranks call DistWeightReceiver.fetch()"
            )
        tensors = canonical_tensors(state_dict)
        data = serialize_state_dict(tensors)
        manifest = WeightsManifest(
            version=version, checksum=sha256_hex(data), size=len(data), dtypes=dtype_map(tensors)
        )
        del data  # only its hash travels; the tensors go as raw bytes below
        entries = [
            _Entry(k, manifest.dtypes[k], tuple(t.shape), t.numel() * t.element_size())
            for k, t in tensors.items()
        ]
        header: list[object] = [
            {"version": version, "checksum": manifest.checksum, "size": manifest.size,
             "entries": [(e.name, e.dtype, e.shape, e.nbytes) for e in entries]}
        ]  # fmt: skip
        with _lost_rank_is_an_error(version):
            dist.broadcast_object_list(
                header, src=self.src, group=self.group, device=self._object_device
            )
        for entry in entries:
            raw = tensors[entry.name].reshape(-1).view(torch.uint8).to(self.device)  # [nbytes]
            with _lost_rank_is_an_error(version):
                self._broadcast_bytes(raw)
        return manifest


@contextlib.contextmanager
def _lost_rank_is_an_error(version: int) -> Iterator[None]:
    """Around one collective: gloo and NCCL report a dead or hung peer as a RuntimeError
    (``Connection closed by peer``, a timeout); say what it means for the run instead."""
    try:
        yield
    except RuntimeError as exc:
        raise WeightSyncLostRankError(version, exc) from exc


class WeightSyncLostRankError(WeightSyncError):
    """A broadcast failed because a rank of the process group stopped or cannot be reached."""

    def __init__(self, version: int, cause: BaseException) -> None:
        first = str(cause).strip().splitlines()[0][:300] if str(cause).strip() else repr(cause)
        super().__init__(
            f"weight sync (torch.distributed) could not broadcast policy version {version}: a "
            f"rollout worker of the process group stopped or is unreachable ({first}). A process "
            "group cannot lose a member, so the run stops here with its last checkpoint intact: "
            "restart the workers and resume (`longtail run --resume RUN_DIR`; on a cluster the "
            "operator recreates the pods and the trainer resumes from its checkpoint), or use "
            "--weight-sync http, which re-dispatches a lost worker's prompts and goes on"
        )
        self.version = version


class DistWeightReceiver(_DistEndpoint, WeightSource):
    """Every rank but ``src``: receive the version rank ``src`` is broadcasting."""

    def fetch(self, version: int | None = None) -> tuple[int, StateDict]:
        """Receive the next broadcast; ``version`` (if given) must be the one that arrives."""
        if dist.get_rank() == self.src:
            raise RuntimeError(
                f"DistWeightReceiver.fetch on the source rank {self.src}: it publishes instead"
            )
        received: list[object] = [None]
        dist.broadcast_object_list(
            received, src=self.src, group=self.group, device=self._object_device
        )
        # A malformed header is fatal for the job (the number of broadcasts that follow is
        # unknown); everything after it is checked only once all broadcasts are received.
        got_version, expected, entries = _parse_header(received[0])
        raw: list[torch.Tensor] = []
        for entry in entries:
            buf = torch.empty(entry.nbytes, dtype=torch.uint8, device=self.device)  # [nbytes]
            self._broadcast_bytes(buf)
            raw.append(buf)
        # Every collective of this publish is done: failing now cannot desynchronise the ranks.
        tensors: StateDict = {
            e.name: buf.cpu().view(_dtype(e.dtype)).reshape(e.shape)
            for e, buf in zip(entries, raw, strict=True)
        }
        actual = state_dict_checksum(tensors)
        source = f"torch.distributed rank {self.src}"
        if actual != expected:
            raise WeightIntegrityError(got_version, expected, actual, source=source)
        if version is not None and got_version != version:
            raise WeightVersionError(
                f"expected policy version {version} from {source}, received {got_version}; "
                "nothing was loaded (are the trainer and workers at the same step?)",
                requested=version,
                received=got_version,
            )
        return got_version, tensors


def _default_device(group: dist.ProcessGroup | None) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise WeightSyncError(f"weight header names unknown dtype {name!r}")
    return dtype


def _parse_header(obj: object) -> tuple[int, str, list[_Entry]]:
    """``(version, checksum, entries)`` from the broadcast header, validated."""
    try:
        if not isinstance(obj, dict):
            raise TypeError("header is not a dict")
        version, checksum = int(obj["version"]), str(obj["checksum"])
        entries = [
            _Entry(str(n), str(d), tuple(int(x) for x in s), int(b))
            for n, d, s, b in obj["entries"]
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise WeightSyncError(
            f"malformed weight header from the source rank ({type(obj).__name__}): {exc}; "
            "are all ranks running the same longtail version?"
        ) from exc
    return version, checksum, entries
