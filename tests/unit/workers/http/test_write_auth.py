"""Issue #21, item 3: every write endpoint of the verifier, rollout workers and trainer requires
the job's token; reads stay open; the clients carry it; a worker without one refuses to start;
``longtail run`` hands its children a token through the environment, not the command line.

Real servers on loopback (the one check in ``httprequest.py``), real clients.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from httpcall import http

from longtail_api.auth import TOKEN_ENV, token_matches
from longtail_api.policies import HarvestSpec
from longtail_workers.drafter.exchange import (
    DrafterEndpoints,
    DrafterExchangeError,
    RemoteDrafterRegistry,
)
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.registry import CandidateInfo, DrafterRegistry
from longtail_workers.drafter_worker.service import main as drafter_main
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.local.coordinator import Coordinator
from longtail_workers.local.launcher import Child
from longtail_workers.rollout.control import RolloutWorker
from longtail_workers.rollout.http import ControlConfig
from longtail_workers.rollout.service import RolloutServer
from longtail_workers.rollout.service import main as rollout_main
from longtail_workers.trainer.dispatch import RolloutPool, RolloutRejected
from longtail_workers.trainer.service import TrainerApp
from longtail_workers.trainer.service import main as trainer_main
from longtail_workers.verifier import VerifierClient, VerifierConfig, VerifierError, VerifierServer
from longtail_workers.verifier.service import main as verifier_main

TOKEN = "job-token-for-tests"
GENERATE = {
    "step": 0,
    "policyVersion": 0,
    "requests": [{"id": "r0", "promptTokenIds": [1, 2, 3], "maxNewTokens": 2, "temperature": 1.0}],
}
TID = "tiny-auth"


def call(url: str, method: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    auth = {} if token is None else {"Authorization": f"Bearer {token}"}
    code, headers, raw = http(url, method, data, auth, timeout=30)
    json_body = (headers["Content-Type"] or "").startswith("application/json")
    return code, json.loads(raw) if json_body else raw


def assert_guarded(url: str, method: str, body: Any = None) -> None:
    """401 with a JSON error without a token and with a wrong one."""
    for token in (None, "not-the-job-token", ""):
        code, answer = call(url, method, body, token)
        assert code == 401, (url, method, token, code, answer)
        assert "unauthorized" in answer["error"] and TOKEN_ENV in answer["error"]
        assert TOKEN not in answer["error"]


@pytest.fixture(scope="module")
def rollout(model) -> Iterator[RolloutServer]:
    worker = RolloutWorker(TorchEngine(model), target_id=TID, name="rollout-0", weights=None)
    srv = RolloutServer(worker, ControlConfig(port=0))
    srv.auth_token = TOKEN
    with srv:
        yield srv


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[TrainerApp]:
    app = TrainerApp("127.0.0.1", 0)
    app.auth_token = TOKEN
    app.drafters = DrafterEndpoints(
        DrafterRegistry(tmp_path / "drafters"), policy_version=lambda: 0
    )
    with app:
        yield app


def test_constant_time_token_check_reads_only_bearer() -> None:
    assert token_matches(f"Bearer {TOKEN}", TOKEN) and token_matches(f"bearer  {TOKEN} ", TOKEN)
    assert not token_matches(None, TOKEN) and not token_matches(TOKEN, TOKEN)
    assert not token_matches(f"Basic {TOKEN}", TOKEN) and not token_matches("Bearer x", TOKEN)


def test_verifier_verify_needs_the_token_and_reads_stay_open() -> None:
    config = VerifierConfig(port=0)
    server = VerifierServer(config)
    server.auth_token = TOKEN
    with server:
        items = {"items": [{"answer": r"\boxed{4}", "gold": "4"}]}
        assert_guarded(server.url + "/v1/verify", "POST", items)
        assert call(server.url + "/healthz", "GET")[0] == 200
        assert call(server.url + "/metrics", "GET")[0] == 200
        code, answer = call(server.url + "/v1/verify", "POST", items, TOKEN)
        assert code == 200 and answer["results"][0]["correct"] is True
        assert (
            VerifierClient(server.url, token=TOKEN).verify([(r"\boxed{4}", "4")]).results[0].correct
        )
        with pytest.raises(VerifierError, match="HTTP 401"):
            VerifierClient(server.url).verify([("4", "4")])


def test_rollout_role_and_generate_need_the_token(rollout) -> None:
    url = rollout.url
    assert_guarded(url + "/v1/role", "PUT", {"role": "rollout"})
    assert_guarded(url + "/v1/generate", "POST", GENERATE)
    for path in ("/healthz", "/readyz", "/metrics", "/v1/status"):
        assert call(url + path, "GET")[0] == 200, path
    assert call(url + "/v1/role", "PUT", {"role": "rollout"}, TOKEN)[0] == 200
    assert call(url + "/v1/generate", "POST", GENERATE, TOKEN)[0] == 200


def generate_on(url: str, token: str | None = None) -> int:
    """Answers of one rollout of the trainer's pool on the worker at ``url``."""
    request = GenerationRequest([1, 2, 3], 2, temperature=1.0, request_id="r0")
    pool = RolloutPool({"rollout-0": url}, token=token)
    return len(pool.run([request], 0, 0, threading.Event()).samples)


