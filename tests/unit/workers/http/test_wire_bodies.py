"""Typed bodies between worker processes survive JSON both ways and name the bad field.

Covers the engine delta of a generate reply (``wire/rollout.py``), a drafter candidate's
metadata in the exchange's upload query and its answer (``drafter/candidates.py``) and rank 0's
commands to the follower trainer ranks (``wire/ranks.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longtail_api.protocol import ProtocolError
from longtail_api.wirecodec import from_wire, to_wire
from longtail_workers.drafter.candidates import (
    CANDIDATE_FILE,
    Candidate,
    CandidateInfo,
    StoredCandidate,
)
from longtail_workers.wire import ranks
from longtail_workers.wire.rollout import EngineDelta, GenerateReply, Sample


def test_engine_delta_round_trips_in_a_reply_and_names_a_bad_field() -> None:
    delta = EngineDelta(2.5, 40, 12, 90, 60, 3.25, 11, 0.75)
    sample = Sample("a", [1], [4, 5], [-0.5, -0.25], "stop")
    reply = GenerateReply("w", 7, 2, [sample], delta)
    raw = json.loads(json.dumps(to_wire(reply)))
    assert raw["engine"]["sdTokens"] == 60 and raw["engine"]["policyLoadSeconds"] == 0.75
    assert raw["samples"][0]["id"] == "a" and from_wire(GenerateReply, raw, "reply") == reply
    with pytest.raises(ProtocolError, match=r"reply\.engine\.sdTokens: must be an integer"):
        from_wire(GenerateReply, {**raw, "engine": {**raw["engine"], "sdTokens": "many"}}, "reply")
    with pytest.raises(ProtocolError, match=r"reply\.engine\.seconds: must be >= 0"):
        from_wire(EngineDelta, {**to_wire(delta), "seconds": -1.0}, "reply.engine")
    with pytest.raises(ProtocolError, match=r"reply\.engine: must be a mapping"):
        from_wire(GenerateReply, {**raw, "engine": None}, "reply")
    with pytest.raises(ProtocolError, match=r"2 output tokens but 1 log-probs"):
        from_wire(
            GenerateReply,
            {**raw, "samples": [{**raw["samples"][0], "outputLogprobs": [0]}]},
            "reply",
        )


def test_candidate_metadata_round_trips_through_the_query_and_the_answer(tmp_path: Path) -> None:
    info = CandidateInfo("w0", None, policy_version=3, tokens=120, steps=7, train_loss=1.5)
    query = info.to_query()
    assert "base_version" not in query and "heldout_top1" not in query  # unset: not sent
    assert CandidateInfo.from_query(query) == info
    judged = CandidateInfo("9", 2, policy_version=3, tokens=120, steps=7, heldout_top1=0.5)
    assert CandidateInfo.from_query(judged.to_query()) == judged  # a numeric worker name
    cand = Candidate(**vars(info), id="w0-1", created_unix=1700000000.5)
    assert Candidate.from_dict(json.loads(json.dumps(cand.to_dict()))) == cand
    # The registry's own copy knows its directory; the exchange's answer never carries it.
    directory = tmp_path / "w0-1"
    directory.mkdir()
    stored = StoredCandidate(**vars(cand), path=directory)
    assert "path" not in stored.to_dict() and Candidate.from_dict(stored.to_dict()) == cand
    meta = {**info.to_dict(), "created_unix": cand.created_unix}  # candidate.json
    (directory / CANDIDATE_FILE).write_text(json.dumps(meta))
    assert StoredCandidate.read(directory) == stored
    (directory / CANDIDATE_FILE).write_text(json.dumps({**meta, "train_loss": float("nan")}))
    with pytest.raises(ProtocolError, match=r"train_loss: must be a finite number"):
        StoredCandidate.read(directory)  # a diverged window


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("policy_version=1&tokens=5&steps=1", r"query\.worker: is required"),
        ("worker=w&policy_version=1.5&tokens=5&steps=1", r"query\.policy_version: must be an int"),
        ("worker=w&policy_version=1&tokens=-5&steps=1", r"query\.tokens: must be >= 0"),
        ("worker=w&policy_version=1&tokens=5&steps=1&train_loss=nan", r"query\.train_loss"),
        ("worker=w&policy_version=1&tokens=5&steps=1&color=red", r"query\.color: not a candidate"),
        ("worker=w&worker=v&policy_version=1&tokens=5&steps=1", r"query\.worker: given 2 times"),
    ],
)
def test_malformed_candidate_queries_name_the_field(query: str, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        CandidateInfo.from_query(query)


@pytest.mark.parametrize(
    "command",
    [
        ranks.Train(4),
        ranks.Stream(),
        ranks.Gather(),
        ranks.Save("/ckpt", 4, ".tmp-1", None),
        ranks.Save("/ckpt", 5, ".tmp-2", "ab" * 32),
        ranks.Load("/ckpt/step-4"),
        ranks.Stop(),
        ranks.Abort(),
    ],
)
def test_rank_commands_round_trip(command: ranks.RankCommand) -> None:
    text = ranks.encode(command)
    assert json.loads(text)["op"] == command.op
    assert ranks.decode(text) == command


def test_malformed_rank_commands_name_the_field() -> None:
    with pytest.raises(ProtocolError, match=r"command\.op: must be one of .*got 'dance'"):
        ranks.decode('{"op": "dance"}')
    with pytest.raises(ProtocolError, match=r"command\.step: is required"):
        ranks.decode('{"op": "train"}')
    with pytest.raises(ProtocolError, match=r"command\.sha: must be a string"):
        ranks.decode('{"op": "save", "root": "/c", "step": 1, "tmp": "t", "sha": 5}')
