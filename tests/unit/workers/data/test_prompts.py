"""format_prompt with real transformers tokenizers built locally (no downloads)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from longtail_workers.data import Example, format_example, format_prompt, has_chat_template

# Role-tagged template in the style of ChatML; renders system turns when given.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# Gemma-style template that refuses a system role.
NO_SYSTEM_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}" + CHAT_TEMPLATE
)


def make_tokenizer(chat_template: str | None) -> PreTrainedTokenizerFast:
    chars = "abcdefghijklmnopqrstuvwxyz0123456789 +=?.\n"
    vocab = {token: i for i, token in enumerate(["[UNK]", "<s>", "</s>", *chars])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def test_chat_template_wraps_single_user_message_and_opens_assistant_turn() -> None:
    tokenizer = make_tokenizer(CHAT_TEMPLATE)
    assert has_chat_template(tokenizer)
    text = format_prompt(tokenizer, "what is 2+2?", apply_chat_template=True)
    assert text == "<|user|>what is 2+2?<|end|>\n<|assistant|>"


def test_disabled_or_missing_template_returns_prompt_unchanged() -> None:
    with_template = make_tokenizer(CHAT_TEMPLATE)
    base_model = make_tokenizer(None)
    assert not has_chat_template(base_model)
    assert format_prompt(with_template, "Add: 7+12\n", apply_chat_template=False) == "Add: 7+12\n"
    assert format_prompt(base_model, "Add: 7+12\n", apply_chat_template=True) == "Add: 7+12\n"


def test_system_message_goes_into_its_own_turn() -> None:
    tokenizer = make_tokenizer(CHAT_TEMPLATE)
    example = Example(prompt="what is 3*3?", answer="9", index=0, system="be brief.")
    assert format_example(tokenizer, example, apply_chat_template=True) == (
        "<|system|>be brief.<|end|>\n<|user|>what is 3*3?<|end|>\n<|assistant|>"
    )
    # Without a template the system text still reaches the model, above the prompt.
    assert format_example(tokenizer, example, apply_chat_template=False) == (
        "be brief.\n\nwhat is 3*3?"
    )


def test_template_without_system_role_gets_system_text_in_user_turn() -> None:
    tokenizer = make_tokenizer(NO_SYSTEM_TEMPLATE)
    text = format_prompt(tokenizer, "what is 3*3?", apply_chat_template=True, system="be brief.")
    assert text == "<|user|>be brief.\n\nwhat is 3*3?<|end|>\n<|assistant|>"


def test_non_string_render_is_an_error() -> None:
    class IdsTokenizer:
        chat_template = "x"

        def apply_chat_template(self, *args: object, **kwargs: object) -> list[int]:
            return [1, 2, 3]

    with pytest.raises(TypeError, match="returned list, expected str"):
        format_prompt(IdsTokenizer(), "q", apply_chat_template=True)