def test_the_trainers_pool_carries_the_token(rollout) -> None:
    assert generate_on(rollout.url, TOKEN) == 1
    with pytest.raises(RolloutRejected, match="HTTP 401"):
        generate_on(rollout.url, "wrong")


def test_the_pool_and_clients_default_to_the_process_token(rollout, monkeypatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)  # what a worker pod or a `longtail run` child has
    assert generate_on(rollout.url) == 1
    monkeypatch.delenv(TOKEN_ENV)
    with pytest.raises(RolloutRejected, match="HTTP 401"):
        generate_on(rollout.url)


def test_trainer_writes_need_the_token(trainer) -> None:
    url = trainer.url
    assert_guarded(url + "/v1/checkpoint", "POST", {"reason": "test"})
    assert_guarded(url + "/v1/role", "PUT", {"role": "train"})
    assert_guarded(url + "/v1/drafters/candidates?worker=w", "POST", {})
    for path in ("/healthz", "/metrics", "/v1/status", "/v1/drafters/latest"):
        assert call(url + path, "GET")[0] == 200, path
    # With the token the request reaches the trainer's own handler (still starting: 503).
    assert call(url + "/v1/checkpoint", "POST", {"reason": "test"}, TOKEN)[0] == 503
    assert call(url + "/v1/role", "PUT", {"role": "train"}, TOKEN)[0] == 200


def test_drafter_uploads_carry_the_token(trainer, model, tmp_path) -> None:
    drafter = EagleDrafter(model, target_id=TID)
    info = CandidateInfo(worker="w", base_version=None, policy_version=0, tokens=8, steps=1)
    opts: dict[str, Any] = {"retries": 0, "timeout_s": 10.0}
    ok = RemoteDrafterRegistry(trainer.url, cache_dir=tmp_path / "a", token=TOKEN, **opts)
    assert ok.submit_candidate(drafter, info).worker == "w"
    bad = RemoteDrafterRegistry(trainer.url, cache_dir=tmp_path / "b", token="wrong", **opts)
    with pytest.raises(DrafterExchangeError, match="HTTP 401"):
        bad.submit_candidate(drafter, info)
    assert ok.latest_version() is None  # downloads are reads: no token needed, none refused


def test_the_local_coordinator_carries_the_token(rollout) -> None:
    coordinator = Coordinator(HarvestSpec(), "http://127.0.0.1:9", {"rollout-0": rollout.url})
    coordinator.token = TOKEN
    coordinator._assign("rollout-0", "rollout")
    assert coordinator.books.switches == 1
    coordinator.token = "wrong"
    coordinator._assign("rollout-0", "rollout")  # refused: logged, not counted
    assert coordinator.books.switches == 1


@pytest.mark.parametrize("role", ["verifier", "rollout", "trainer", "drafter"])
def test_a_worker_without_a_token_refuses_to_start(role, monkeypatch, capsys) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv("LONGTAIL_INSECURE_NO_AUTH", raising=False)
    argv = {
        "verifier": (verifier_main, ["--port", "0"]),
        "rollout": (rollout_main, ["--job", "missing.yaml", "--port", "0"]),
        "trainer": (
            trainer_main,
            ["--job", "x", "--run-dir", "x", "--rollout", "r=http://x", "--verifier-url", "x"],
        ),
        "drafter": (
            drafter_main,
            ["--job", "x", "--trainer-url", "http://x", "--weights-url", "http://x"],
        ),
    }
    entry, args = argv[role]
    assert entry(args) == 2  # before anything loads or binds
    err = capsys.readouterr().err
    assert f"worker {role}: {TOKEN_ENV} is not set" in err and "--insecure-no-auth" in err


def test_the_opt_out_runs_open_and_says_so(monkeypatch, caplog) -> None:
    import threading

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    stop = threading.Event()
    stop.set()
    assert verifier_main(["--port", "0", "--insecure-no-auth"], stop=stop) == 0
    assert "write endpoints are OPEN" in caplog.text


def test_longtail_run_children_get_the_token_in_their_environment(tmp_path, monkeypatch) -> None:
    from longtail_workers.auth import export_run_token

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    token = export_run_token()  # what `longtail run` does before it starts its children
    assert os.environ[TOKEN_ENV] == token and len(token) >= 40
    child = Child(
        "verifier", "verifier", ["--port", "0"], tmp_path, "longtail verifier listening on "
    )
    try:
        url = child.wait_ready(60.0)
        cmdline = Path(f"/proc/{child.proc.pid}/cmdline").read_bytes().decode()
        assert token not in cmdline and sys.executable in cmdline
        items = {"items": [{"answer": "1", "gold": "1"}]}
        assert call(url + "/v1/verify", "POST", items)[0] == 401
        assert call(url + "/v1/verify", "POST", items, token)[0] == 200
    finally:
        child.stop(5.0)
    assert export_run_token() != token  # one per run
