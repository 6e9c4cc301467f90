"""Verifier wire types (``longtail_api.protocol``) and the shared metric names."""

from __future__ import annotations

import json
from typing import Any

import pytest

from longtail_api import metrics
from longtail_api.protocol import (
    ErrorResponse,
    ProtocolError,
    ProtocolLimitError,
    VerifyItem,
    VerifyRequest,
    VerifyResponse,
    VerifyResult,
)


def _request(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"items": [{"answer": r"\boxed{1}", "gold": "1"}]}
    body.update(overrides)
    return body


def test_request_round_trip() -> None:
    request = VerifyRequest(
        items=(VerifyItem("a", "b"), VerifyItem("c", "d", reward="other")),
        reward="math",
        format_weight=0.25,
    )
    wire = json.loads(json.dumps(request.to_dict()))
    assert wire["formatWeight"] == 0.25
    assert "reward" not in wire["items"][0] and wire["items"][1]["reward"] == "other"
    assert VerifyRequest.from_dict(wire) == request


def test_request_defaults() -> None:
    request = VerifyRequest.from_dict(_request())
    assert request.reward is None and request.format_weight == 0.0
    assert "reward" not in request.to_dict()
    assert VerifyRequest.from_dict({"items": []}).items == ()


def test_response_round_trip() -> None:
    response = VerifyResponse(
        results=(
            VerifyResult(1.0, True, "1", True),
            VerifyResult(0.0, False, None, False, reason="no final answer"),
        ),
        reward="math",
        reward_mean=0.5,
    )
    wire = json.loads(json.dumps(response.to_dict()))
    assert wire["rewardMean"] == 0.5 and wire["results"][1]["extracted"] is None
    assert "reason" not in wire["results"][0]
    assert wire["results"][1]["reason"] == "no final answer"
    assert VerifyResponse.from_dict(wire) == response


def test_error_response_round_trip() -> None:
    assert ErrorResponse.from_dict(ErrorResponse("boom").to_dict()) == ErrorResponse("boom")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], r"^request: must be a JSON object, got \[\]"),
        ({}, r"^items: is required"),
        ({"items": {"answer": "a"}}, r"^items: must be a list of \{answer, gold\} objects"),
        ({"items": ["x"]}, r"^items\[0\]: must be a JSON object, got 'x'"),
        (
            {"items": [{"answer": "a", "gold": "b"}] * 3 + [{"answer": "a", "gold": 5}]},
            r"^items\[3\]\.gold: must be a string, got 5 \(send the gold answer as text",
        ),
        ({"items": [{"gold": "1"}]}, r"^items\[0\]\.answer: is required"),
        ({"items": [{"answer": None, "gold": "1"}]}, r"^items\[0\]\.answer: must be a string"),
        (
            {"items": [{"answer": "a", "gold": "b", "golden": "c"}]},
            r"^items\[0\]\.golden: is not a known field \(did you mean 'gold'\?\)",
        ),
        (_request(format_weight=0.1), r"^format_weight: .*did you mean 'formatWeight'"),
        (_request(formatWeight=1.5), r"^formatWeight: must be in \[0, 1\], got 1\.5"),
        (_request(formatWeight=-1), r"^formatWeight: must be in \[0, 1\]"),
        (_request(formatWeight="0.1"), r"^formatWeight: must be a finite number, got '0\.1'"),
        (_request(formatWeight=True), r"^formatWeight: must be a finite number, got true"),
        (_request(formatWeight=float("inf")), r"^formatWeight: must be a finite number"),
        (_request(formatWeight=10**400), r"^formatWeight: must be a finite number"),
        (_request(reward=""), r"^reward: must be a non-empty reward name"),
        (_request(reward=3), r"^reward: must be a non-empty reward name, got 3"),
        (
            {"items": [{"answer": "a", "gold": "b", "reward": ""}]},
            r"^items\[0\]\.reward: must be a non-empty reward name",
        ),
    ],
)
def test_request_errors_name_path_value_and_fix(body: object, message: str) -> None:
    with pytest.raises(ProtocolError, match=message) as info:
        VerifyRequest.from_dict(body)
    assert not isinstance(info.value, ProtocolLimitError)
    assert isinstance(info.value, ValueError)


def test_batch_limit() -> None:
    body = {"items": [{"answer": "a", "gold": "b"}] * 5}
    assert len(VerifyRequest.from_dict(body, max_items=5).items) == 5
    with pytest.raises(ProtocolLimitError, match=r"^items: has 5 items, over the batch limit of 4"):
        VerifyRequest.from_dict(body, max_items=4)


def test_answer_length_limit_names_the_item() -> None:
    body = {"items": [{"answer": "a", "gold": "b"}, {"answer": "x" * 11, "gold": "b"}]}
    with pytest.raises(
        ProtocolLimitError, match=r"^items\[1\]\.answer: is 11 characters, over the limit of 10"
    ) as info:
        VerifyRequest.from_dict(body, max_answer_chars=10)
    assert info.value.path == "items[1].answer"
    body["items"][0]["gold"] = "g" * 11
    with pytest.raises(ProtocolLimitError, match=r"^items\[0\]\.gold: is 11 characters"):
        VerifyRequest.from_dict(body, max_answer_chars=10)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"results": "x", "reward": "math", "rewardMean": None}, r"^results: must be a list"),
        (
            {"results": [{"reward": "1", "correct": True, "extracted": None, "formatted": True}]},
            r"^results\[0\]\.reward: must be a finite number",
        ),
        (
            {"results": [{"reward": 1, "correct": 1, "extracted": None, "formatted": True}]},
            r"^results\[0\]\.correct: must be true or false, got 1",
        ),
        (
            {"results": [{"reward": 1, "correct": True, "extracted": 5, "formatted": True}]},
            r"^results\[0\]\.extracted: must be a string or null, got 5",
        ),
        (
            {
                "results": [
                    {
                        "reward": 0,
                        "correct": False,
                        "extracted": None,
                        "formatted": True,
                        "reason": 3,
                    }
                ]
            },
            r"^results\[0\]\.reason: must be a string or null, got 3",
        ),
    ],
)
def test_response_errors(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        VerifyResponse.from_dict(body)


def test_metric_names_follow_conventions() -> None:
    names = [spec.name for spec in metrics.ALL_METRICS]
    assert len(names) == len(set(names))
    for spec in metrics.ALL_METRICS:
        assert spec.name.startswith(metrics.PREFIX)
        assert spec.help
        assert (spec.kind == "counter") == spec.name.endswith("_total"), spec.name
        assert spec.buckets is None or spec.kind == "histogram"
    assert metrics.VERIFIER_REQUESTS_TOTAL.labels == ("endpoint", "code")
