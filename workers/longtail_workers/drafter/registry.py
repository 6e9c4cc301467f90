"""Versioned drafter publishing: atomic versions, a ``LATEST`` pointer, and per-window candidates.

The rollout worker submits the drafter its spot trainer produced as a *candidate* of the version
it started from; at the step boundary one caller (the step driver, or the worker itself in local
mode) calls :meth:`DrafterRegistry.merge_candidates`, which token-weight-averages the candidates
(``merge.py``) and publishes version ``d+1``, tagged with the policy version it was trained
against, its training loss and held-out top-1 accuracy. Rollout workers read
:meth:`DrafterRegistry.latest` at the start of each rollout (never mid-sequence) and hand the
loaded drafter to ``TorchEngine.set_drafter``. Layout under ``root``::

    LATEST                      "7\\n": the newest complete version (replaced atomically)
    versions/000007/            save_drafter() output + version.json (immutable once renamed)
    candidates/base-000007/<worker>-<id>/   a worker's drafter trained from version 7
    .staging/                   temporary directories being written

Atomicity: everything is written into ``.staging/<uuid>``, each file and the directory fsynced,
then the directory is renamed into place (``rename`` is atomic on one filesystem) and only then
``LATEST`` is replaced via ``os.replace`` of an fsynced temp file. A reader that resolves
``LATEST`` therefore always finds a complete version. Version numbers are claimed under an
``fcntl`` lock on ``root/.lock`` so that concurrent publishers (processes on one host or on a
POSIX-locking shared filesystem) never collide or move ``LATEST`` backwards. Old versions
beyond ``keep_versions`` are deleted; a reader that lost that race retries with the new latest.

Where the workers do not share the directory (pods on a cluster, and ``longtail run``'s rollout
workers), the trainer keeps it and serves it over HTTP (``exchange.py``): rollout workers use
:class:`~longtail_workers.drafter.exchange.RemoteDrafterRegistry`, which has the same
:class:`DrafterStore` interface, and the trainer stores their uploads with
:meth:`DrafterRegistry.submit_candidate_files`.

Candidates are checked (``vetting.py``) when stored from files, again at the merge (a refused
one is skipped and reported; the others are merged), and every drafter is checked for NaN and
infinities before it is published, so a published version is always finite. A candidate whose
``base_version`` is not the latest published version (stale: a merge happened since; future: no
such version yet) is refused when submitted (:class:`StaleCandidateError`, HTTP 409 on the
trainer's exchange), logged and counted: only candidates of the latest version are ever merged.
The trainer passes a :class:`MergeGate` (``trainer/candidate_checks.py``) to the merge: it sets
each candidate's weight from what the trainer can check (not the candidate's self-reported
``tokens``), refuses candidates, and a merge, that score below the current version on the
trainer's held-out sample, and supplies the published ``heldout_top1``.

A merge judges each candidate once: every candidate it took (merged, refused, or replaced by its
worker's newer one) leaves the registry, so a refused one is never scored again. A candidate
stored while a merge runs (after it listed the window's candidates) is not one it took: it waits
for the next merge when nothing is published, and when a version is published it is reported
*superseded* (logged, counted) as the publish removes its window; no stored candidate leaves
without a refusal on record. Every refusal is a ``refusals.Refusal``, logged once and counted by
stage and reason in :attr:`DrafterRegistry.refusals`, which also says why no version was
published.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torch import nn

from longtail_api.drafterstatus import DrafterMergeStatus
from longtail_workers.drafter.candidates import CANDIDATE_FILE as CANDIDATE_FILE
from longtail_workers.drafter.candidates import Admitted as Admitted
from longtail_workers.drafter.candidates import Candidate as Candidate
from longtail_workers.drafter.candidates import CandidateInfo as CandidateInfo
from longtail_workers.drafter.candidates import MergeGate as MergeGate
from longtail_workers.drafter.candidates import StaleCandidateError as StaleCandidateError
from longtail_workers.drafter.candidates import StoredCandidate as StoredCandidate
from longtail_workers.drafter.checkpoint import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    DrafterMismatchError,
    load_drafter,
    save_drafter,
)
from longtail_workers.drafter.merge import MergeWindow, weighted_mean
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.refusals import Refusal as Refusal
from longtail_workers.drafter.refusals import RefusalBook
from longtail_workers.drafter.vetting import DrafterReference, check_candidate_dir, check_finite

log = logging.getLogger(__name__)

LATEST_FILE = "LATEST"
META_FILE = "version.json"
DRAFTER_FILES = (CONFIG_FILE, WEIGHTS_FILE)
"""What ``save_drafter`` writes: the files a candidate upload must consist of."""


class VersionConflictError(RuntimeError):
    """The version being published already exists."""


RejectionHook = Callable[[Refusal], None]
"""Told of every refused candidate, after the registry logged and counted it (the trainer's
counter)."""


@dataclass(frozen=True)
class VersionMeta:
    """What a published drafter version is (``version.json``)."""

    version: int
    parent_version: int | None
    policy_version: int
    train_loss: float | None
    heldout_top1: float | None
    trained_tokens: int
    steps: int
    merged_from: tuple[str, ...] = ()
    heldout_top1_is_estimate: bool = False
    """True when ``heldout_top1`` is the token-weighted mean of the merged candidates' own
    accuracies; False when the trainer scored the version itself (or one candidate's number)."""
    created_unix: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VersionMeta:
        return cls(**{**data, "merged_from": tuple(data.get("merged_from", ()))})


@dataclass(frozen=True)
class PublishedVersion:
    version: int
    path: Path
    meta: VersionMeta


class DrafterStore(Protocol):
    """What a rollout worker needs of a drafter registry (``rollout/control.py``).

    Implemented by :class:`DrafterRegistry` (a directory the trainer and the workers share) and
    by :class:`~longtail_workers.drafter.exchange.RemoteDrafterRegistry` (the trainer's HTTP port).
    """

    def latest_version(self) -> int | None: ...

    def load(
        self, target: nn.Module, *, target_id: str, version: int | None = None
    ) -> tuple[EagleDrafter, PublishedVersion]: ...

    def submit_candidate(self, drafter: EagleDrafter, info: CandidateInfo) -> Candidate: ...


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _base_dir_name(base_version: int | None) -> str:
    return "base-init" if base_version is None else f"base-{base_version:06d}"


class DrafterRegistry:
    """Published drafter versions and pending candidates under one directory.

    ``reference`` (the job's drafter, ``drafter/vetting.py``): what stored and merged candidates
    must match; without it a candidate is checked against the first usable one. Refused
    candidates are logged and counted in :attr:`refusals` (:attr:`rejected`: by stage) and
    reported to ``on_rejected``.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        keep_versions: int = 5,
        reference: DrafterReference | None = None,
        on_rejected: RejectionHook | None = None,
    ) -> None:
        if keep_versions < 2:
            raise ValueError(f"keep_versions={keep_versions}; keep at least 2 (readers race GC)")
        self.root = Path(root)
        self.keep_versions = keep_versions
        self.reference = reference
        self.on_rejected = on_rejected
        self.refusals = RefusalBook()
        """Every candidate refused so far, by stage and reason; why nothing was published."""
        self.last_merge_candidates = 0
        """Candidates the last :meth:`merge_candidates` found (the step row's
        ``drafter_candidates``; the simulator replays a run's merges with it)."""
        for sub in ("versions", "candidates", ".staging"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    @property
    def rejected(self) -> Counter[str]:
        """Candidates refused so far, by stage (``refusals.STAGES``)."""
        return self.refusals.by_stage

    # --- reading ----------------------------------------------------------------------------

    def latest_version(self) -> int | None:
        """The number in ``LATEST``, or None before anything was published."""
        try:
            text = (self.root / LATEST_FILE).read_text().strip()
        except FileNotFoundError:
            return None
        return int(text)

    def get(self, version: int) -> PublishedVersion:
        path = self.root / "versions" / f"{version:06d}"
        meta = json.loads((path / META_FILE).read_text())
        return PublishedVersion(version, path, VersionMeta.from_dict(meta))

    def latest(self) -> PublishedVersion | None:
        """The newest complete version (retries if garbage collection raced the read)."""
        for _ in range(3):
            version = self.latest_version()
            if version is None:
                return None
            with contextlib.suppress(FileNotFoundError):
                return self.get(version)
        raise FileNotFoundError(f"{self.root}: LATEST points at a missing version; is GC racing?")

    def versions(self) -> list[int]:
        return sorted(int(p.name) for p in (self.root / "versions").iterdir() if p.name.isdigit())

    def load(
        self, target: nn.Module, *, target_id: str, version: int | None = None
    ) -> tuple[EagleDrafter, PublishedVersion]:
        """Load ``version`` (default: the latest) as an eval-mode drafter on ``target``."""
        for _ in range(3):
            published = self.get(version) if version is not None else self.latest()
            if published is None:
                raise FileNotFoundError(f"{self.root}: no drafter version published yet")
            try:
                return load_drafter(published.path, target, target_id=target_id), published
            except FileNotFoundError:
                if version is not None:
                    raise
        raise FileNotFoundError(f"{self.root}: versions keep disappearing while loading")

    # --- publishing -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.root / ".lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _stage(self, write: Callable[[Path], object], meta: dict[str, Any], name: str) -> Path:
        """Write the drafter (``write(dir)``) and ``name`` into a fresh, fsynced staging dir."""
        staging = self.root / ".staging" / uuid.uuid4().hex
        staging.mkdir(parents=True)
        try:
            write(staging)
            _write_json(staging / name, meta)
            for f in staging.iterdir():
                _fsync_file(f)
            _fsync_dir(staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return staging

    def publish(
        self,
        drafter: EagleDrafter,
        *,
        policy_version: int,
        train_loss: float | None = None,
        heldout_top1: float | None = None,
        trained_tokens: int = 0,
        steps: int = 0,
        merged_from: tuple[str, ...] = (),
        heldout_top1_is_estimate: bool = False,
        expected_parent: int | str | None = "any",
        taken: Collection[Path] = (),
    ) -> PublishedVersion:
        """Publish ``drafter`` as version latest+1 (0 for the first) and move ``LATEST`` to it.

        ``expected_parent`` (a version or None): refuse with :class:`VersionConflictError` when
        the latest version is another one (someone published in between). A drafter with a
        NaN or infinite weight is refused (:class:`~.vetting.NonFiniteDrafterError`). The
        candidates of older windows are removed: ``taken`` (the directories of the candidates
        the merge publishing this version judged) quietly, any other as superseded.
        """
        check_finite(drafter.trainable_state_dict(), "drafter to publish")
        with self._locked():
            parent = self.latest_version()
            if expected_parent != "any" and parent != expected_parent:
                raise VersionConflictError(
                    f"expected to publish on top of version {expected_parent}, but {parent} is "
                    "the latest; the candidates were trained from an old drafter"
                )
            version = 0 if parent is None else parent + 1
            meta = VersionMeta(
                version,
                parent,
                policy_version,
                train_loss,
                heldout_top1,
                trained_tokens,
                steps,
                merged_from,
                heldout_top1_is_estimate,
                time.time(),
            )
            staging = self._stage(
                lambda d: save_drafter(drafter, d, version=version), meta.to_dict(), META_FILE
            )
            final = self.root / "versions" / f"{version:06d}"
            if final.exists():
                shutil.rmtree(staging)
                raise VersionConflictError(f"{final} already exists; LATEST is behind the files")
            os.rename(staging, final)
            _fsync_dir(final.parent)
            pointer = self.root / f".{LATEST_FILE}.{uuid.uuid4().hex}.tmp"
            pointer.write_text(f"{version}\n")
            _fsync_file(pointer)
            os.replace(pointer, self.root / LATEST_FILE)
            _fsync_dir(self.root)
            self._collect_garbage(version, frozenset(taken))
        log.info("published drafter version %d (policy version %d)", version, policy_version)
        return PublishedVersion(version, final, meta)

    def _collect_garbage(self, latest: int, taken: frozenset[Path]) -> None:
        """Called under the lock by the publish of ``latest``."""
        for old in self.versions()[: -self.keep_versions]:
            if old != latest:
                shutil.rmtree(self.root / "versions" / f"{old:06d}", ignore_errors=True)
        for base in (self.root / "candidates").iterdir():
            digits = base.name.removeprefix("base-")
            if (digits.isdigit() and int(digits) < latest) or base.name == "base-init":
                for path in sorted(base.iterdir()):
                    if path not in taken:
                        self._supersede(path, latest)
                shutil.rmtree(base, ignore_errors=True)

    def _supersede(self, path: Path, latest: int) -> None:
        """Report the candidate in ``path``, which no merge took, as overtaken by ``latest``."""
        try:
            cand = StoredCandidate.read(path)
        except (OSError, ValueError) as exc:
            worker, trained = path.name.rpartition("-")[0] or "?", f"unreadable ({exc})"
        else:
            worker, trained = cand.worker, f"trained from {_base_name(cand.base_version)}"
        self.refuse(Refusal("superseded", "superseded", worker, (
            f"candidate {path.name} ({trained}) was stored after the merge of its window "
            f"began; drafter version {latest} was published from the other candidates "
            f"meanwhile, so it is never merged; the worker's next window trains from version "
            f"{latest}"
        )))  # fmt: skip

    # --- candidates and merge ---------------------------------------------------------------

    def submit_candidate(self, drafter: EagleDrafter, info: CandidateInfo) -> StoredCandidate:
        """Store one worker's trained drafter for the merge of ``info.base_version``'s window."""
        base = info.base_version
        return self._add_candidate(lambda d: save_drafter(drafter, d, version=base), info)

    def submit_candidate_files(
        self,
        files: Mapping[str, bytes],
        info: CandidateInfo,
    ) -> StoredCandidate:
        """:meth:`submit_candidate` for a drafter already saved by ``save_drafter`` elsewhere.

        ``files`` maps ``config.json`` and ``model.safetensors`` to their bytes (the trainer's
        HTTP exchange receives them from a rollout worker). Raises
        :class:`~longtail_workers.drafter.checkpoint.DrafterMismatchError` (a ``ValueError``)
        when they are not a drafter directory, not the job's drafter (:attr:`reference`: names,
        shapes, dtypes, target), hold no tensors or a NaN/inf; nothing is stored then.
        """
        if sorted(files) != sorted(DRAFTER_FILES):
            raise DrafterMismatchError(
                f"a candidate consists of exactly {', '.join(DRAFTER_FILES)} (as save_drafter "
                f"writes them); got {', '.join(sorted(files)) or 'no files'}"
            )
        source = f"candidate of {info.worker} (base {info.base_version})"

        def write(directory: Path) -> None:
            for name in DRAFTER_FILES:
                (directory / name).write_bytes(files[name])
            check_candidate_dir(directory, self.reference, source)

        try:
            return self._add_candidate(write, info)
        except DrafterMismatchError as exc:
            self.refuse(Refusal("upload", "malformed", info.worker, str(exc)))
            raise

    def _add_candidate(
        self, write: Callable[[Path], object], info: CandidateInfo
    ) -> StoredCandidate:
        self.check_base(info)  # before the upload is written: a stale one costs nothing
        meta = {**info.to_dict(), "created_unix": time.time()}
        staging = self._stage(write, meta, CANDIDATE_FILE)
        parent = self.root / "candidates" / _base_dir_name(info.base_version)
        try:
            with self._locked():  # a merge publishing meanwhile cannot strand it unseen
                self.check_base(info)
                parent.mkdir(parents=True, exist_ok=True)
                final = parent / f"{info.worker}-{uuid.uuid4().hex[:8]}"
                os.rename(staging, final)
                _fsync_dir(parent)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # left only when refused
        return StoredCandidate.read(final)

    def check_base(self, info: CandidateInfo) -> None:
        """Refuse (:class:`StaleCandidateError`, logged and counted at stage ``stale``) a
        candidate whose base is not the latest version: the merge only takes the latest's."""
        latest = self.latest_version()
        base = info.base_version
        if base == latest:
            return
        name = _base_name(base)
        if latest is None:
            why = "no drafter version is published yet (train from the initial drafter: send " \
                  "no base_version)"  # fmt: skip
        elif base is not None and base > latest:
            why = f"version {base} does not exist: the latest published version is {latest}"
        else:
            why = f"version {latest} was published since, so it is stale"
        message = (
            f"candidate of {info.worker} trained from {name} refused: {why}; it is never merged. "
            f"Drop it, load the latest version (GET /v1/drafters/latest) and train from it"
        )
        self.refuse(Refusal("stale", "base_version", info.worker, message))
        raise StaleCandidateError(message, base, latest)

    def candidates(self, base_version: int | None) -> list[StoredCandidate]:
        """The newest candidate of each worker for ``base_version``."""
        return _newest(self._stored(base_version))

    def _stored(self, base_version: int | None) -> list[StoredCandidate]:
        """Every candidate stored for ``base_version`` (a worker's older ones included)."""
        parent = self.root / "candidates" / _base_dir_name(base_version)
        if not parent.is_dir():
            return []
        return [StoredCandidate.read(path) for path in sorted(parent.iterdir())]

    def merge_candidates(
        self,
        target: nn.Module,
        *,
        target_id: str,
        base_version: int | None = None,
        gate: MergeGate | None = None,
    ) -> PublishedVersion | None:
        """Merge the candidates trained from ``base_version`` (default: latest) and publish.

        Returns None when no worker submitted one (nothing trained in this window), when
        every candidate was refused, or when the merge is not finite or, with a ``gate``,
        scores below the current version (nothing is published; the workers keep drafting
        with the base version). A refused candidate is skipped and reported (log,
        :attr:`refusals`, ``on_rejected``); the others are merged. Every candidate taken
        leaves the registry, published or not (see the module text). Without a ``gate`` the
        candidates' self-reported tokens weigh them and ``heldout_top1`` is their weighted mean.
        """
        base = self.latest_version() if base_version is None else base_version
        stored = self._stored(base)
        found = _newest(stored)
        self.last_merge_candidates = len(found)
        if not found:
            return None
        published = None

        def current() -> EagleDrafter | None:  # what a candidate must draft no worse than
            if base is None:
                return None if gate is None else gate.initial_drafter()
            return self.load(target, target_id=target_id, version=base)[0]

        window = MergeWindow(base, target, target_id, self.reference, self.refuse)
        merged = window.merge(found, gate, current)
        if merged is not None:
            admitted = merged.admitted
            cands = [a.candidate for a in admitted]
            published = self.publish(
                merged.drafter.eval(),
                policy_version=max(c.policy_version for c in cands),
                train_loss=weighted_mean([(a.candidate.train_loss, a.tokens) for a in admitted]),
                heldout_top1=merged.heldout_top1,
                trained_tokens=sum(a.tokens for a in admitted),
                steps=max(c.steps for c in cands),
                merged_from=tuple(c.worker for c in cands),
                heldout_top1_is_estimate=merged.estimate,
                expected_parent=base,
                taken=[c.path for c in stored],
            )
        self.refusals.merged(len(found), published is not None)
        for cand in stored:  # judged once: merged, refused, or replaced by a newer one
            if cand not in found:
                log.info("drafter candidate %s of %s replaced by its newer candidate",
                         cand.id, cand.worker)  # fmt: skip
            shutil.rmtree(cand.path, ignore_errors=True)  # gone already when published
        return published

    def merges(self) -> DrafterMergeStatus:
        """What the merges made of the candidates so far, and why no version was published
        (the trainer status's ``drafterMerges``)."""
        return self.refusals.status(self.latest_version() is not None)

    def refuse(self, refusal: Refusal) -> None:
        """Log and count a refused candidate (:attr:`refusals`) and tell ``on_rejected``."""
        self.refusals.add(refusal)
        if self.on_rejected is not None:
            self.on_rejected(refusal)


def _newest(cands: list[StoredCandidate]) -> list[StoredCandidate]:
    """The newest of each worker's candidates, by worker."""
    newest: dict[str, StoredCandidate] = {}
    for cand in cands:
        if cand.worker not in newest or cand.created_unix > newest[cand.worker].created_unix:
            newest[cand.worker] = cand
    return sorted(newest.values(), key=lambda c: c.worker)


def _base_name(base: int | None) -> str:
    return "the initial drafter" if base is None else f"drafter version {base}"
