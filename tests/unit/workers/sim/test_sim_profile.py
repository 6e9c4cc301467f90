"""Interpolation of a profile's curves (clamped, piecewise linear) and the roofline profile."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from longtail_api.profile import EngineProfile, ProfileError, StepPoint
from longtail_workers.sim.latency import Curve, LatencyModel, interp1, interpolate
from longtail_workers.sim.roofline import QWEN2_SHAPES, roofline_profile

GRID = [
    StepPoint(1, 0, 1, 1.0),
    StepPoint(5, 0, 1, 2.0),
    StepPoint(1, 100, 1, 3.0),
    StepPoint(5, 100, 1, 4.0),
]


def test_interp1_is_linear_between_points_and_clamped_outside() -> None:
    assert interp1([1.0, 3.0], [10.0, 30.0], 2.0) == 20.0
    assert interp1([1.0, 3.0], [10.0, 30.0], 0.0) == 10.0
    assert interp1([1.0, 3.0], [10.0, 30.0], 9.0) == 30.0


def test_batch_and_context_are_linear() -> None:
    assert interpolate(GRID, 3, 0, 1) == pytest.approx(1.5)
    assert interpolate(GRID, 3, 100, 1) == pytest.approx(3.5)
    assert interpolate(GRID, 3, 50, 1) == pytest.approx(2.5)
    assert interpolate(GRID, 1, 25, 1) == pytest.approx(1.5)


def test_every_axis_is_clamped() -> None:
    assert interpolate(GRID, 0.5, -10, 1) == pytest.approx(1.0)
    assert interpolate(GRID, 500, 10_000, 1) == pytest.approx(4.0)
    assert interpolate(GRID, 3, 10_000, 7) == pytest.approx(3.5)  # one token count: clamped


def test_token_counts_interpolate_between_profiled_depths() -> None:
    verify = [StepPoint(1, 0, 2, 1.0), StepPoint(1, 0, 4, 2.0)]
    c = Curve(verify)
    assert c.seconds(1, 0, 3) == pytest.approx(1.5)  # depth 2: between k=1 and k=3
    assert c.seconds(1, 0, 9) == pytest.approx(2.0)


def test_duplicate_points_are_averaged() -> None:
    assert interpolate([StepPoint(1, 0, 1, 1.0), StepPoint(1, 0, 1, 3.0)], 1, 0, 1) == 2.0


def test_empty_curve_is_a_profile_error() -> None:
    with pytest.raises(ProfileError, match="no points"):
        Curve([], "verify")


def test_roofline_profile_round_trips_and_is_labelled() -> None:
    for name in QWEN2_SHAPES:
        p = roofline_profile(name)
        assert p.source == "roofline" and p.engine == "roofline"
        assert any("ROOFLINE PROJECTION" in n for n in p.notes)
        assert EngineProfile.from_dict(p.to_dict()) == p


def test_roofline_shapes_match_the_public_parameter_counts() -> None:
    counts = {k: round(m.params / 1e6) for k, m in QWEN2_SHAPES.items()}
    assert counts == {"Qwen2-0.5B": 494, "Qwen2-1.5B": 1544, "Qwen2-7B": 7616}


def test_roofline_latencies_behave_like_a_roofline() -> None:
    lat = LatencyModel(roofline_profile("Qwen2-1.5B"))
    # Small batches are memory-bound: batch 1 and 2 cost the same; big batches cost more.
    assert lat.decode_s(2, 1024) == pytest.approx(lat.decode_s(1, 1024), rel=0.02)
    assert lat.decode_s(256, 1024) > lat.decode_s(1, 1024)
    assert lat.decode_s(64, 16384) > lat.decode_s(64, 1024)  # KV reads grow with context
    assert lat.verify_s(256, 1024, 8) > lat.decode_s(256, 1024)
    assert lat.draft_s(1, 1024) < lat.decode_s(1, 1024)


def test_roofline_kv_capacity_follows_from_the_gpu_memory() -> None:
    # Qwen2-7B: 28 layers x 2 (K, V) x 4 KV heads x 128 x 2 bytes = 57,344 bytes a token; 90% of
    # 80 GB less 15.2 GB of weights leaves about 0.99M tokens.
    p = roofline_profile("Qwen2-7B")
    assert p.kv_cache_tokens == pytest.approx(990_000, rel=0.01)
    assert any("KV cache" in n for n in p.notes)


def test_unknown_roofline_model_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"Qwen2-1\.5B"):
        roofline_profile("Llama-70B")


PROFILES = sorted((Path(__file__).parents[4] / "bench" / "profiles").glob("*.json"))


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_committed_profiles_are_valid_and_measured(path: Path) -> None:
    profile = EngineProfile.read(path)
    assert profile.source == "measured"
    model = LatencyModel(profile)
    assert model.decode_s(1, 128) > 0


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_a_profile_written_before_the_history_drafter_loads_with_empty_history_fields(
    path: Path,
) -> None:
    raw = json.loads(path.read_text())
    assert "history_speculative" not in raw and "accepted_length" not in raw
    profile = EngineProfile.read(path)
    assert (profile.history_speculative, profile.history_propose) == ([], [])
    assert profile.accepted_length == {} and profile.hybrid_history_share is None
    assert profile.hybrid_history_accepted_length is None


def test_history_fields_round_trip_and_bad_ones_name_the_field() -> None:
    base = roofline_profile("Qwen2-0.5B")
    profile = dataclasses.replace(
        base,
        history_speculative=[StepPoint(1, 128, 3, 0.002)],
        history_propose=[StepPoint(1, 128, 2, 1e-5)],
        accepted_length={"learned": 3.0, "history": 1.6},
        hybrid_history_share=0.28,
        hybrid_history_accepted_length=2.5,
    )
    assert EngineProfile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile
    bad = {
        "accepted_length": ({"hybrid": 2.0}, "accepted_length"),
        "hybrid_history_share": (1.5, "hybrid_history_share"),
        "hybrid_history_accepted_length": (0.5, "hybrid_history_accepted_length"),
        "history_propose": ([StepPoint(1, 0, 2, 0.0)], "history_propose"),
    }
    for name, (value, message) in bad.items():
        with pytest.raises(ProfileError, match=message):
            dataclasses.replace(base, **{name: value})
