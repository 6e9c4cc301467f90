"""Drafter exchange over the trainer's HTTP port, so rollout workers need no shared directory.

On a cluster each pod has its own filesystem, and ``longtail run`` exercises the same path: the
trainer keeps the :class:`~longtail_workers.drafter.registry.DrafterRegistry` directory (merge and
publish are unchanged) and ``trainer/service.py``'s ``TrainerApp`` adds
:func:`drafter_routes` (answered by :class:`DrafterEndpoints`) to its route table; each
rollout worker (``--drafters-url``) uses :class:`RemoteDrafterRegistry`, which has the
registry's ``DrafterStore`` interface
(``latest_version``, ``load``, ``submit_candidate``), so ``rollout/control.py`` does not know
which one it holds::

    GET  /v1/drafters/latest       -> 200 {"version": n | null}
    GET  /v1/drafters/{n}          -> 200 the version as one payload; headers
                                      X-Longtail-Drafter-Version, -Sha256; 404 not kept
    POST /v1/drafters/candidates?worker=W&base_version=B&policy_version=P&tokens=T&steps=S
         [&train_loss=L&heldout_top1=A]   body: the candidate as one payload,
                                      header X-Longtail-Drafter-Sha256 -> 201 {candidate: its
                                      fields, id, created_unix}; 400 naming the problem;
                                      409 when base_version is not the latest

A payload is one drafter as one body built and read in memory (``payload.py``), like the
policy weights' (``weights/http_sync.py``). The whole body's sha256 travels in
``X-Longtail-Drafter-Sha256``: the client checks it on every download and the trainer on every
upload (400 on a mismatch), so a corrupted transfer is never loaded or merged. Only the
trainer's registry keeps drafters as files (its durable store); a rollout worker keeps each
downloaded body as one file in its cache.
An upload that is not the job's drafter (tensor names, shapes, dtypes, target), holds no tensors
or a NaN/infinity is refused with 400 naming the problem and not stored (``drafter/vetting.py``);
so is one whose query has a malformed field (a NaN loss, an infinite score, negative tokens) or
whose ``policy_version`` is newer than the trainer's or older than it by more than
``max_policy_lag``. Every refused upload, 400 or 409, is one warning line in the trainer's log
naming the field and the value, and one count of
``longtail_trainer_drafter_candidates_rejected_total{stage, reason}`` (``refusals.py``). The 201
answer names the stored candidate by its id, never by the trainer's path.
Requests go through ``httpclient.request``: a bounded timeout on each; unreachable trainers,
timeouts and 5xx answers (503 while the trainer is still loading) are retried with exponential
backoff and jitter, then raised as :class:`DrafterExchangeError` naming the URL. Re-sending a
candidate after a lost answer is harmless: the merge takes each worker's newest candidate.
A candidate whose ``base_version`` is not the latest published version (stale or future) is
answered 409 ``{"error", "baseVersion", "latestVersion"}``, logged and counted (stage ``stale``)
and not stored; the client raises :class:`~.registry.StaleCandidateError`, which the window
cycle (``spot/cycle.py``) logs and drops: it is never retried.
Uploads carry the job's token (``Authorization: Bearer``; the trainer's server answers 401
without it, ``httprequest.py``); downloads are reads and need none.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qs

from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from starlette.routing import Route
from torch import nn

from longtail_workers.drafter.checkpoint import (
    DrafterMismatchError,
    build_drafter,
    check_drafter_config,
    drafter_config,
    drafter_weights_bytes,
)
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.payload import DrafterPayload, pack_files, read_files
from longtail_workers.drafter.registry import (
    DRAFTER_FILES,
    META_FILE,
    Candidate,
    CandidateInfo,
    DrafterRegistry,
    PublishedVersion,
    Refusal,
    StaleCandidateError,
    VersionMeta,
)
from longtail_workers.httpclient import (
    ChecksumMismatch,
    HTTPCallError,
    Response,
    Retry,
    WorkerBusy,
    checked_base_url,
    request,
)
from longtail_workers.httprequest import (
    BodyErrors,
    JSONRequestHandler,
    RequestError,
    error_text,
    fail,
)
from longtail_workers.httpserver import route
from longtail_workers.weights.checksum import sha256_hex

log = logging.getLogger(__name__)

PREFIX = "/v1/drafters"
LATEST_PATH = f"{PREFIX}/latest"
VERSION_PATH = PREFIX + "/{version}"
CANDIDATES_PATH = f"{PREFIX}/candidates"
VERSION_HEADER = "X-Longtail-Drafter-Version"
CHECKSUM_HEADER = "X-Longtail-Drafter-Sha256"
CONTENT_TYPE = "application/octet-stream"
VERSION_FILES = (*DRAFTER_FILES, META_FILE)
MAX_CANDIDATE_BYTES = 4 << 30
"""Largest candidate upload the trainer reads (a drafter is ``fc`` plus one decoder layer)."""
MAX_POLICY_LAG = 4
"""How many policy versions a candidate's ``policy_version`` (the newest policy its window
trained on) may be behind the trainer's. A window trains on the rollout just run, so it names
the trainer's version or one or two before it (the update runs while the window ends); a lag
beyond this means its worker trained on answers no recent rollout refreshed."""


class DrafterExchangeError(OSError):
    """The trainer's drafter exchange could not be used (message names the URL and the cause)."""


