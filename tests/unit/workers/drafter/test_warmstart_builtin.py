"""``initialDrafter: builtin:tiny`` (warmstart/builtin.py): fitted for real on a micro built-in
model, cached once per model recipe and layout, loaded by the same path rollout workers use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from micro_models import MICRO

from longtail_api.manifest import validate_manifest
from longtail_api.rules import BUILTIN_DRAFTERS
from longtail_workers.drafter.checkpoint import read_drafter_config
from longtail_workers.models import loading
from longtail_workers.models.builtin import ensure_tiny
from longtail_workers.models.cache import CACHE_ENV
from longtail_workers.runtime import initial_drafter
from longtail_workers.warmstart import builtin
from longtail_workers.warmstart.builtin import (
    BUILD_INFO_FILE,
    BuiltinTarget,
    DrafterRecipe,
    builtin_drafter_dir,
    ensure_builtin_drafter,
)
from longtail_workers.warmstart.offline import OfflineFit

# Seconds: 20 answers of at most 12 tokens, 4 fit steps.
QUICK = DrafterRecipe(prompts=20, max_new_tokens=12, fit=OfflineFit(steps=4, batch_size=4))


@pytest.fixture
def micro_tiny(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """``builtin:tiny`` is the micro recipe, built in a fresh cache under ``tmp_path``."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setitem(loading.BUILTIN_MODELS, "tiny", lambda: ensure_tiny(MICRO))
    monkeypatch.setitem(builtin.BUILTIN_TARGETS, "tiny", BuiltinTarget(MICRO, QUICK))
    return tmp_path


def test_the_api_and_the_workers_know_the_same_builtin_drafters() -> None:
    assert sorted(BUILTIN_DRAFTERS) == sorted(f"builtin:{n}" for n in builtin.BUILTIN_TARGETS)


def test_fitted_once_per_layout_and_recorded(micro_tiny: Path) -> None:
    path = ensure_builtin_drafter("builtin:tiny", "longtail", QUICK)
    assert path == builtin_drafter_dir("builtin:tiny", "longtail", QUICK)
    assert path.parent == micro_tiny / "drafters" and MICRO.fingerprint() in path.name
    info = json.loads((path / BUILD_INFO_FILE).read_text())
    assert info["drafter_of"] == "builtin:tiny" and info["layout"] == "longtail"
    assert info["sampled_tokens"] > 0 and 0.0 <= info["heldout_top1"] <= 1.0
    assert read_drafter_config(path)["target"]["identifier"] == "builtin:tiny"  # type: ignore[index]
    mtime = (path / BUILD_INFO_FILE).stat().st_mtime_ns
    assert ensure_builtin_drafter("builtin:tiny", "longtail", QUICK) == path  # cached
    assert (path / BUILD_INFO_FILE).stat().st_mtime_ns == mtime
    other = ensure_builtin_drafter("builtin:tiny", "eagle1", QUICK)
    layout = read_drafter_config(other)["drafter"]
    assert other != path and layout["input_norm"] is False and layout["fc_bias"] is False  # type: ignore[index]
    # Only the two drafters and their lock files: the temporary build directories are gone.
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(
        [path.name, f"{path.name}.lock", other.name, f"{other.name}.lock"]
    )


def test_a_job_with_the_builtin_drafter_starts_from_it(micro_tiny: Path) -> None:
    doc = {
        "apiVersion": "longtail.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "t"},
        "spec": {
            "model": {"path": "builtin:tiny"},
            "dataset": {"path": "builtin:arith"},
            "drafterTraining": {"initialDrafter": "builtin:tiny"},
        },
    }
    result = validate_manifest(doc)
    assert result.errors == [] and result.spec is not None
    model, _ = loading.load_policy("builtin:tiny")
    drafter = initial_drafter(result.spec, model, "builtin:tiny")
    fitted = builtin_drafter_dir("builtin:tiny", "longtail", QUICK)
    assert (fitted / BUILD_INFO_FILE).is_file()  # fitted on first use
    from safetensors.torch import load_file

    saved = load_file(str(fitted / "model.safetensors"))
    state = drafter.trainable_state_dict()
    assert saved.keys() == state.keys()
    assert all((saved[k] == state[k]).all() for k in saved)


def test_unknown_builtin_drafter_names_the_known_ones(micro_tiny: Path) -> None:
    with pytest.raises(ValueError, match=r"'builtin:huge' is not a built-in drafter.*builtin:tiny"):
        ensure_builtin_drafter("builtin:huge", "longtail")
