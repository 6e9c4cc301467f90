"""The weight-sync interface: the trainer publishes policy versions, rollout workers load them.

The trainer streams each version into its :class:`WeightPublisher` (the one implementation is
``store.WeightStore``: :meth:`WeightPublisher.publish_stream` after each optimiser step, from
``trainer/group.py``); the store's deliveries take it to the workers (``http_sync``: the
trainer serves versions over HTTP, workers pull, the default, works anywhere; ``broadcast``:
buckets on a process group of its own per attempt, with HTTP catch-up). A rollout worker calls
:meth:`WeightSource.load_into` between rollouts (never during one). ``plan.py`` decides which
transport a job uses, for both sides.

The guarantee every transport gives, and the reason this module exists: **a rollout worker
never generates with a mix of versions.** :func:`apply_state_dict` (used by every
``load_into``) receives a complete state dict whose checksum and version were already verified
by the transport, checks names and shapes against the model, and only then copies; if anything
is wrong it raises before the first parameter is touched, so the model keeps its previous
version whole. (``nn.Module.load_state_dict`` alone is not enough: it copies parameters one by
one and reports shape errors only after copying the others.)
"""

from __future__ import annotations

import abc
import hashlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import nn

from longtail_api.wirecodec import Count

StateDict = dict[str, torch.Tensor]
T = TypeVar("T")


class WeightSyncError(RuntimeError):
    """Base class of weight-sync failures."""


class WeightIntegrityError(WeightSyncError):
    """The bytes received do not hash to the checksum the trainer advertised."""

    def __init__(self, version: int, expected: str, actual: str, source: str) -> None:
        super().__init__(
            f"policy weights version {version} from {source} failed the integrity check: "
            f"advertised sha256 {expected}, received data hashes to {actual}; "
            "nothing was loaded (the model keeps its previous weights). A corrupted transfer "
            "or a trainer publishing non-canonical bytes; fetch again, and if it repeats "
            "compare the trainer's and this worker's longtail versions"
        )
        self.version = version
        self.expected = expected
        self.actual = actual
        self.source = source


class WeightVersionError(WeightSyncError):
    """The version received is not the one asked for, or is not available any more."""

    def __init__(self, message: str, *, requested: int | None, received: int | None) -> None:
        super().__init__(message)
        self.requested = requested
        self.received = received


class WeightFetchError(WeightSyncError):
    """The weights could not be obtained at all (trainer unreachable after all retries)."""


class WeightMismatchError(WeightSyncError, ValueError):
    """The weights do not fit the model (names or shapes differ)."""


@dataclass(frozen=True)
class Piece:
    """One piece of a published version: a byte range of its canonical bytes and its sha256."""

    offset: Count
    """First byte of the piece within the canonical bytes."""
    size: Count
    """Length in bytes (the version's ``piece_bytes``; the last piece may be shorter)."""
    sha256: str
    """sha256 (hex) of those bytes: a receiver refuses the piece (and the version) otherwise."""


@dataclass(frozen=True)
class TensorMeta:
    """One tensor of a policy version as it travels: name, wire dtype and global shape."""

    name: str
    """State-dict key, e.g. ``model.layers.0.mlp.up_proj.weight``."""
    dtype: torch.dtype
    """The dtype it travels (and is loaded) in: the rollout engine's; the sender casts."""
    shape: tuple[int, ...]
    """The whole tensor's shape (for a sharded trainer: the gathered one, not a shard's)."""

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()


TensorStream = Callable[[], Iterator[torch.Tensor]]
"""A fresh pass over a version's tensors, in the order of the layout it was given with (one
whole tensor per item, on any device, any floating dtype: the publisher casts). Each call is
one pass; on a sharded trainer each pass is a gather that every rank joins, so a publisher
that retries calls it again."""


