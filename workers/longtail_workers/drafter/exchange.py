"""Drafter exchange over the trainer's HTTP port, so rollout workers need no shared directory.

On a cluster each pod has its own filesystem, and ``longtail run`` exercises the same path: the
trainer keeps the :class:`~longtail_workers.drafter.registry.DrafterRegistry` directory (merge and
publish are unchanged) and ``trainer/service.py``'s ``TrainerApp`` mounts
:class:`DrafterEndpoints` on it; each rollout worker (``--drafters-url``) uses
:class:`RemoteDrafterRegistry`, which has the registry's ``DrafterStore`` interface
(``latest_version``, ``load``, ``submit_candidate``), so ``rollout/control.py`` does not know
which one it holds::

    GET  /v1/drafters/latest       -> 200 {"version": n | null}
    GET  /v1/drafters/{n}          -> 200 tar of config.json, model.safetensors, version.json;
                                      headers X-Longtail-Drafter-Version, -Sha256; 404 not kept
    POST /v1/drafters/candidates?worker=W&base_version=B&policy_version=P&tokens=T&steps=S
         [&train_loss=L&heldout_top1=A]   body: tar of config.json and model.safetensors,
                                      header X-Longtail-Drafter-Sha256 -> 201 {candidate}

A payload is an uncompressed tar of the files ``save_drafter`` writes (byte for byte), and its
sha256 travels in ``X-Longtail-Drafter-Sha256``: the client checks it on every download and the
trainer on every upload (400 on a mismatch), so a corrupted transfer is never loaded or merged.
An upload that is not the job's drafter (tensor names, shapes, dtypes, target), holds no tensors
or a NaN/infinity is refused with 400 naming the problem and not stored (``drafter/vetting.py``).
Every request has a bounded timeout; unreachable trainers, timeouts and 5xx answers (503 while
the trainer is still loading) are retried with exponential backoff and jitter, then raised as
:class:`DrafterExchangeError` naming the URL. Re-sending a candidate after a lost answer is
harmless: the merge takes each worker's newest candidate. Uploads carry the job's token
(``Authorization: Bearer``; the trainer's server answers 401 without it, ``httpserver.py``);
downloads are reads and need none.
"""

from __future__ import annotations

import http.client
import io
import json
import logging
import random
import re
import shutil
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Mapping
from email.message import Message
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qs, urlencode

from torch import nn

from longtail_api.auth import is_write
from longtail_workers.auth import auth_headers
from longtail_workers.drafter.checkpoint import DrafterMismatchError, load_drafter, save_drafter
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.registry import (
    DRAFTER_FILES,
    META_FILE,
    Candidate,
    DrafterRegistry,
    PublishedVersion,
    VersionMeta,
)
from longtail_workers.httpserver import BodyErrors, JSONRequestHandler, error_text, fail
from longtail_workers.weights.checksum import sha256_hex

log = logging.getLogger(__name__)

PREFIX = "/v1/drafters"
LATEST_PATH = f"{PREFIX}/latest"
VERSION_PATH = PREFIX + "/{version}"
CANDIDATES_PATH = f"{PREFIX}/candidates"
VERSION_HEADER = "X-Longtail-Drafter-Version"
CHECKSUM_HEADER = "X-Longtail-Drafter-Sha256"
CONTENT_TYPE = "application/x-tar"
VERSION_FILES = (*DRAFTER_FILES, META_FILE)
MAX_CANDIDATE_BYTES = 4 << 30
"""Largest candidate upload the trainer reads (a drafter is ``fc`` plus one decoder layer)."""
_VERSION_RE = re.compile(r"^/v1/drafters/(\d{1,9})$")


class DrafterExchangeError(OSError):
    """The trainer's drafter exchange could not be used (message names the URL and the cause)."""


class DrafterIntegrityError(DrafterExchangeError):
    """A drafter payload does not hash to the sha256 sent with it; nothing was loaded."""


class DrafterNotFoundError(DrafterExchangeError, FileNotFoundError):
    """The version asked for is not published (any more), or nothing is published yet."""


# --- payload: a tar of the drafter's files ----------------------------------------------------


