"""Turning a dataset prompt into the exact text the policy sees (chat template or not).

The trainer and the rollout workers call :func:`format_prompt` (or :func:`format_example`) on
every prompt before tokenizing it, with ``spec.dataset.applyChatTemplate``. Both sides must
produce the same text, or the log-probabilities the trainer computes belong to a different
prompt than the one the answer was sampled for; hence one function, used everywhere.

The formatted text may already contain the model's special tokens (a chat template usually
writes its own BOS, e.g. ``<|begin_of_text|>``): tokenize it with ``add_special_tokens=False``
when a template was applied, or the BOS appears twice.
"""

from __future__ import annotations

from typing import Any

from longtail_workers.data.records import Example

__all__ = ["format_example", "format_prompt", "has_chat_template"]


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer defines a chat template (base models usually do not)."""
    return bool(getattr(tokenizer, "chat_template", None))


def format_prompt(tokenizer: Any, prompt: str, apply_chat_template: bool, system: str = "") -> str:
    """The prompt as the model should see it, ending where the answer starts.

    With ``apply_chat_template`` and a tokenizer that has a chat template: the template applied
    to one user message (after the optional ``system`` message) with the assistant turn opened
    (``add_generation_prompt=True``). Otherwise plain text: the prompt unchanged, preceded by
    the system message and a blank line when there is one, so that base models (no template)
    and ``applyChatTemplate: false`` still see the instructions a dataset put there.
    """
    if not (apply_chat_template and has_chat_template(tokenizer)):
        return f"{system}\n\n{prompt}" if system else prompt
    messages = [{"role": "user", "content": prompt}]
    if not system:
        return _render(tokenizer, messages)
    # Imported here: only needed on this path, and jinja2 comes with transformers.
    from jinja2.exceptions import TemplateError

    try:
        return _render(tokenizer, [{"role": "system", "content": system}, *messages])
    except TemplateError:
        # Some templates (Gemma, Mistral v0.1) raise on a system role by design; the
        # usual workaround, done here, is the system text at the top of the user turn.
        return _render(tokenizer, [{"role": "user", "content": f"{system}\n\n{prompt}"}])


def format_example(tokenizer: Any, example: Example, apply_chat_template: bool) -> str:
    """:func:`format_prompt` for a dataset :class:`Example`, system message included."""
    return format_prompt(tokenizer, example.prompt, apply_chat_template, system=example.system)


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if not isinstance(text, str):
        # A tokenizer wrapper that ignores tokenize=False would hand back token ids; using
        # them as text would train on garbage, so stop here.
        raise TypeError(
            f"{type(tokenizer).__name__}.apply_chat_template(tokenize=False) returned "
            f"{type(text).__name__}, expected str"
        )
    return text
