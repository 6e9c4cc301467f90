"""The verifier service over real HTTP on loopback: scoring, error answers, metrics, shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.client import HTTPConnection
from typing import Any

import pytest
from httpcall import http, http_json

from longtail_workers.rewards import RewardResult, register_reward, unregister_reward
from longtail_workers.verifier import (
    VerifierClient,
    VerifierConfig,
    VerifierError,
    VerifierServer,
)
from longtail_workers.verifier.service import LISTENING_PREFIX, main

GOOD = {
    "items": [
        {"answer": r"so \boxed{\frac{1}{2}}", "gold": "0.5"},
        {"answer": "Answer: 41", "gold": "42"},
        {"answer": "no idea", "gold": "7"},
    ]
}


@pytest.fixture
def server() -> Iterator[VerifierServer]:
    config = VerifierConfig(port=0, max_batch=8, max_answer_chars=1000, max_body_bytes=64 * 1024)
    with VerifierServer(config) as srv:
        yield srv


def verify(srv: VerifierServer, payload: Any) -> tuple[int, Any]:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return http_json(srv.url + "/v1/verify", "POST", raw)


def test_health_and_readiness(server: VerifierServer) -> None:
    assert http(server.url + "/healthz")[::2] == (200, b"ok\n")
    assert http(server.url + "/readyz")[::2] == (200, b"ready\n")
    status, headers, body = http(server.url + "/healthz", "HEAD")
    assert (status, body, headers["Content-Length"]) == (200, b"", "3")


def test_good_batch(server: VerifierServer) -> None:
    status, body = verify(server, {**GOOD, "formatWeight": 0.1})
    assert status == 200
    assert body["reward"] == "math"
    assert body["results"] == [
        {"reward": 1.0, "correct": True, "extracted": r"\frac{1}{2}", "formatted": True},
        {"reward": pytest.approx(0.1), "correct": False, "extracted": "41", "formatted": True},
        {"reward": 0.0, "correct": False, "extracted": None, "formatted": False,
         "reason": "no final answer: no \\boxed{...} or Answer: line at the end of the output"},
    ]  # fmt: skip
    assert body["rewardMean"] == pytest.approx(1.1 / 3)


def test_items_may_name_their_own_reward(server: VerifierServer) -> None:
    # dataset.rewardBySource: the trainer routes each row's data_source to a reward by name.
    @register_reward("test.always")
    def always(answer: str, gold: str, *, format_weight: float = 0.0) -> RewardResult:
        return RewardResult(reward=1.0, correct=True, extracted=answer, formatted=True)

    items = [{"answer": "Answer: 41", "gold": "42"}, {**GOOD["items"][1], "reward": "test.always"}]
    try:
        status, body = verify(server, {"items": items})
        unknown = verify(server, {"items": [{**items[0], "reward": "test.nope"}]})
        metrics = http(server.url + "/metrics")[2].decode()
    finally:
        unregister_reward("test.always")
    assert status == 200 and [r["correct"] for r in body["results"]] == [False, True]
    assert body["reward"] == "math"
    assert unknown[0] == 400 and "unknown reward 'test.nope'" in unknown[1]["error"]
    assert 'longtail_verifier_items_scored_total{reward="test.always"} 1.0' in metrics
    assert 'longtail_verifier_items_scored_total{reward="math"} 1.0' in metrics


def test_threads_keep_request_order() -> None:
    items = [{"answer": f"Answer: {i}", "gold": str(i % 3)} for i in range(12)]
    with VerifierServer(VerifierConfig(port=0, score_threads=4)) as srv:
        status, body = verify(srv, {"items": items})
    assert status == 200
    assert [r["correct"] for r in body["results"]] == [i < 3 for i in range(12)]


def test_empty_batch(server: VerifierServer) -> None:
    assert verify(server, {"items": []}) == (
        200,
        {"results": [], "reward": "math", "rewardMean": None},
    )


@pytest.mark.parametrize(
    ("payload", "status", "message"),
    [
        (b'{"items": [', 400, "malformed JSON: Expecting value at line 1 column 12"),
        (b'{"items": "\xff"}', 400, "not valid UTF-8"),
        (b"   ", 400, "request body is empty"),
        (b"[" * 100_000 + b"]" * 100_000, 413, "over the limit of 65536 bytes"),
        (b"[" * 30_000 + b"]" * 30_000, 400, "nested too deeply"),
        (b'{"items": [], "formatWeight": NaN}', 400, "NaN is not valid JSON"),
        (json.dumps({"items": [{"answer": "a", "gold": 5}]}).encode(), 400, "items[0].gold"),
        (json.dumps({"items": [{"answer": "a", "gold": "b"}] * 9}), 413, "batch limit of 8"),
        (
            json.dumps(
                {"items": [{"answer": "a", "gold": "b"}, {"answer": "x" * 1001, "gold": "b"}]}
            ),
            413,
            "items[1].answer: is 1001 characters, over the limit of 1000",
        ),
        (json.dumps({**GOOD, "reward": "nope"}), 400, "unknown reward 'nope'; known rewards: "),
    ],
)
def test_bad_requests_get_clear_errors_and_server_keeps_serving(
    server: VerifierServer, payload: bytes | str, status: int, message: str
) -> None:
    raw = payload.encode() if isinstance(payload, str) else payload
    got_status, _, body = http(server.url + "/v1/verify", "POST", raw)
    assert got_status == status
    assert message in json.loads(body)["error"]
    assert verify(server, GOOD)[0] == 200  # still serving


def test_unknown_reward_lists_math(server: VerifierServer) -> None:
    status, body = verify(server, {**GOOD, "reward": "nope"})
    assert status == 400 and "math" in body["error"]


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("GET", "/nope", 404, None),
        ("POST", "/nope", 404, None),
        ("GET", "/v1/verify", 405, "POST"),
        ("POST", "/healthz", 405, "GET, HEAD"),
        ("DELETE", "/metrics", 405, "GET, HEAD"),
    ],
)
def test_wrong_path_or_method(
    server: VerifierServer, method: str, path: str, status: int, allow: str | None
) -> None:
    got, headers, body = http(server.url + path, method, b"{}" if method == "POST" else None)
    assert got == status
    assert json.loads(body)["error"]
    assert headers.get("Allow") == allow


def test_content_length_cap_is_checked_before_reading(server: VerifierServer) -> None:
    conn = HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.putrequest("POST", "/v1/verify")
    conn.putheader("Content-Length", str(10 * 1024 * 1024))
    conn.endheaders()  # the 10 MiB body is never sent: the server must answer anyway
    resp = conn.getresponse()
    assert resp.status == 413
    assert "over the limit of 65536 bytes" in json.loads(resp.read())["error"]
    assert resp.getheader("Connection") == "close"
    conn.close()


def test_missing_content_length(server: VerifierServer) -> None:
    conn = HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.putrequest("POST", "/v1/verify")
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 411
    assert "Content-Length header is required" in json.loads(resp.read())["error"]
    conn.close()


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/v1/verify", b"{oops", 400),
        ("POST", "/nope", b'{"items": []}', 404),
        ("PUT", "/v1/verify", b"{}", 405),
        ("POST", "/v1/verify", b"[" * 70_000, 413),  # over max_body_bytes, drained
    ],
)
def test_keep_alive_connection_survives_errors(
    server: VerifierServer, method: str, path: str, body: bytes, status: int
) -> None:
    conn = HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request(method, path, body=body)
    first = conn.getresponse()
    assert first.status == status and first.getheader("Connection") is None
    first.read()
    conn.request("POST", "/v1/verify", body=json.dumps(GOOD).encode())
    second = conn.getresponse()
    assert second.status == 200 and len(json.loads(second.read())["results"]) == 3
    conn.close()


def test_buggy_reward_gives_500_naming_it(server: VerifierServer) -> None:
    @register_reward("test.buggy")
    def buggy(answer: str, gold: str, *, format_weight: float = 0.0) -> RewardResult:
        raise ZeroDivisionError("oops")

    try:
        status, body = verify(server, {**GOOD, "reward": "test.buggy"})
    finally:
        unregister_reward("test.buggy")
    assert status == 500
    assert "reward 'test.buggy' failed on items[0]: ZeroDivisionError: oops" in body["error"]
    assert verify(server, GOOD)[0] == 200


def test_metrics_count_requests_and_items(server: VerifierServer) -> None:
    verify(server, GOOD)
    verify(server, b"not json")
    http(server.url + "/nope")
    status, headers, body = http(server.url + "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    text = body.decode()
    assert 'longtail_verifier_requests_total{code="200",endpoint="/v1/verify"} 1.0' in text
    assert 'longtail_verifier_requests_total{code="400",endpoint="/v1/verify"} 1.0' in text
    assert 'longtail_verifier_requests_total{code="404",endpoint="other"} 1.0' in text
    assert 'longtail_verifier_items_scored_total{reward="math"} 3.0' in text
    assert 'longtail_verifier_items_correct_total{reward="math"} 1.0' in text
    assert 'longtail_verifier_items_unformatted_total{reward="math"} 1.0' in text
    assert 'longtail_verifier_reward_count{reward="math"} 3.0' in text
    assert "longtail_verifier_request_duration_seconds_bucket" in text


def test_two_servers_have_separate_metrics(server: VerifierServer) -> None:
    with VerifierServer(VerifierConfig(port=0)) as other:
        verify(other, GOOD)
        assert other.port != server.port
        assert b'code="200",endpoint="/v1/verify"' not in http(server.url + "/metrics")[2]


def test_stop_turns_readiness_off_and_closes() -> None:
    srv = VerifierServer(VerifierConfig(port=0)).start()
    url = srv.url
    srv.stop()
    assert not srv.ready and srv.unready() == "stopping"  # /readyz says 503 stopping
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/healthz", timeout=2)
    srv.stop()  # idempotent


def test_client(server: VerifierServer) -> None:
    client = VerifierClient(server.url)
    client.wait_ready(timeout_s=5)
    response = client.verify([(r"\boxed{3}", "3"), ("x", "3")], format_weight=0.2)
    assert [r.correct for r in response.results] == [True, False]
    assert response.reward_mean == pytest.approx(0.5)
    with pytest.raises(VerifierError, match=r"HTTP 400: reward: unknown reward 'nope'") as info:
        client.verify([("a", "b")], reward="nope")
    assert info.value.status == 400


def test_client_unreachable() -> None:
    srv = VerifierServer(VerifierConfig(port=0)).start()
    url = srv.url
    srv.stop()
    with pytest.raises(VerifierError, match=r"cannot reach .*is the verifier running"):
        VerifierClient(url, timeout_s=2).verify([("a", "b")])
    with pytest.raises(TimeoutError, match=r"not ready after 0.3s"):
        VerifierClient(url).wait_ready(timeout_s=0.3, poll_s=0.05)


def test_main_rejects_unknown_default_reward(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--port", "0", "--reward", "nope"]) == 2
    assert "--reward: unknown reward 'nope'; known rewards: math" in capsys.readouterr().err


def test_main_rejects_missing_plugin_module(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--port", "0", "--reward-module", "no_such_module_xyz"]) == 2
    assert "--reward-module no_such_module_xyz: cannot import it" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-1", "inf", "soon"])
def test_main_rejects_bad_answer_timeout(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--port", "0", "--answer-timeout-seconds", value])
    assert info.value.code == 2
    assert "--answer-timeout-seconds: must be" in capsys.readouterr().err


def test_main_port_in_use(server: VerifierServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--port", str(server.port), "--insecure-no-auth"]) == 1
    assert f"cannot listen on 127.0.0.1:{server.port}" in capsys.readouterr().err


def test_main_serves_until_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "longtail_workers.verifier.service", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "LONGTAIL_AUTH_TOKEN": "t0ken"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(LISTENING_PREFIX), (line, proc.stderr and proc.stderr.read())
        url = line.removeprefix(LISTENING_PREFIX).strip()
        assert http(url + "/healthz")[::2] == (200, b"ok\n")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_stop_signals_are_handled_before_the_url_is_announced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A supervisor may send SIGTERM as soon as it reads the URL. The handler must already be
    # installed when the server starts (it used to come after the announcement, and a SIGTERM
    # in that window killed the process with -15 instead of a clean stop).
    seen: list[Any] = []
    start = VerifierServer.start

    def recording_start(self: VerifierServer) -> Any:
        seen.append(signal.getsignal(signal.SIGTERM))
        return start(self)

    monkeypatch.setattr(VerifierServer, "start", recording_start)
    stop = threading.Event()
    stop.set()  # main() returns as soon as it has started and announced
    before = signal.getsignal(signal.SIGTERM)
    assert main(["--port", "0", "--insecure-no-auth"], stop=stop) == 0
    assert seen and seen[0] not in (signal.SIG_DFL, before)
    assert signal.getsignal(signal.SIGTERM) == before  # restored on the way out
