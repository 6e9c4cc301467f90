"""HTTP pull of versioned policy weights: the default transport, works anywhere.

The trainer runs a :class:`WeightServer` (``httpserver.py``: uvicorn in a background thread,
this route table), the HTTP delivery of its
:class:`~longtail_workers.weights.store.WeightStore` (it serves the store's versions on
request); each rollout worker uses an :class:`HttpWeightClient` between rollouts::

    GET /v1/weights/latest              -> 200 JSON {"manifest": the newest version's
                                           manifest, null before the first publish}
    GET /v1/weights/{version}/manifest  -> 200 JSON manifest {"version", "size", "dtypes",
                                           "pieceBytes", "pieces": [{"offset", "size",
                                           "sha256"}, ...], "piecesSha256"}; 404 when not
                                           kept
    GET /v1/weights/{version}/pieces/{i} -> 200 piece i's bytes, headers
                                           X-Longtail-Weights-Version, X-Longtail-Weights-Sha256
                                           (the piece's); 404 when not kept (any more)

The manifest is :class:`~longtail_workers.weights.sync.WeightsManifest` and the latest answer
:class:`Latest`, written by the wire codec (``longtail_api.wirecodec.to_wire``) and read by it
(``records.decode``): both ends spell them once.

A version the trainer has announced but not finished hashing (a broadcast's catch-up copy,
``store.WeightStore.reserve``) is waited for (at most ``PENDING_WAIT_S``), then answered 503
with a ``Retry-After``: the client retries it as any 5xx.

The client reads the manifest, checks that its pieces cover the version, pulls the pieces on
``parallel`` threads through ``httpclient.request`` (a per-request timeout, unreachable-server
and 5xx failures retried with exponential backoff and jitter: many workers pull at once after
each step), verifies each piece's sha256 as it arrives (the list of them, ``pieces_sha256``, is
the version's checksum), and only then builds the state dict (views of the pieces). Every phase
has a timeout: each request ``timeout_s``, the whole version ``version_timeout_s``. Any failure
raises before anything reaches the model, so the model keeps its previous version whole.
"""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from http import HTTPStatus
from typing import TypeVar

import torch
from starlette.routing import Route

