"""The batched KV cache and its attention mask, below both the engine and the drafter.

``cache`` (``PaddedKVCache``, ``attention_mask``, the attention-implementation check) and
``layer`` (one layer that appends in place). The torch engine keeps the target's cache here and
speculative decoding the drafter's; the drafter model builds its mask with it. It sits below
``engine`` and ``drafter`` so that neither has to import the other for it. Submodules are
imported directly.
"""