@dataclass
class SyncPhases:
    """Where the trainer's time went in one publish (seconds), and what moved."""

    transport: str
    """``http`` or ``broadcast``."""
    gather_s: float = 0.0
    """Producing the whole tensors (a sharded trainer's all-gathers; 0 when already whole)."""
    pack_s: float = 0.0
    """Casting and copying tensors into pieces/buckets, and hashing them."""
    wire_s: float = 0.0
    """Moving the bytes (broadcast: waiting for the buckets on the wire; http: 0, the
    workers pull afterwards and report their own load times)."""
    bytes: int = 0
    """Bytes of the version as it travels."""
    attempts: int = 1
    """Broadcast attempts this version took (a lost receiver makes one more)."""
    receivers: list[str] = field(default_factory=list)
    """Workers the version reached by broadcast (empty for http)."""
    dropped: list[str] = field(default_factory=list)
    """Workers dropped from this version's broadcast (they catch up over HTTP)."""

    @property
    def total_s(self) -> float:
        return self.gather_s + self.pack_s + self.wire_s


@dataclass(frozen=True)
class WeightsManifest:
    """What the trainer advertises about one published version (the HTTP copy): the body of
    ``GET /v1/weights/latest``, JSON by the wire codec (``records.encode``/``decode``)."""

    version: Count
    size: Count
    """Length of the canonical safetensors bytes (``weights.checksum``)."""
    dtypes: dict[str, str]
    """``{name: dtype}``, e.g. ``{"lm_head.weight": "bfloat16"}``."""
    piece_bytes: Count = 0
    """Size of each piece (0: published without pieces, by a transport that sends it whole)."""
    pieces: tuple[Piece, ...] = ()
    """The canonical bytes cut every ``piece_bytes`` (tensors larger than a piece span
    several), in order: they cover ``[0, size)`` exactly."""
    pieces_sha256: str = ""
    """:func:`pieces_checksum` of ``pieces``: the version's checksum a receiver verifies once
    every piece has matched its own sha256 (it commits to every byte without hashing the whole
    version a second time)."""


CONTENT_TIMEOUT_S = 600.0
"""Longest :meth:`Published.manifest` waits for the hashing that runs after a publish returned
(a 15 GB version's pieces hash in 2-9 s)."""


@dataclass(frozen=True)
class Published:
    """What a publish returns to the trainer: the version as it travelled, where the time went,
    and the hashing still running for it after ``publish`` returned.

    Nothing waits for that hashing on the step's critical path: the broadcast receivers verify
    each bucket's digest, HTTP receivers each piece's sha256 (``manifest`` is done before an
    HTTP publish returns). A broadcast version's HTTP catch-up copy is hashed in the background
    after the broadcast (the weight server holds requests for it until then). The whole
    version's sha256 is hashed only when asked for (:meth:`content_sha256`): a checkpoint is its
    only reader, so the steps without one never pay for it.
    """

    version: int
    size: int
    """Bytes of the version as it travels."""
    phases: SyncPhases
    """The trainer's timings of this publish."""
    ready: Future[WeightsManifest] = field(repr=False, compare=False)
    """The version's HTTP manifest, once its pieces are hashed."""
    content: Callable[[], str] = field(repr=False, compare=False)
    """sha256 (hex) of the whole canonical bytes, hashed on the first call (``pieces.
    LazySha256``): the checkpoint's ``model_sha256``."""

    def manifest(self, timeout_s: float = CONTENT_TIMEOUT_S) -> WeightsManifest:
        """The HTTP manifest (waits at most ``timeout_s`` for the pieces' hashing)."""
        return _result(self.ready, timeout_s, f"version {self.version}'s pieces")

    def content_sha256(self) -> str:
        """The whole version's sha256 (hashed now if nobody asked before: seconds per 10 GB)."""
        return self.content()


def done(value: T) -> Future[T]:
    """A future that already holds ``value`` (what a publisher has finished)."""
    future: Future[T] = Future()
    future.set_result(value)
    return future


