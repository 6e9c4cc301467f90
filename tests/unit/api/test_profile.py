"""Engine profile files: a round trip, and errors that name the bad field."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from longtail_api.profile import (
    PROFILE_FORMAT,
    EngineProfile,
    ModelShape,
    Overheads,
    ProfileError,
    StepPoint,
)


def _profile() -> EngineProfile:
    point = StepPoint(batch=1, context=16, tokens=1, seconds=0.01)
    return EngineProfile(
        source="measured",
        device="cpu (2 threads)",
        engine="torch",
        model=ModelShape(64, 2, 4, 2, 128, 64, 1000, "float32"),
        decode=[point],
        verify=[StepPoint(batch=1, context=16, tokens=5, seconds=0.02)],
        draft=[point],
        prefill_tokens_per_s=1000.0,
        drafter_train_tokens_per_s=500.0,
        trainer_seconds_per_token=0.001,
    )


def _data() -> dict[str, Any]:
    return _profile().to_dict()


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    _profile().write(path)
    assert EngineProfile.read(path) == _profile()
    assert json.loads(path.read_text())["format"] == PROFILE_FORMAT


def test_overheads_round_trip_and_a_negative_one_is_named(tmp_path: Path) -> None:
    extra = Overheads(0.01, 0.0001, 0.3, 0.02, 0.5, 0.1)
    profile = dataclasses.replace(_profile(), overheads=extra)
    path = tmp_path / "p.json"
    profile.write(path)
    assert EngineProfile.read(path).overheads == extra
    data = profile.to_dict()
    data["overheads"]["merge_s"] = -1.0
    with pytest.raises(ProfileError, match=r"overheads\.merge_s=-1\.0: must be >= 0"):
        EngineProfile.from_dict(data)
    del data["overheads"]  # a profile written before they were measured still reads
    assert EngineProfile.from_dict(data).overheads is None


def test_wrong_format_tag_names_the_field() -> None:
    data = _data() | {"format": "longtail-profile/0"}
    with pytest.raises(ProfileError, match=r"p\.format='longtail-profile/0'.*longtail profile"):
        EngineProfile.from_dict(data, "p")


def test_missing_field_is_named() -> None:
    data = _data()
    del data["trainer_seconds_per_token"]
    with pytest.raises(ProfileError, match="trainer_seconds_per_token"):
        EngineProfile.from_dict(data)


@pytest.mark.parametrize(
    "name",
    [
        "prefill_tokens_per_s",
        "drafter_train_tokens_per_s",
        "trainer_seconds_per_token",
        "drafter_catch_up_tokens_per_s",
    ],
)
@pytest.mark.parametrize("value", [0.0, -1.0])
def test_non_positive_rate_is_named(name: str, value: float) -> None:
    with pytest.raises(ProfileError, match=rf"{name}={value}: must be > 0"):
        EngineProfile.from_dict(_data() | {name: value})


@pytest.mark.parametrize("curve", ["decode", "verify", "draft"])
def test_empty_curve_is_named(curve: str) -> None:
    with pytest.raises(ProfileError, match=rf"{curve}: no points"):
        EngineProfile.from_dict(_data() | {curve: []})


def test_non_positive_seconds_names_the_point() -> None:
    data = _data()
    data["verify"][0]["seconds"] = 0.0
    with pytest.raises(ProfileError, match=r"verify\[0\]"):
        EngineProfile.from_dict(data)


def test_unreadable_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text("{not json")
    with pytest.raises(ProfileError, match="cannot read a profile"):
        EngineProfile.read(path)


def test_engine_steps_and_kv_capacity_round_trip_and_are_checked(tmp_path: Path) -> None:
    full = dataclasses.replace(
        _profile(),
        speculative=[StepPoint(batch=1, context=16, tokens=5, seconds=0.03)],
        kv_cache_tokens=4096,
    )
    path = tmp_path / "p.json"
    full.write(path)
    assert EngineProfile.read(path) == full
    with pytest.raises(ProfileError, match="kv_cache_tokens=0: must be >= 1"):
        EngineProfile.from_dict(_data() | {"kv_cache_tokens": 0})
    bad = _data() | {"speculative": [{"batch": 0, "context": 1, "tokens": 5, "seconds": 1.0}]}
    with pytest.raises(ProfileError, match=r"speculative\[0\]"):
        EngineProfile.from_dict(bad)
