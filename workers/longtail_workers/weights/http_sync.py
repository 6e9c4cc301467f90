"""HTTP pull of versioned policy weights: the default transport, works anywhere.

The trainer runs a :class:`WeightServer` (``httpserver.py``: uvicorn in a
background thread) over a :class:`~longtail_workers.weights.store.WeightStore`; each rollout
worker uses an :class:`HttpWeightClient` between rollouts::

    GET /v1/weights/latest     -> 200 JSON {"version", "checksum", "size", "dtypes"}
                                  404 JSON {"error"} before the first publish
    GET /v1/weights/{version}  -> 200 safetensors bytes, headers X-Longtail-Weights-Version
                                  and X-Longtail-Weights-Sha256; 404 when not kept (any more)

The client downloads through ``httpclient.request``: a per-request timeout, unreachable-server
and 5xx failures retried with exponential backoff and jitter (many workers pull at once after
each step), and the sha256 of the bytes and the version verified before anything reaches the
model.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from http import HTTPStatus

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from longtail_workers import httpclient
from longtail_workers.httprequest import JSONRequestHandler, error_text
from longtail_workers.httpserver import BackgroundHTTPServer
from longtail_workers.weights.store import WeightStore
from longtail_workers.weights.sync import (
    StateDict,
    WeightFetchError,
    WeightIntegrityError,
    WeightPublisher,
    WeightsManifest,
    WeightSource,
    WeightVersionError,
)

log = logging.getLogger(__name__)

LATEST_PATH = "/v1/weights/latest"
VERSION_PATH = "/v1/weights/{version}"
VERSION_HEADER = "X-Longtail-Weights-Version"
CHECKSUM_HEADER = "X-Longtail-Weights-Sha256"
_VERSION_RE = re.compile(r"^/v1/weights/(\d{1,18})$")
NOTHING_PUBLISHED = "no policy weights published yet"


class _Handler(JSONRequestHandler):
    app: WeightServer
    dispatch_methods = ("GET",)
    json_separators = None  # json.dumps' default, with spaces

    def _dispatch(self, method: str) -> None:
        store = self.app.store
        path = self.path
        if path == LATEST_PATH:
            entry = store.latest()
            if entry is None:
                self.send_json(HTTPStatus.NOT_FOUND, {"error": f"{NOTHING_PUBLISHED}; retry later"})
            else:
                self.send_json(HTTPStatus.OK, entry.manifest.to_dict())
            return
        match = _VERSION_RE.match(path)
        if match is None:
            self.send_json(
                HTTPStatus.NOT_FOUND,
                {"error": f"unknown path {path!r}; use {LATEST_PATH} or {VERSION_PATH}"},
            )
            return
        version = int(match.group(1))
        entry = store.get(version)
        if entry is None:
            kept = store.versions()
            message = f"version {version} is not kept; kept versions: {kept}"
            self.send_json(HTTPStatus.NOT_FOUND, {"error": message})
            return
        headers = {
            VERSION_HEADER: str(entry.manifest.version),
            CHECKSUM_HEADER: entry.manifest.checksum,
        }
        self.send_body(HTTPStatus.OK, entry.data, "application/octet-stream", headers)


class WeightServer(WeightPublisher, BackgroundHTTPServer):
    """Serves a :class:`WeightStore` over HTTP; ``publish`` goes straight to the store."""

    handler_class = _Handler
    thread_name = "weights-http"
    started_log = "policy weights served on %s"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        keep_last: int = 2,
        request_timeout_s: float = 300.0,
    ) -> None:
        super().__init__(host, port, request_timeout_s=request_timeout_s)
        self.host = host
        self.requested_port = port
        self.store = WeightStore(keep_last=keep_last)

    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> WeightsManifest:
        return self.store.publish(version, state_dict)

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
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"need timeout_s > 0; got {timeout_s}")
        self.base_url = httpclient.checked_base_url(base_url, "weights URL")
        self.timeout_s = timeout_s
        self.retry = httpclient.Retry(retries, backoff_s, max_backoff_s)

    def latest(self) -> WeightsManifest | None:
        """The newest advertised version, or ``None`` when nothing is published yet."""
        answer = self._get(LATEST_PATH)
        body = answer.body
        if answer.status == 404:
            text = error_text(body)
            if text.startswith(NOTHING_PUBLISHED):
                return None
            raise WeightFetchError(
                f"{self.base_url}{LATEST_PATH} answered 404 ({text}); is {self.base_url} the "
                "trainer's weight server?"
            )
        try:
            obj = json.loads(body)
            return WeightsManifest(
                version=int(obj["version"]),
                checksum=str(obj["checksum"]),
                size=int(obj["size"]),
                dtypes={str(k): str(v) for k, v in obj["dtypes"].items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise WeightFetchError(
                f"unreadable manifest from {self.base_url}{LATEST_PATH}: {exc}"
            ) from exc

    def fetch(self, version: int | None = None) -> tuple[int, StateDict]:
        if version is not None:
            return version, self._download(version, manifest=None)
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
                return manifest.version, self._download(manifest.version, manifest=manifest)
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

    def _download(self, version: int, manifest: WeightsManifest | None) -> StateDict:
        path = VERSION_PATH.format(version=version)
        answer = self._get(path)
        if answer.status == 404:
            raise WeightVersionError(
                f"{self.base_url}{path}: {error_text(answer.body)}",
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
        # The manifest (when there is one) and the response header must advertise the same
        # checksum, and the bytes must hash to it.
        try:
            answer.check_sha256(CHECKSUM_HEADER, manifest.checksum if manifest else None)
        except httpclient.ChecksumMismatch as exc:
            raise WeightIntegrityError(
                version, exc.expected, exc.actual, source=self.base_url + path
            ) from exc
        try:
            return dict(load_safetensors(answer.body))
        except SafetensorError as exc:
            raise WeightFetchError(
                f"{self.base_url}{path}: checksum ok but not safetensors data: {exc}"
            ) from exc

    def _get(self, path: str) -> httpclient.Response:
        """GET with retries (``httpclient.request``); returns 200 and 404 answers."""
        try:
            return httpclient.request(
                "GET", self.base_url + path, timeout_s=self.timeout_s, retry=self.retry,
                accept=(HTTPStatus.NOT_FOUND,),
            )  # fmt: skip
        except (httpclient.HTTPCallError, httpclient.WorkerBusy) as exc:
            raise WeightFetchError(
                f"{exc} (is the trainer's weight server running and reachable?)"
            ) from exc