class DrafterIntegrityError(DrafterExchangeError):
    """A drafter payload does not hash to the sha256 sent with it; nothing was loaded."""


class DrafterNotFoundError(DrafterExchangeError, FileNotFoundError):
    """The version asked for is not published (any more), or nothing is published yet."""


# --- server side: mounted on the trainer's HTTP surface ----------------------------------------


_CANDIDATE_BODY_ERRORS = BodyErrors(
    chunked="send the candidate with a Content-Length header, not chunked",
    missing="send the candidate with a Content-Length header",
    invalid="Content-Length: must be an integer, got {raw!r}",
    too_large="candidate is {length} bytes, over the trainer's limit of {limit}",
    blank_is_missing=True,
)


class DrafterEndpoints:
    """Answers ``/v1/drafters/...`` from the trainer's local :class:`DrafterRegistry`.

    The rows of :func:`drafter_routes` call it from the request threads; errors are raised as
    ``RequestError`` (``httprequest.fail``) for the server to answer. Packed versions are
    cached (they are immutable), so N workers fetching one version cost one packing.
    ``policy_version`` gives the trainer's current policy version, which an upload's
    ``policy_version`` is checked against (at most it, at least ``max_policy_lag`` below).
    """

    def __init__(
        self,
        registry: DrafterRegistry,
        *,
        policy_version: Callable[[], int],
        max_policy_lag: int = MAX_POLICY_LAG,
        max_candidate_bytes: int = MAX_CANDIDATE_BYTES,
        cached_versions: int = 2,
    ) -> None:
        if max_policy_lag < 0:
            raise ValueError(f"max_policy_lag={max_policy_lag}; must be >= 0")
        self.registry = registry
        self.policy_version = policy_version
        self.max_policy_lag = max_policy_lag
        self.max_candidate_bytes = max_candidate_bytes
        self.cached_versions = cached_versions
        self._cache: OrderedDict[int, tuple[bytes, str]] = OrderedDict()
        self._lock = threading.Lock()

    def latest(self, handler: JSONRequestHandler) -> None:
        handler.send_json(HTTPStatus.OK, {"version": self.registry.latest_version()})

    def version(self, handler: JSONRequestHandler) -> None:
        version: int = handler.params["version"]
        data, checksum = self._payload(version)
        headers = {VERSION_HEADER: str(version), CHECKSUM_HEADER: checksum}
        handler.send_body(HTTPStatus.OK, data, CONTENT_TYPE, headers)

    def _payload(self, version: int) -> tuple[bytes, str]:
        with self._lock:
            cached = self._cache.get(version)
        if cached is not None:
            return cached
        try:
            files = read_files(self.registry.get(version).path, VERSION_FILES)
        except FileNotFoundError:
            kept = self.registry.versions()
            fail(HTTPStatus.NOT_FOUND, f"drafter version {version} is not kept; kept: {kept}")
        data = pack_files(files)  # a version is immutable: packed once, cached
        entry = (data, sha256_hex(data))
        with self._lock:
            self._cache[version] = entry
            while len(self._cache) > self.cached_versions:
                self._cache.popitem(last=False)
        return entry

    def receive(self, handler: JSONRequestHandler) -> None:
        """``POST /v1/drafters/candidates``: store the upload (201) or refuse it; every refusal
        is logged and counted once (the registry's refusals)."""
        try:
            self._receive(handler, handler.query)
        except _Refused as exc:
            self.registry.refuse(Refusal("upload", exc.reason, _worker_of(handler.query), str(exc)))
            prefix = "" if exc.reason == "request" else "candidate refused: "
            fail(exc.status, f"{prefix}{exc}")

    def _receive(self, handler: JSONRequestHandler, query: str) -> None:
        try:
            body = handler.read_body(self.max_candidate_bytes, _CANDIDATE_BODY_ERRORS)
        except RequestError as exc:  # the body's framing: no length, too large, cut short
            raise _Refused("request", exc.message, exc.status) from exc
        sent = (handler.headers.get(CHECKSUM_HEADER) or "").strip().lower()
        if not sent:
            raise _Refused("request", f"send the body's sha256 (hex) in {CHECKSUM_HEADER}")
        actual = sha256_hex(body)
        if actual != sent:
            raise _Refused("request", (
                f"candidate body hashes to sha256 {actual}, but {CHECKSUM_HEADER} says {sent}: "
                "the upload was corrupted; nothing was stored, send it again"
            ))  # fmt: skip
        try:
            info = CandidateInfo.from_query(query)
        except ValueError as exc:  # ProtocolError: names the field and the value
            raise _Refused("query", str(exc)) from exc
        self._check_policy_version(info.policy_version)
        try:
            payload = DrafterPayload.unpack(body, CANDIDATES_PATH)
            if payload.meta is not None:
                raise ValueError("a candidate carries no version meta (send meta: null)")
            files = payload.files()
        except ValueError as exc:
            raise _Refused("malformed", str(exc)) from exc
        try:
            cand = self.registry.submit_candidate_files(files, info)
        except DrafterMismatchError as exc:  # not the job's drafter: logged and counted
            fail(HTTPStatus.BAD_REQUEST, f"candidate refused: {exc}")
        except StaleCandidateError as exc:  # the registry logged and counted it
            handler.send_json(HTTPStatus.CONFLICT, {
                "error": str(exc), "baseVersion": exc.base_version, "latestVersion": exc.latest,
            })  # fmt: skip
            return
        log.info(
            "drafter candidate %s from %s (base %s, %d tokens) stored",
            cand.id, cand.worker, cand.base_version, cand.tokens,
        )  # fmt: skip
        handler.send_json(HTTPStatus.CREATED, cand.to_dict())

    def _check_policy_version(self, version: int) -> None:
        """Refuse a ``policy_version`` the trainer has not published, or one too far behind."""
        current = self.policy_version()
        oldest = max(0, current - self.max_policy_lag)
        if version > current:
            raise _Refused("policy_version", (
                f"query.policy_version: {version} is newer than the trainer's policy version "
                f"{current}; a window trains on answers of published versions, so send a "
                f"version from {oldest} to {current} (the newest policy the window trained on)"
            ))  # fmt: skip
        if version < oldest:
            raise _Refused("policy_version", (
                f"query.policy_version: {version} is older than {oldest}, the oldest the "
                f"trainer takes (its policy version is {current}; a candidate may lag it by "
                f"at most {self.max_policy_lag}): the window trained on answers of a policy "
                "the trainer left behind; train on the latest rollouts' answers"
            ))  # fmt: skip


