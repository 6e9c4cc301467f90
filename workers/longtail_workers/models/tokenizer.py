"""The byte-level (character-level for ASCII) tokenizer of ``builtin:tiny``, in Hugging Face format.

One token per byte, no merges, plus three special tokens (pad, bos, eos): 259 tokens. For the
task's ASCII text that is one token per character, and tokenizing ``prompt + solution`` gives
exactly the concatenation of the two tokenizations, so SFT and RL rollout see identical token
sequences whichever way a caller splits the text. Any UTF-8 text still round-trips.

Why a ``Qwen2Tokenizer`` with a custom vocabulary instead of a bare ``PreTrainedTokenizerFast``:
``AutoTokenizer.from_pretrained`` on a directory whose ``config.json`` says ``model_type: qwen2``
always instantiates ``Qwen2Tokenizer`` (transformers 5 overrides the saved ``tokenizer_class``
for qwen2), and that class rebuilds the Qwen byte-level pre-tokenizer and decoder from vocab and
merges only. A bare character tokenizer would be silently replaced on reload (spaces and
newlines dropped). Building the tokenizer as a byte-level BPE with an empty merge list makes the
in-memory tokenizer and every reload identical by construction; it also means rollout code sees
the same tokenizer class as for a real Qwen2.5 directory.

Called by :mod:`longtail_workers.models.builtin` when it builds ``builtin:tiny``; everything else
loads it from the model directory with ``AutoTokenizer.from_pretrained``.

Prompt format: no BOS is added and there is no chat template — the model sees the task's
``prompt`` tokens as they are (``tok(prompt)`` gives the same ids with or without
``add_special_tokens``) and must generate ``solution`` then EOS. Padding is on the left, as
batched generation with a decoder-only model needs.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0..2, in this order
MODEL_MAX_LENGTH = 2048


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins byte-level BPE uses for bytes 0..255, in byte order.

    This is GPT-2's ``bytes_to_unicode`` table (the one the ``tokenizers`` ByteLevel
    pre-tokenizer applies): printable Latin-1 bytes map to themselves, the others (space,
    newline, control bytes...) to code points from 256 up.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    symbols: dict[int, str] = {b: chr(b) for b in keep}
    shift = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + shift)
            shift += 1
    return [symbols[b] for b in range(256)]


def byte_vocab() -> dict[str, int]:
    """Token -> id: the special tokens first, then one id per byte (byte b has id 3 + b)."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for symbol in byte_symbols():
        vocab[symbol] = len(vocab)
    return vocab


def build_char_tokenizer() -> PreTrainedTokenizerBase:
    """A fresh byte-level tokenizer without merges (deterministic: the same ids every time)."""
    return Qwen2Tokenizer(
        vocab=byte_vocab(),
        merges=[],  # no merges: every byte stays its own token
        # Every byte is in the vocabulary, nothing is unknown; the stub says str, None works.
        unk_token=None,  # type: ignore[arg-type]
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        padding_side="left",
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )
