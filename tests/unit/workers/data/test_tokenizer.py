"""The builtin:tiny tokenizer: char-level round trip, special tokens, Hugging Face save/load."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2Config

from longtail_workers.models.tokenizer import BOS, EOS, PAD, build_char_tokenizer
from longtail_workers.tasks.arith import generate

TEXTS = [
    "Add: 7+12+5\n",
    "7+12=19\n19+5=24\nAnswer: 24",
    "  two  spaces, tabs\tand\nnewlines\n\n",
    "non-ASCII: é ü 数 → still round-trips",
]


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerBase:
    return build_char_tokenizer()


def test_special_tokens(tok: PreTrainedTokenizerBase) -> None:
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == (PAD, BOS, EOS)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert len(tok) == 3 + 256
    assert tok.padding_side == "left"
    assert tok.chat_template is None


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok: PreTrainedTokenizerBase, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode([*ids, tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == text


def test_one_token_per_ascii_character_and_no_bos(tok: PreTrainedTokenizerBase) -> None:
    text = "Add: 7+12+5\n"
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert ids == tok.encode(text, add_special_tokens=False)  # nothing is added around prompts
    assert tok.bos_token_id not in ids


def test_prompt_plus_solution_is_concatenation(tok: PreTrainedTokenizerBase) -> None:
    # SFT tokenizes prompt+solution, rollout tokenizes the prompt then samples: they must agree.
    for item in generate(50, seed=0):
        joint = tok.encode(item.prompt + item.solution)
        assert joint == tok.encode(item.prompt) + tok.encode(item.solution)


def test_special_token_text_maps_to_its_id(tok: PreTrainedTokenizerBase) -> None:
    assert tok.encode("x<eos>") == [*tok.encode("x"), tok.eos_token_id]


def test_left_padding(tok: PreTrainedTokenizerBase) -> None:
    batch = tok(["ab", "abcd"], padding=True)
    assert batch["input_ids"][0][:2] == [tok.pad_token_id] * 2
    assert batch["attention_mask"] == [[0, 0, 1, 1], [1, 1, 1, 1]]


def test_save_and_reload_next_to_a_qwen2_config(
    tok: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    # AutoTokenizer picks the tokenizer class from config.json's model_type when there is one
    # (qwen2 -> Qwen2Tokenizer, which rebuilds pre-tokenizer and decoder): the reload must still
    # be the very same tokenizer, spaces and newlines included.
    Qwen2Config(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    ).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert reloaded.encode(text) == tok.encode(text)
        assert reloaded.decode(reloaded.encode(text)) == text
    assert reloaded.eos_token_id == tok.eos_token_id
    assert reloaded.pad_token_id == tok.pad_token_id
    assert reloaded.padding_side == "left"
    assert len(reloaded) == len(tok)


def test_reload_without_model_config(tok: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    tok.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.encode(TEXTS[2]) == tok.encode(TEXTS[2])
