"""KV caches and attention below both the engine and the drafter (neither imports the other for it).

``slots`` (the native engine's static slot cache and ``SlotAttention``), ``slot_attention`` (the
attention implementation registered with transformers that reads it), ``triton_attention`` (its
CUDA kernel) and ``masks`` (explicit 4D masks for the drafter's own forwards and its training).
Submodules are imported directly.
"""