def pack_files(files: Mapping[str, bytes]) -> bytes:
    """An uncompressed tar of ``{name: bytes}`` (sorted, no timestamps or owners)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(files[name]), 0o644
            tar.addfile(info, io.BytesIO(files[name]))
    return buf.getvalue()


def unpack_files(data: bytes, expected: tuple[str, ...], source: str) -> dict[str, bytes]:
    """The files of a payload; ``ValueError`` (naming ``source``) unless exactly ``expected``."""
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                if not member.isfile() or member.name not in expected or member.name in files:
                    raise ValueError(
                        f"{source}: unexpected entry {member.name!r} in the drafter payload; "
                        f"it holds exactly {', '.join(expected)}"
                    )
                fh = tar.extractfile(member)
                assert fh is not None  # a regular file
                files[member.name] = fh.read()
    except tarfile.TarError as exc:
        raise ValueError(f"{source}: the drafter payload is not a tar archive ({exc})") from exc
    missing = [name for name in expected if name not in files]
    if missing:
        raise ValueError(f"{source}: the drafter payload lacks {', '.join(missing)}")
    return files


def read_files(directory: Path, names: tuple[str, ...]) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in names}


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

    ``TrainerApp`` calls :meth:`handle` from its request handler threads; errors are raised as
    ``RequestError`` (``httpserver.fail``) for the handler to answer. Packed versions are
    cached (they are immutable), so N workers fetching one version cost one tar.
    """

    def __init__(
        self,
        registry: DrafterRegistry,
        *,
        max_candidate_bytes: int = MAX_CANDIDATE_BYTES,
        cached_versions: int = 2,
    ) -> None:
        self.registry = registry
        self.max_candidate_bytes = max_candidate_bytes
        self.cached_versions = cached_versions
        self._cache: OrderedDict[int, tuple[bytes, str]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def owns(path: str) -> bool:
        """Whether ``path`` (without the query) is one of this exchange's endpoints."""
        return path == PREFIX or path.startswith(PREFIX + "/")

    def handle(self, handler: JSONRequestHandler, method: str, path: str, query: str) -> int:
        """Answer one request; returns the HTTP status sent."""
        if path == LATEST_PATH:
            _allow(method, path, ("GET", "HEAD"))
            return handler.send_json(HTTPStatus.OK, {"version": self.registry.latest_version()})
        if path == CANDIDATES_PATH:
            _allow(method, path, ("POST",))
            return self._receive(handler, query)
        match = _VERSION_RE.match(path)
        if match is None:
            fail(
                HTTPStatus.NOT_FOUND,
                f"no endpoint {path!r}; drafter endpoints: {LATEST_PATH}, {VERSION_PATH}, "
                f"{CANDIDATES_PATH}",
            )
        _allow(method, path, ("GET", "HEAD"))
        version = int(match.group(1))
        data, checksum = self._payload(version)
        headers = {VERSION_HEADER: str(version), CHECKSUM_HEADER: checksum}
        return handler.send_body(HTTPStatus.OK, data, CONTENT_TYPE, headers)

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
        data = pack_files(files)
        entry = (data, sha256_hex(data))
        with self._lock:
            self._cache[version] = entry
            while len(self._cache) > self.cached_versions:
                self._cache.popitem(last=False)
        return entry

    def _receive(self, handler: JSONRequestHandler, query: str) -> int:
        body = handler.read_body(self.max_candidate_bytes, _CANDIDATE_BODY_ERRORS)
        sent = (handler.headers.get(CHECKSUM_HEADER) or "").strip().lower()
        if not sent:
            fail(HTTPStatus.BAD_REQUEST, f"send the body's sha256 (hex) in {CHECKSUM_HEADER}")
        actual = sha256_hex(body)
        if actual != sent:
            fail(
                HTTPStatus.BAD_REQUEST,
                f"candidate body hashes to sha256 {actual}, but {CHECKSUM_HEADER} says {sent}: "
                "the upload was corrupted; nothing was stored, send it again",
            )
        info = _parse_candidate_query(query)
        try:
            files = unpack_files(body, DRAFTER_FILES, CANDIDATES_PATH)
            cand = self.registry.submit_candidate_files(files, **info)  # type: ignore[arg-type]
        except ValueError as exc:
            fail(HTTPStatus.BAD_REQUEST, f"candidate refused: {exc}")
        log.info(
            "drafter candidate from %s (base %s, %d tokens) stored",
            cand.worker, cand.base_version, cand.tokens,
        )  # fmt: skip
        return handler.send_json(HTTPStatus.CREATED, _candidate_dict(cand))


def _allow(method: str, path: str, allowed: tuple[str, ...]) -> None:
    if method not in allowed:
        fail(
            HTTPStatus.METHOD_NOT_ALLOWED,
            f"{method} is not allowed on {path}; use {' or '.join(allowed)}",
            {"Allow": ", ".join(allowed)},
        )


_QUERY_FIELDS: dict[str, tuple[type, bool]] = {
    "worker": (str, True),
    "base_version": (int, False),
    "policy_version": (int, True),
    "tokens": (int, True),
    "steps": (int, True),
    "train_loss": (float, False),
    "heldout_top1": (float, False),
}
"""Candidate fields in the upload's query string: name -> (type, required)."""


def _parse_candidate_query(query: str) -> dict[str, object]:
    try:
        given = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        fail(HTTPStatus.BAD_REQUEST, f"malformed query string ({exc})")
    unknown = sorted(set(given) - set(_QUERY_FIELDS))
    if unknown:
        fail(HTTPStatus.BAD_REQUEST, f"{unknown[0]}: not a candidate field; use {_fields_hint()}")
    info: dict[str, object] = {}
    for name, (kind, required) in _QUERY_FIELDS.items():
        values = given.get(name)
        if values is None:
            if required:
                fail(HTTPStatus.BAD_REQUEST, f"{name}: is required; use {_fields_hint()}")
            info[name] = None
            continue
        if len(values) != 1:
            fail(HTTPStatus.BAD_REQUEST, f"{name}: given {len(values)} times; give it once")
        try:
            info[name] = kind(values[0])
        except ValueError:
            fail(HTTPStatus.BAD_REQUEST, f"{name}: {values[0]!r} is not a {kind.__name__}")
    return info


def _fields_hint() -> str:
    return "&".join(
        f"{name}=..." if required else f"[{name}=...]"
        for name, (_, required) in _QUERY_FIELDS.items()
    )


def _candidate_dict(cand: Candidate) -> dict[str, object]:
    return {
        "path": str(cand.path), "worker": cand.worker, "base_version": cand.base_version,
        "policy_version": cand.policy_version, "tokens": cand.tokens, "steps": cand.steps,
        "train_loss": cand.train_loss, "heldout_top1": cand.heldout_top1,
        "created_unix": cand.created_unix,
    }  # fmt: skip


# --- client side: what a rollout worker holds ---------------------------------------------------


class RemoteDrafterRegistry:
    """A ``DrafterStore`` (``registry.py``) over the trainer's HTTP port (``--drafters-url``).

    Downloaded versions are kept (verified) under ``cache_dir`` (default: a private temporary
    directory removed with this object), the newest ``keep_versions`` of them, so loading the
    same version for generation and for training downloads it once.
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
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"drafters URL {base_url!r}: expected http://HOST:PORT")
        if retries < 0 or backoff_s < 0 or timeout_s <= 0 or keep_versions < 1:
            raise ValueError(
                "need retries >= 0, backoff_s >= 0, timeout_s > 0, keep_versions >= 1; got "
                f"{retries}, {backoff_s}, {timeout_s}, {keep_versions}"
            )
        self.base_url = base_url.rstrip("/")
        self.timeout_s, self.retries = timeout_s, retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
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
        status, _, body = self._request("GET", LATEST_PATH)
        if status == HTTPStatus.NOT_FOUND:
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
            directory = self._fetch(version)
            meta = VersionMeta.from_dict(json.loads((directory / META_FILE).read_text()))
            try:
                drafter = load_drafter(directory, target, target_id=target_id)
            except DrafterMismatchError as exc:
                raise DrafterMismatchError(
                    f"drafter version {version} from {self.base_url}: {exc}"
                ) from exc
        return drafter.eval(), PublishedVersion(version, directory, meta)

    def _fetch(self, version: int) -> Path:
        """The verified local copy of ``version`` (downloaded unless cached); under the lock."""
        final = self.cache_dir / f"{version:06d}"
        if final.is_dir():
            return final
        path = VERSION_PATH.format(version=version)
        url = self.base_url + path
        status, headers, body = self._request("GET", path)
        if status == HTTPStatus.NOT_FOUND:
            raise DrafterNotFoundError(f"GET {url}: {error_text(body)}")
        got = headers.get(VERSION_HEADER)
        if got != str(version):
            raise DrafterExchangeError(
                f"GET {url} answered drafter version {got!r}, not {version}; nothing was loaded"
            )
        advertised, actual = (headers.get(CHECKSUM_HEADER) or "").lower(), sha256_hex(body)
        if advertised != actual:
            raise DrafterIntegrityError(
                f"GET {url}: the payload hashes to sha256 {actual}, but {CHECKSUM_HEADER} says "
                f"{advertised or '(missing)'}; a corrupted transfer: nothing was loaded (the "
                "worker keeps its drafter); it is fetched again at the next refresh"
            )
        try:
            files = unpack_files(body, VERSION_FILES, url)
        except ValueError as exc:
            raise DrafterExchangeError(str(exc)) from exc
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.cache_dir))
        for name, data in files.items():
            (staging / name).write_bytes(data)
        staging.rename(final)
        self._prune()
        return final

    def _prune(self) -> None:
        kept = sorted(p for p in self.cache_dir.iterdir() if p.name.isdigit())
        for old in kept[: -self.keep_versions]:
            shutil.rmtree(old, ignore_errors=True)

    # --- publishing -------------------------------------------------------------------------

    def submit_candidate(
        self,
        drafter: EagleDrafter,
        *,
        worker: str,
        base_version: int | None,
        policy_version: int,
        tokens: int,
        steps: int,
        train_loss: float | None = None,
        heldout_top1: float | None = None,
    ) -> Candidate:
        """Upload one worker's trained drafter for the merge of ``base_version``'s window."""
        if not worker or "/" in worker:
            raise ValueError(f"worker={worker!r}; must be a non-empty name without '/'")
        with tempfile.TemporaryDirectory(prefix="candidate-", dir=self.cache_dir) as tmp:
            save_drafter(drafter, tmp, version=base_version)
            body = pack_files(read_files(Path(tmp), DRAFTER_FILES))
        fields = {
            "worker": worker, "base_version": base_version, "policy_version": policy_version,
            "tokens": tokens, "steps": steps, "train_loss": train_loss,
            "heldout_top1": heldout_top1,
        }  # fmt: skip
        query = urlencode({k: v for k, v in fields.items() if v is not None})
        path = f"{CANDIDATES_PATH}?{query}"
        headers = {CHECKSUM_HEADER: sha256_hex(body), "Content-Type": CONTENT_TYPE}
        status, _, answer = self._request("POST", path, body, headers)
        if status == HTTPStatus.NOT_FOUND:
            raise DrafterExchangeError(
                f"POST {self.base_url}{CANDIDATES_PATH} answered 404 ({error_text(answer)}); "
                "is the trainer started with --drafters?"
            )
        try:
            data = json.loads(answer)
            return Candidate(
                path=Path(data["path"]), **{k: data[k] for k in (*fields, "created_unix")}
            )
        except (ValueError, KeyError, TypeError) as exc:
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
    ) -> tuple[int, Message, bytes]:
        """One request with retries; returns 2xx and 404 answers, raises on anything else."""
        url = self.base_url + path
        if is_write(method):
            headers = {**(headers or {}), **auth_headers(self.token)}
        last = "no attempt made"
        for attempt in range(self.retries + 1):
            if attempt:
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
                time.sleep(delay * random.uniform(0.5, 1.0))  # jitter: workers ask together
            req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return resp.status, resp.headers, resp.read()
            except urllib.error.HTTPError as exc:
                text = error_text(exc.read())
                if exc.code == HTTPStatus.NOT_FOUND:
                    return exc.code, exc.headers, json.dumps({"error": text}).encode()
                last = f"HTTP {exc.code}: {text}"
                if exc.code < 500:
                    break  # the request itself is wrong: asking again does not help
            except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
                last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
            log.warning(
                "%s %s failed (attempt %d/%d): %s", method, url, attempt + 1, self.retries + 1, last
            )
        raise DrafterExchangeError(
            f"{method} {url} failed after {attempt + 1} attempt(s); last error: {last} (is the "
            "trainer running and reachable at that URL? rollout workers take it from "
            "--drafters-url / LONGTAIL_DRAFTER_URL)"
        )