from longtail_api.wirecodec import to_wire
from longtail_workers import httpclient
from longtail_workers.httprequest import JSONRequestHandler, error_text, fail
from longtail_workers.httpserver import BackgroundHTTPServer, route
from longtail_workers.weights.pieces import check_layout, tensors_from_bytes
from longtail_workers.weights.records import decode
from longtail_workers.weights.store import (
    Delivery,
    Outgoing,
    PublishedWeights,
    VersionPending,
    WeightStore,
)
from longtail_workers.weights.sync import (
    Piece,
    StateDict,
    TensorStream,
    WeightFetchError,
    WeightIntegrityError,
    WeightsManifest,
    WeightSource,
    WeightVersionError,
    pieces_checksum,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

LATEST_PATH = "/v1/weights/latest"
MANIFEST_PATH = "/v1/weights/{version}/manifest"
PIECE_PATH = "/v1/weights/{version}/pieces/{index}"
VERSION_HEADER = "X-Longtail-Weights-Version"
CHECKSUM_HEADER = "X-Longtail-Weights-Sha256"
NOTHING_PUBLISHED = "no policy weights published yet"
PENDING_WAIT_S = 30.0
"""Longest a request for a version still being hashed waits before its 503."""


@dataclass(frozen=True)
class Latest:
    """Body of ``GET /v1/weights/latest``."""

    manifest: WeightsManifest | None
    """The newest version's manifest; null before the first publish."""


class WeightServer(Delivery, BackgroundHTTPServer):
    """Serves a :class:`WeightStore`'s versions over HTTP: the store's HTTP delivery."""

    transport = "http"
    service = "weight server"
    thread_name = "weights-http"
    started_log = "policy weights served on %s"
    max_connections = 1024
    """Every rollout worker pulls ``parallel`` pieces at once after each step (GETs: no body)."""

    def __init__(
        self,
        store: WeightStore,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        request_timeout_s: float = 300.0,
    ) -> None:
        super().__init__(host, port, request_timeout_s=request_timeout_s)
        self.store = store
        """The store whose versions this server serves (it reads them on request)."""
        store.attach(self)

    def routes(self) -> list[Route]:
        return [
            route(LATEST_PATH, self._latest, "GET"),
            route("/v1/weights/{version:int}/manifest", self._manifest, "GET"),
            route("/v1/weights/{version:int}/pieces/{index:int}", self._piece, "GET"),
        ]

    def _latest(self, handler: JSONRequestHandler) -> None:
        entry = self._stored(None)
        handler.send_json(HTTPStatus.OK, to_wire(Latest(None if entry is None else entry.manifest)))

    def _manifest(self, handler: JSONRequestHandler) -> None:
        entry = self._kept(handler.params["version"])
        handler.send_json(HTTPStatus.OK, to_wire(entry.manifest))

    def _piece(self, handler: JSONRequestHandler) -> None:
        version, index = handler.params["version"], handler.params["index"]
        entry = self._kept(version)
        count = len(entry.manifest.pieces)
        if index >= count:
            fail(HTTPStatus.NOT_FOUND, f"version {version} has {count} pieces, no piece {index}")
        piece = entry.manifest.pieces[index]
        body = memoryview(entry.data)[piece.offset : piece.offset + piece.size]
        headers = {VERSION_HEADER: str(version), CHECKSUM_HEADER: piece.sha256}
        handler.send_body(HTTPStatus.OK, body, "application/octet-stream", headers)

    def _stored(self, version: int | None) -> PublishedWeights | None:
        """``version`` (None: the newest, itself None before the first publish) from the store,
        waiting while it is hashed: 503 with ``Retry-After`` past the wait (the client retries
        any 5xx), 404 when not kept."""
        try:
            if version is None:
                entry = self.store.latest(wait_s=PENDING_WAIT_S)
            else:
                entry = self.store.get(version, wait_s=PENDING_WAIT_S)
        except VersionPending as exc:
            fail(HTTPStatus.SERVICE_UNAVAILABLE, str(exc), {"Retry-After": "1"})
        if entry is None and version is not None:
            kept = self.store.versions()
            fail(HTTPStatus.NOT_FOUND, f"version {version} is not kept; kept versions: {kept}")
        return entry

    def _kept(self, version: int) -> PublishedWeights:
        entry = self._stored(version)
        assert entry is not None  # _stored answered 404 otherwise
        return entry

    def send(self, out: Outgoing, tensors: TensorStream | None) -> None:
        """Nothing to push: the workers pull ``out`` from the store when they need it."""

    def close(self) -> None:
        self.stop()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and close the socket (idempotent); ``start()`` may be called again."""
        super().stop(timeout_s)
        self._server, self._stopping = None, False


class HttpWeightClient(WeightSource):
    """Pulls verified policy versions from a :class:`WeightServer` at ``base_url``."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 300.0,
        retries: int = 5,
        backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
        parallel: int = 4,
        version_timeout_s: float | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"need timeout_s > 0; got {timeout_s}")
        if parallel < 1:
            raise ValueError(f"need parallel >= 1 (pieces pulled at once); got {parallel}")
        self.base_url = httpclient.checked_base_url(base_url, "weights URL")
        self.timeout_s = timeout_s
        """Each request's timeout (one piece, or a manifest)."""
        self.version_timeout_s = version_timeout_s or 4 * timeout_s
        """The whole version's timeout: every piece in and verified."""
        self.parallel = parallel
        self.retry = httpclient.Retry(retries, backoff_s, max_backoff_s)

    def latest(self) -> WeightsManifest | None:
        """The newest advertised version, or ``None`` when nothing is published yet."""
        answer = self._get(LATEST_PATH)
        if answer.status == 404:
            raise WeightFetchError(
                f"{self.base_url}{LATEST_PATH} answered 404 ({error_text(answer.body)}); is "
                f"{self.base_url} the trainer's weight server?"
            )
        return self._read(Latest, answer, LATEST_PATH).manifest

    def manifest(self, version: int) -> WeightsManifest:
        """``version``'s manifest (:class:`WeightVersionError` when it is not kept)."""
        path = MANIFEST_PATH.format(version=version)
        answer = self._get(path)
        if answer.status == 404:
            raise WeightVersionError(
                f"{self.base_url}{path}: {error_text(answer.body)}",
                requested=version,
                received=None,
            )
        manifest = self._read(WeightsManifest, answer, path)
        if manifest.version != version:
            raise WeightVersionError(
                f"asked {self.base_url} for policy version {version}, got version "
                f"{manifest.version}; nothing was loaded",
                requested=version,
                received=manifest.version,
            )
        return manifest

    def fetch(self, version: int | None = None) -> tuple[int, StateDict]:
        if version is not None:
            return version, self._download(self.manifest(version))
        # The newest version can be evicted between reading the manifest and downloading it
        # (a publish in between with keep_last=1); then read the manifest again.
        for _ in range(3):
            manifest = self.latest()
            if manifest is None:
                raise WeightVersionError(
                    f"{self.base_url} has {NOTHING_PUBLISHED}; "
                    "use wait_for_version() to wait for the first one",
                    requested=None,
                    received=None,
                )
            try:
                return manifest.version, self._download(manifest)
            except WeightVersionError as exc:
                if exc.received is not None:
                    raise
                log.info("version %d evicted while fetching; re-reading latest", manifest.version)
        raise WeightFetchError(
            f"{self.base_url}: the newest version was replaced during each of 3 downloads; "
            "raise the trainer's keep_last so a version outlives one download"
        )

    def wait_for_version(self, min_version: int, timeout_s: float, poll_s: float = 0.5) -> int:
        """Block until a version >= ``min_version`` is published; return the newest version.

        An unreachable trainer counts as "not yet" (a rollout worker may start first) until
        ``timeout_s``; the ``TimeoutError`` then names the last problem seen.
        """
        deadline = time.monotonic() + timeout_s
        seen: str = "nothing published"
        while True:
            try:
                manifest = self.latest()
                if manifest is not None and manifest.version >= min_version:
                    return manifest.version
                seen = "nothing published" if manifest is None else f"version {manifest.version}"
            except WeightFetchError as exc:
                seen = str(exc)
            if time.monotonic() + poll_s > deadline:
                raise TimeoutError(
                    f"no policy version >= {min_version} at {self.base_url} after "
                    f"{timeout_s:g}s (last seen: {seen}); is the trainer stepping?"
                )
            time.sleep(poll_s)

    def _download(self, manifest: WeightsManifest) -> StateDict:
        """Every piece of ``manifest``'s version, verified, as a state dict; or an error."""
        version, source = manifest.version, f"{self.base_url} (policy version {manifest.version})"
        try:
            check_layout(manifest, self.base_url)
        except ValueError as exc:
            raise WeightFetchError(str(exc)) from None
        pieces = manifest.pieces
        # Every byte is checked against its piece's sha256 as it lands; the pieces' list (the
        # version's checksum) is checked before any is pulled.
        listed = pieces_checksum(version, manifest.size, pieces)
        if listed != manifest.pieces_sha256:
            raise self._refuse(
                WeightIntegrityError(version, manifest.pieces_sha256, listed, source)
            )
        buf = torch.empty(manifest.size, dtype=torch.uint8)  # each piece lands in its place
        data = buf.numpy().data.cast("B")  # keeps buf alive, as do the tensors viewing it
        deadline = time.monotonic() + self.version_timeout_s
        pool = ThreadPoolExecutor(
            min(self.parallel, len(pieces)), thread_name_prefix="weights-pull"
        )
        try:
            futures = {
                pool.submit(self._piece, version, i, p, data[p.offset : p.offset + p.size]): i
                for i, p in enumerate(pieces)
            }
            pending: set[Future[None]] = set(futures)
            while pending:
                left = deadline - time.monotonic()
                done, pending = wait(pending, timeout=max(left, 0), return_when=FIRST_EXCEPTION)
                if not done:
                    raise WeightFetchError(
                        f"{source}: {len(pending)} of {len(pieces)} pieces still missing after "
                        f"{self.version_timeout_s:g}s (the version timeout); nothing was loaded"
                    )
                for future in done:
                    future.result()  # re-raises the piece's error
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        try:
            return tensors_from_bytes(data)
        except (ValueError, KeyError, TypeError, RuntimeError) as exc:
            raise WeightFetchError(
                f"{source}: checksums ok but not safetensors data: {exc}"
            ) from exc

    def _piece(self, version: int, index: int, piece: Piece, into: memoryview) -> None:
        """Piece ``index`` of ``version`` written into ``into``, its version and sha256 checked."""
        path = PIECE_PATH.format(version=version, index=index)
        try:
            answer = self._get(path, into=into)
        except WeightFetchError as exc:
            raise WeightFetchError(
                f"policy version {version} from {self.base_url}: piece {index} failed: {exc}; "
                "nothing was loaded (the model keeps its previous weights)"
            ) from exc
        if answer.status == 404:
            raise WeightVersionError(
                f"{self.base_url}{path}: {error_text(answer.body)} (superseded while pulling)",
                requested=version,
                received=None,
            )
        got = answer.headers.get(VERSION_HEADER)
        if got != str(version):
            raise WeightVersionError(
                f"asked {self.base_url} for policy version {version}, got version {got}; "
                "nothing was loaded",
                requested=version,
                received=int(got) if got and got.isdigit() else -1,
            )
        actual = hashlib.sha256(into).hexdigest()
        advertised = (answer.headers.get(CHECKSUM_HEADER) or "").strip().lower()
        if actual != piece.sha256 or advertised != piece.sha256:
            shown = (
                piece.sha256
                if advertised == piece.sha256
                else f"{piece.sha256} (header: {advertised or 'missing'})"
            )
            raise self._refuse(
                WeightIntegrityError(
                    version, shown, actual, source=f"{self.base_url}{path} (piece {index})"
                )
            )

    def _refuse(self, exc: WeightIntegrityError) -> WeightIntegrityError:
        """Log (warning: a corrupted transfer or mismatched versions) and count a refusal."""
        log.warning("refused: %s", exc)
        self.count_refused()
        return exc

    def _read(self, cls: type[T], answer: httpclient.Response, path: str) -> T:
        try:
            return decode(cls, answer.body, "body")
        except ValueError as exc:  # a ProtocolError names the field
            raise WeightFetchError(
                f"unreadable manifest from {self.base_url}{path}: {exc}"
            ) from exc

    def _get(self, path: str, into: memoryview | None = None) -> httpclient.Response:
        """GET with retries (``httpclient.request``, a 200 body written ``into`` when given);
        returns 200 and 404 answers."""
        try:
            return httpclient.request(
                "GET", self.base_url + path, timeout_s=self.timeout_s, retry=self.retry,
                accept=(HTTPStatus.NOT_FOUND,), into=into,
            )  # fmt: skip
        except (httpclient.HTTPCallError, httpclient.WorkerBusy) as exc:
            raise WeightFetchError(
                f"{exc} (is the trainer's weight server running and reachable?)"
            ) from exc
