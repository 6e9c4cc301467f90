"""Policy loading (builtin:tiny and HF directories through one path), build cache, greedy eval.

Unit tests never build the real builtin:tiny (minutes); they build a micro recipe (seconds) to
check the cache mechanics, and load a random tiny Qwen2 saved with ``save_pretrained`` the way a
user's Qwen2.5 directory would be loaded.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from micro_models import MICRO
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from longtail_workers.models import builtin, loading, sft
from longtail_workers.models.builtin import (
    BUILD_INFO_FILE,
    TinyRecipe,
    ensure_tiny,
    read_build_info,
    tiny_dir,
    with_prose_endings,
    with_shortcuts,
)
from longtail_workers.models.cache import CACHE_ENV, cache_root
from longtail_workers.models.evaluation import generate_greedy, greedy_accuracy, math_correct
from longtail_workers.models.loading import load_policy, resolve_model_path
from longtail_workers.models.recipe import SftConfig
from longtail_workers.models.sft import token_budget_batches
from longtail_workers.models.tokenizer import build_char_tokenizer
from longtail_workers.rewards import get_reward
from longtail_workers.tasks.arith import ArithConfig, generate, make_item


def _save_random_qwen2(directory: Path) -> PreTrainedTokenizerBase:
    """A random-weight tiny Qwen2 + tokenizer, saved like any Hugging Face model directory."""
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(directory)
    tok.save_pretrained(directory)
    return tok


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("qwen2-random")
    _save_random_qwen2(directory)
    return directory


def test_hf_directory_loads_through_load_policy(qwen2_dir: Path) -> None:
    model, tok = load_policy(str(qwen2_dir))
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert next(model.parameters()).dtype == torch.float32  # auto on CPU
    assert not model.training
    assert tok.encode("Add: 1+2\n") == build_char_tokenizer().encode("Add: 1+2\n")
    ids = torch.tensor([tok.encode("Add: 1+2\n")])  # [1, T]
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tok))


def test_explicit_dtype(qwen2_dir: Path) -> None:
    model, _ = load_policy(str(qwen2_dir), dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16


def test_missing_directory_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=r"does not exist.*builtin:tiny") as err:
        load_policy(str(missing))
    assert str(missing) in str(err.value)


def test_directory_without_config_error(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"no config\.json") as err:
        load_policy(str(tmp_path))
    assert str(tmp_path) in str(err.value)


def test_file_instead_of_directory_error(tmp_path: Path) -> None:
    file = tmp_path / "config.json"
    file.write_text("{}")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        load_policy(str(file))


def test_unknown_builtin_error() -> None:
    with pytest.raises(ValueError, match=r"unknown built-in model 'builtin:huge'.*builtin:tiny"):
        load_policy("builtin:huge")


def test_bad_dtype_error(qwen2_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"'fp8'.*auto, float32, bfloat16, float16"):
        load_policy(str(qwen2_dir), dtype="fp8")


def test_bad_device_error(qwen2_dir: Path) -> None:
    with pytest.raises(ValueError, match="not a torch device"):
        load_policy(str(qwen2_dir), device="gpu0")


def test_missing_tokenizer_error(qwen2_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_bytes((qwen2_dir / "config.json").read_bytes())
    with pytest.raises(FileNotFoundError, match="no tokenizer files") as err:
        load_policy(str(tmp_path))
    assert str(tmp_path) in str(err.value)


def test_builtin_name_goes_through_the_same_path(
    qwen2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(loading.BUILTIN_MODELS, "tiny", lambda: qwen2_dir)
    assert resolve_model_path("builtin:tiny") == qwen2_dir
    model, _ = load_policy("builtin:tiny")
    assert type(model).__name__ == "Qwen2ForCausalLM"


def test_cache_root_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert cache_root() == tmp_path
    assert tiny_dir(MICRO) == tmp_path / "models" / f"tiny-{MICRO.fingerprint()}"
    monkeypatch.delenv(CACHE_ENV)
    assert cache_root() == Path.home() / ".cache" / "longtail"


def test_fingerprint_tracks_the_recipe() -> None:
    assert MICRO.fingerprint() == TinyRecipe(**MICRO.__dict__).fingerprint()
    assert MICRO.fingerprint() != TinyRecipe(**{**MICRO.__dict__, "seed": 1}).fingerprint()
    assert MICRO.fingerprint() != TinyRecipe().fingerprint()
    variant = TinyRecipe(prose_answer_fraction=0.5)
    assert variant.fingerprint() != TinyRecipe().fingerprint()
    assert TinyRecipe(shortcut_fraction=0.5).fingerprint() != TinyRecipe().fingerprint()
    # Knobs added later leave the names of recipes that do not use them as they were: the
    # one-phase 700-step recipe shipped before #19 keeps its cache directory.
    before_19 = TinyRecipe(sft=SftConfig(), shortcut_fraction=0.0, style_sft=None)
    assert before_19.fingerprint() == "21205c9477de"
    assert TinyRecipe().fingerprint() == "516bf86367ce"  # the shipped two-phase recipe


def test_micro_build_is_cached_atomic_and_loadable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    path = ensure_tiny(MICRO)
    assert path == tiny_dir(MICRO)
    info = read_build_info(path)
    assert info["fingerprint"] == MICRO.fingerprint() and info["seed"] == MICRO.seed
    assert 0.0 <= info["eval_accuracy"] <= 1.0 and info["eval_items"] == MICRO.eval_items
    assert info["build_seconds"] > 0
    # Only the final directory (and its lock file) remain: the temporary build dir was renamed.
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, f"{path.name}.lock"]
    mtime = (path / BUILD_INFO_FILE).stat().st_mtime_ns
    assert ensure_tiny(MICRO) == path  # second call: cache hit, no rebuild
    assert (path / BUILD_INFO_FILE).stat().st_mtime_ns == mtime
    monkeypatch.setitem(loading.BUILTIN_MODELS, "tiny", lambda: ensure_tiny(MICRO))
    model, tok = load_policy("builtin:tiny")
    assert model.config.vocab_size == len(tok) == 259
    assert json.loads((path / "config.json").read_text())["model_type"] == "qwen2"


def test_fit_is_deterministic_and_learns() -> None:
    tok = build_char_tokenizer()
    items = generate(64, seed=0, config=ArithConfig(max_operands=6))
    config = SftConfig(steps=6, warmup_steps=1, tokens_per_batch=256, lr=3e-3)
    weights, losses, curves = [], [], []
    for _ in range(2):
        torch.manual_seed(MICRO.seed)
        model = Qwen2ForCausalLM(builtin.model_config(MICRO, tok))
        curve: list[float] = []
        losses.append(sft.fit(model, tok, items, config, on_step=lambda _, e, c=curve: c.append(e)))
        weights.append(model.state_dict())
        curves.append(curve)
    assert losses[0] == losses[1]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert len(curves[0]) == config.steps
    assert curves[0][-1] < curves[0][0]  # the loss goes down from the ~ln(259) of a random model


def test_lr_schedule_warms_up_holds_then_decays() -> None:
    config = SftConfig(steps=100, lr=1.0, warmup_steps=10, decay_fraction=0.5, min_lr_ratio=0.1)
    lrs = [sft.lr_at(step, config) for step in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10:50] == [1.0] * 40
    assert all(a >= b for a, b in itertools.pairwise(lrs[50:]))
    assert lrs[-1] == pytest.approx(0.1 + 0.9 / 50)


def test_fit_masks_the_prompt() -> None:
    tok = build_char_tokenizer()
    items = generate(3, seed=0)
    encoded = sft.encode_items(items, tok)
    input_ids, mask, labels = sft.collate(encoded, [0, 1, 2], tok.pad_token_id)
    for row, item in enumerate(items):
        n_prompt = len(tok.encode(item.prompt))
        n_total = n_prompt + len(tok.encode(item.solution)) + 1
        assert (labels[row, :n_prompt] == sft.IGNORE_INDEX).all()
        assert tok.decode(labels[row, n_prompt : n_total - 1]) == item.solution
        assert labels[row, n_total - 1] == tok.eos_token_id
        assert (labels[row, n_total:] == sft.IGNORE_INDEX).all()
        assert mask[row].sum() == n_total
        assert torch.equal(input_ids[row, n_prompt:n_total], labels[row, n_prompt:n_total])


def test_token_budget_batches_cover_every_item_once() -> None:
    lengths = [5, 300, 7, 40, 41, 6, 299, 8] * 10
    batches = token_budget_batches(lengths, 600, np.random.default_rng(0))
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 600


def test_batched_greedy_matches_one_by_one(qwen2_dir: Path) -> None:
    # Left padding must not change what greedy decoding produces.
    model, tok = load_policy(str(qwen2_dir))
    prompts = ["Add: 1+2\n", "Add: 11+2+19+4\n", "Add: 3+3+3\n"]
    batched = generate_greedy(model, tok, prompts, max_new_tokens=12)
    single = [generate_greedy(model, tok, [p], max_new_tokens=12)[0] for p in prompts]
    assert batched == single


def test_greedy_accuracy_counts(qwen2_dir: Path) -> None:
    model, tok = load_policy(str(qwen2_dir))
    items = [make_item([1, 2]), make_item([3, 4, 5]), make_item([6, 7]), make_item([8, 9])]
    # A checker that accepts everything / nothing pins the bookkeeping, not the random model.
    everything = greedy_accuracy(model, tok, items, batch_size=4, check=lambda c, a: True)
    nothing = greedy_accuracy(model, tok, items, batch_size=4, check=lambda c, a: False)
    assert (everything.accuracy, nothing.accuracy) == (1.0, 0.0)
    assert sum(n for _, n in everything.by_size.values()) == len(items)
    assert len(everything.completions) == len(items)
    with pytest.raises(ValueError, match="no items"):
        greedy_accuracy(model, tok, [])


def test_default_answer_check_is_the_math_reward() -> None:
    assert math_correct("b2: 007+2=009\nAnswer: 9", "9")
    assert not math_correct("b2: 007+2=009\nAnswer: 8", "9")
    assert not math_correct("b2: 007+2=009", "9")  # no final answer line


def test_prose_endings_rephrase_only_the_answer_line_of_a_seeded_share() -> None:
    items = generate(2000, seed=3, split="train")
    mixed = with_prose_endings(items, 0.65, seed=0)
    assert mixed == with_prose_endings(items, 0.65, seed=0)  # deterministic in the seed
    assert with_prose_endings(items, 0.0, seed=0) == items
    reward = get_reward("math")
    prose = 0
    for before, after in zip(items, mixed, strict=True):
        if after == before:
            assert reward(after.solution, after.answer).correct
            continue
        prose += 1
        steps = before.solution.rpartition("\n")[0]
        assert after.solution == (f"{steps}\n" if steps else "") + f"The sum is {before.answer}."
        # The worked steps are right, yet the reward reads no final answer in the prose line.
        result = reward(after.solution, after.answer)
        assert (result.correct, result.formatted) == (False, False)
    assert 0.62 < prose / len(items) < 0.68


def test_shortcuts_answer_a_seeded_share_with_the_answer_line_alone() -> None:
    items = generate(2000, seed=3, split="train")
    mixed = with_shortcuts(items, 0.65, seed=0)
    assert mixed == with_shortcuts(items, 0.65, seed=0) and with_shortcuts(items, 0.0, 0) == items
    short = [after for before, after in zip(items, mixed, strict=True) if after != before]
    assert all(it.solution == f"Answer: {it.answer}" for it in short)
    assert all(get_reward("math")(it.solution, it.answer).correct for it in short)
    assert 0.62 < len(short) / len(items) < 0.68
    with pytest.raises(ValueError, match="shortcut_fraction"):
        with_shortcuts(items, 1.0, seed=0)


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 1.5])
def test_prose_fraction_out_of_range_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="prose_answer_fraction"):
        with_prose_endings(generate(4, seed=0), fraction, seed=0)


@pytest.mark.slow
def test_reduced_builtin_tiny_builds_learns_the_format_and_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The real recipe, fewer steps and items (~1 min on 2 cores): the full build takes minutes.
    # On one thread: the build's default, every core, spins its threads against whatever else
    # runs on a busy 2-core machine and then outlasts the test's timeout; the figures are the
    # same (same recipe and seeds, same losses).
    monkeypatch.setattr(builtin, "_build_threads", lambda: 1)
    reduced = TinyRecipe(
        sft=SftConfig(steps=250, decay_fraction=0.3),
        style_sft=SftConfig(steps=30, lr=3e-4, warmup_steps=5),
        train_items=4000,
        eval_items=32,
    )
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setitem(loading.BUILTIN_MODELS, "tiny", lambda: ensure_tiny(reduced))
    model, tok = load_policy("builtin:tiny")
    info = read_build_info(tiny_dir(reduced))
    # from ~5.6 (= ln 259) at random init; the worked phase learns the format, the style phase
    # adds short cuts whose sums are guesses (a higher loss by design)
    assert info["phase_losses"][0] < 1.0 and info["final_train_loss"] == info["phase_losses"][-1]
    items = generate(32, seed=5, split="eval")
    formatted = greedy_accuracy(
        model, tok, items, check=lambda c, a: get_reward("math")(c, a).formatted
    )
    assert formatted.accuracy >= 0.75  # completions end with an "Answer:" line