def _result(future: Future[T], timeout_s: float, what: str) -> T:
    try:
        return future.result(timeout=timeout_s)
    except FutureTimeout:
        raise WeightSyncError(
            f"{what}: still hashing after {timeout_s:g}s (the trainer's host is overloaded?)"
        ) from None


def pieces_checksum(version: int, size: int, pieces: tuple[Piece, ...]) -> str:
    """sha256 (hex) of the version number, its size and its pieces' offsets, sizes and sha256s."""
    lines = [f"{version} {size}", *(f"{p.offset} {p.size} {p.sha256}" for p in pieces)]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


class WeightPublisher(abc.ABC):
    """Trainer side: make a new policy version available to rollout workers."""

    @abc.abstractmethod
    def publish_stream(
        self, version: int, layout: Sequence[TensorMeta], tensors: TensorStream
    ) -> Published:
        """Publish ``version`` (strictly greater than the last one) from a stream of whole
        tensors in ``layout`` order (``pieces.canonical_layout``'s), without a whole state
        dict in memory (``store.publish_state_dict`` publishes a state dict this way)."""


class WeightSource(abc.ABC):
    """Rollout side: obtain a verified version and load it into the policy."""

    _refused = 0
    _refused_lock = threading.Lock()

    def refusals(self) -> int:
        """Pieces (or buckets) this source refused for their checksum so far: the worker's
        ``longtail_worker_weights_refused_total``."""
        return self._refused

    def count_refused(self, pieces: int = 1) -> None:
        """Count ``pieces`` refused for their checksum (the caller logs why, at warning)."""
        with self._refused_lock:
            self._refused += pieces

    @abc.abstractmethod
    def fetch(self, version: int | None = None) -> tuple[int, StateDict]:
        """A complete, checksum-verified state dict: ``version``, or the newest when ``None``.

        Raises :class:`WeightIntegrityError`, :class:`WeightVersionError` or
        :class:`WeightFetchError`; never returns partial weights.
        """

    def load_into(self, model: nn.Module, version: int | None = None) -> int:
        """Fetch ``version`` (newest when ``None``), load it whole into ``model``, return it.

        On any error the model is left exactly as it was.
        """
        got, state_dict = self.fetch(version)
        apply_state_dict(model, state_dict, version=got)
        return got


def check_compatible(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Raise :class:`WeightMismatchError` unless ``state_dict`` fits ``model`` exactly.

    Names must match one to one and shapes must be equal. Floating dtypes may differ (the
    trainer may keep fp32 weights for a bf16 rollout engine; the copy casts), but a floating
    tensor may not land in an integer buffer or the other way round.
    """
    own = model.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    problems: list[str] = []
    if missing:
        problems.append(f"missing {len(missing)} key(s): {_sample(missing)}")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} key(s): {_sample(unexpected)}")
    for key in sorted(set(own) & set(state_dict)):
        mine, theirs = own[key], state_dict[key]
        if tuple(mine.shape) != tuple(theirs.shape):
            problems.append(f"{key}: shape {tuple(theirs.shape)} != model's {tuple(mine.shape)}")
        elif mine.is_floating_point() != theirs.is_floating_point():
            problems.append(f"{key}: dtype {theirs.dtype} cannot replace model's {mine.dtype}")
    if problems:
        raise WeightMismatchError(
            "weights do not fit the model (was the trainer started with another model?): "
            + "; ".join(problems[:10])
            + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
        )


def apply_state_dict(
    model: nn.Module, state_dict: Mapping[str, torch.Tensor], *, version: int
) -> None:
    """Load a verified ``state_dict`` into ``model``: all of it, or (on error) nothing."""
    try:
        check_compatible(model, state_dict)
    except WeightMismatchError as exc:
        raise WeightMismatchError(f"version {version}: {exc}") from None
    with torch.no_grad():
        model.load_state_dict(state_dict, strict=True)


def _sample(keys: list[str], n: int = 5) -> str:
    return ", ".join(keys[:n]) + (f", ... ({len(keys) - n} more)" if len(keys) > n else "")