class _Refused(ValueError):
    """An upload refused for ``reason`` (a key of ``REFUSAL_REASONS``), answered ``status``."""

    def __init__(
        self, reason: str, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST
    ) -> None:
        super().__init__(message)
        self.reason, self.status = reason, status


def _worker_of(query: str) -> str:
    """The ``worker`` an upload's query names, as far as it can be read (log lines)."""
    names = parse_qs(query, keep_blank_values=True).get("worker") or ["?"]
    return names[0][:64] or "?"


def drafter_routes(exchange: Callable[[], DrafterEndpoints]) -> list[Route]:
    """The exchange's rows of the trainer's route table; ``exchange()`` gives the endpoints,
    or fails when there are none (yet)."""
    return [
        route(LATEST_PATH, lambda handler: exchange().latest(handler), "GET"),
        route(PREFIX + "/{version:int}", lambda handler: exchange().version(handler), "GET"),
        route(CANDIDATES_PATH, lambda handler: exchange().receive(handler), "POST"),
    ]


# --- client side: what a rollout worker holds ---------------------------------------------------


class RemoteDrafterRegistry:
    """A ``DrafterStore`` (``registry.py``) over the trainer's HTTP port (``--drafters-url``).

    Downloaded versions are kept (verified, one payload file per version, named by the version)
    under ``cache_dir`` (default: a private temporary directory removed with this object), the
    newest ``keep_versions`` of them, so loading the same version for generation and for
    training downloads it once. A download is loaded from memory; the cache file is only read
    when the version is loaded again.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 60.0,
        retries: int = 4,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        cache_dir: str | Path | None = None,
        keep_versions: int = 2,
        token: str | None = None,
    ) -> None:
        if timeout_s <= 0 or keep_versions < 1:
            raise ValueError(
                f"need timeout_s > 0, keep_versions >= 1; got {timeout_s}, {keep_versions}"
            )
        self.base_url = checked_base_url(base_url, "drafters URL")
        self.timeout_s = timeout_s
        self.retry = Retry(retries, backoff_s, max_backoff_s)  # checks its own arguments
        self.keep_versions = keep_versions
        self.token = token
        """The job's token for uploads (None: the process's ``LONGTAIL_AUTH_TOKEN``)."""
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if cache_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="longtail-drafters-")
            cache_dir = self._tmp.name
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # one download into the cache at a time

    def __repr__(self) -> str:
        return f"RemoteDrafterRegistry({self.base_url!r})"

    # --- reading ----------------------------------------------------------------------------

    def latest_version(self) -> int | None:
        """The trainer's newest published version, or None before anything was published."""
        answer = self._request("GET", LATEST_PATH)
        body = answer.body
        if answer.status == HTTPStatus.NOT_FOUND:
            raise DrafterExchangeError(
                f"GET {self.base_url}{LATEST_PATH} answered 404 ({error_text(body)}); is "
                f"{self.base_url} the trainer's HTTP port (--port), started with --drafters?"
            )
        try:
            version = json.loads(body)["version"]
            return None if version is None else int(version)
        except (ValueError, KeyError, TypeError) as exc:
            raise DrafterExchangeError(
                f"GET {self.base_url}{LATEST_PATH}: unreadable answer ({exc}): {body[:200]!r}"
            ) from exc

    def load(
        self, target: nn.Module, *, target_id: str, version: int | None = None
    ) -> tuple[EagleDrafter, PublishedVersion]:
        """Download ``version`` (default: the latest), verify it, load it as an eval drafter."""
        if version is None:
            version = self.latest_version()
            if version is None:
                raise DrafterNotFoundError(
                    f"{self.base_url}: no drafter version published yet; load after the "
                    "trainer merged the first candidates"
                )
        with self._lock:
            payload, path = self._fetch(version)
        source = f"drafter version {version} from {self.base_url}"
        if payload.meta is None:
            raise DrafterExchangeError(f"{source}: the payload carries no version meta")
        try:
            meta = VersionMeta.from_dict(payload.meta)
            config = check_drafter_config(payload.config, source)
            weights = load_safetensors(payload.weights)
        except (TypeError, SafetensorError) as exc:
            raise DrafterExchangeError(f"{source}: unreadable payload ({exc})") from exc
        try:
            drafter = build_drafter(config, weights, target, target_id=target_id, where=source)
        except DrafterMismatchError as exc:
            raise DrafterMismatchError(f"{source}: {exc}") from exc
        return drafter.eval(), PublishedVersion(version, path, meta)

    def _fetch(self, version: int) -> tuple[DrafterPayload, Path]:
        """The verified payload of ``version`` and its cache file (downloaded unless cached);
        called under the lock."""
        final = self.cache_dir / f"{version:06d}"
        if final.is_file():
            try:
                return DrafterPayload.unpack(final.read_bytes(), str(final)), final
            except ValueError as exc:  # damaged on disk: download it again
                log.warning("cached drafter %s is unusable (%s); downloading again", final, exc)
        path = VERSION_PATH.format(version=version)
        url = self.base_url + path
        answer = self._request("GET", path)
        if answer.status == HTTPStatus.NOT_FOUND:
            raise DrafterNotFoundError(f"GET {url}: {error_text(answer.body)}")
        got = answer.headers.get(VERSION_HEADER)
        if got != str(version):
            raise DrafterExchangeError(
                f"GET {url} answered drafter version {got!r}, not {version}; nothing was loaded"
            )
        try:
            answer.check_sha256(CHECKSUM_HEADER)
        except ChecksumMismatch as exc:
            raise DrafterIntegrityError(
                f"GET {url}: the payload hashes to sha256 {exc.actual}, but {CHECKSUM_HEADER} "
                f"says {exc.expected or '(missing)'}; a corrupted transfer: nothing was loaded "
                "(the worker keeps its drafter); it is fetched again at the next refresh"
            ) from exc
        try:
            payload = DrafterPayload.unpack(answer.body, url)
        except ValueError as exc:
            raise DrafterExchangeError(str(exc)) from exc
        _remove(final)  # a directory left by an older cache layout
        part = final.with_name(final.name + ".part")
        part.write_bytes(answer.body)
        os.replace(part, final)  # readers never see half a file
        self._prune()
        return payload, final

    def _prune(self) -> None:
        kept = sorted(p for p in self.cache_dir.iterdir() if p.name.isdigit())
        for old in kept[: -self.keep_versions]:
            _remove(old)

    # --- publishing -------------------------------------------------------------------------

    def submit_candidate(self, drafter: EagleDrafter, info: CandidateInfo) -> Candidate:
        """Upload one worker's trained drafter for the merge of ``info.base_version``'s window."""
        config = drafter_config(drafter, version=info.base_version)
        body = DrafterPayload(config, drafter_weights_bytes(drafter)).pack()
        path = f"{CANDIDATES_PATH}?{info.to_query()}"
        headers = {CHECKSUM_HEADER: sha256_hex(body), "Content-Type": CONTENT_TYPE}
        answer = self._request("POST", path, body, headers, accept=(HTTPStatus.CONFLICT,))
        if answer.status == HTTPStatus.CONFLICT:
            raise _stale(answer, f"POST {self.base_url}{CANDIDATES_PATH}", info.base_version)
        if answer.status == HTTPStatus.NOT_FOUND:
            raise DrafterExchangeError(
                f"POST {self.base_url}{CANDIDATES_PATH} answered 404 ({error_text(answer.body)}); "
                "is the trainer started with --drafters?"
            )
        try:
            return Candidate.from_dict(answer.json())
        except ValueError as exc:
            raise DrafterExchangeError(
                f"POST {self.base_url}{CANDIDATES_PATH}: unreadable answer ({exc})"
            ) from exc

    # --- transport --------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        accept: tuple[int, ...] = (),
    ) -> Response:
        """One request with retries (``httpclient.request``); returns 2xx, 404 and ``accept``
        answers."""
        try:
            return request(
                method, self.base_url + path, timeout_s=self.timeout_s, body=body,
                headers=headers, retry=self.retry, token=self.token,
                accept=(HTTPStatus.NOT_FOUND, *accept),
            )  # fmt: skip
        except (HTTPCallError, WorkerBusy) as exc:
            raise DrafterExchangeError(
                f"{exc} (is the trainer running and reachable at that URL? rollout workers "
                "take it from --drafters-url / LONGTAIL_DRAFTER_URL)"
            ) from exc


def _stale(answer: Response, call: str, base: int | None) -> StaleCandidateError:
    """The trainer's 409 for a candidate whose base is not the latest version."""
    try:
        latest = answer.json().get("latestVersion")
    except (ValueError, AttributeError):
        latest = None
    return StaleCandidateError(
        f"{call} answered 409: {error_text(answer.body)}",
        base,
        latest if isinstance(latest, int) else None,
    )


def _remove(path: Path) -> None:
    """Delete a cache entry: a payload file, or a directory from an older cache layout."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
