"""A first-principles (roofline) engine profile for an H100-class GPU, where none was measured.

Called by ``longtail simulate`` (and the projections in docs/performance.md) when no measured
profile (``longtail profile``) exists for the hardware. It is a projection, not a measurement:
the returned profile has ``source="roofline"`` and its ``notes`` list every assumption below, so
every output that uses it says so.

Model of one forward of ``B`` sequences at context ``C`` with ``T`` new positions each, on one
GPU holding the whole model (one rollout worker, tensor parallelism not modelled)::

    bytes   = weight bytes + B x C x (KV bytes per token)           # every weight and every
                                                                     # cached key/value read once
    flops   = 2 x (matmul params) x B x T + 4 x layers x hidden x B x T x C   # matmuls + attention
    seconds = FORWARD_OVERHEAD_S + max(bytes / (HBM_BYTES_PER_S x BANDWIDTH_FRACTION),
                                       flops / (PEAK_FLOPS x FLOPS_FRACTION))

The drafter (``drafter/model.py``, EAGLE-1 style) is one decoder layer of the target's shape, an
``fc`` of 2H -> H and the target's LM head. Prefill is compute-bound at ``PREFILL_FLOPS_FRACTION``;
the trainer and the drafter trainer at ``TRAIN_FLOPS_FRACTION``, with 6 FLOPs per parameter per
token (forward + backward) plus ``TRAINER_EXTRA_FORWARDS`` forwards (recompute, old log-probs).
Shapes are the public Hugging Face configs of Qwen2-0.5B/1.5B/7B (Qwen2.5 shares them).
"""

from __future__ import annotations

from longtail_api.profile import EngineProfile, ModelShape, StepPoint, SyncCosts

HBM_BYTES_PER_S = 3.35e12
"""H100 SXM HBM3 bandwidth, bytes/s (datasheet)."""
PEAK_FLOPS = 989e12
"""H100 SXM dense bf16 tensor-core peak, FLOP/s (datasheet, no sparsity)."""
BANDWIDTH_FRACTION = 0.8
"""Assumed share of the HBM bandwidth a decode step achieves (weights and KV streamed once)."""
FLOPS_FRACTION = 0.6
"""Assumed share of peak FLOP/s a decode/verify/draft forward achieves once compute-bound."""
PREFILL_FLOPS_FRACTION = 0.6
"""Assumed share of peak FLOP/s of prefill."""
TRAIN_FLOPS_FRACTION = 0.4
"""Assumed model-FLOPs utilisation of the GRPO update and of drafter training."""
FORWARD_OVERHEAD_S = 1e-3
"""Assumed fixed cost of every forward (scheduling, sampling, kernel launches with CUDA graphs)."""
TRAINER_EXTRA_FORWARDS = 2
"""Forwards the update adds to forward + backward: activation recompute and old log-probs."""
BYTES_PER_PARAM = 2
"""bf16 weights and KV cache."""
WEIGHT_SYNC_BYTES_PER_S = 25e9
"""Assumed rate of a policy broadcast to the rollout GPUs (NCCL over NVLink/InfiniBand)."""
HTTP_PACK_BYTES_PER_S = 1.0e9
"""Assumed rate of packing a version into checksummed HTTP pieces: the trainer's publish as
measured on the CPU machine (1.26 GB in 1.27 s, 3.55 GB in 3.27 s; docs/performance.md, #33),
host-side copy and sha256 either way."""
HTTP_PULL_BYTES_PER_S = 0.47e9
"""Assumed rate of a worker's HTTP pull: the rollout pause measured on the CPU machine's
loopback (1.26 GB in 2.7 s, 3.55 GB in 7.5 s, verify and copy included; docs/performance.md)."""
LOAD_BYTES_PER_S = 25e9
"""Assumed rate of loading a received version into the engine: a host-to-GPU copy at about
half of PCIe 5.0 x16 (an upper bound on the time for broadcast buckets, already on the GPU)."""
HBM_BYTES = 80e9
"""H100 SXM memory, bytes."""
KV_MEMORY_FRACTION = 0.9
"""Share of the memory the engine may use (vLLM's default ``gpu_memory_utilization``); the KV
cache gets what the weights leave of it (activations not subtracted)."""
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Profiled running batch sizes."""
CONTEXTS = (0, 1024, 4096, 8192, 16384, 32768)
"""Profiled contexts, tokens."""
DEPTHS = (1, 2, 3, 4, 6, 8, 12, 16)
"""Profiled draft depths k (verify passes of k+1 positions)."""


def qwen2_shape(hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int,
                tied: bool) -> ModelShape:  # fmt: skip
    """A Qwen2 decoder's shape with its parameter count (q/k/v biases, RMSNorms)."""
    kv = hidden // heads * kv_heads
    per_layer = hidden * (hidden + 2 * kv) + (hidden + 2 * kv) + hidden * hidden
    per_layer += 3 * hidden * mlp + 2 * hidden
    params = layers * per_layer + vocab * hidden * (1 if tied else 2) + hidden
    return ModelShape(hidden, layers, heads, kv_heads, mlp, vocab, params, "bfloat16")


QWEN2_SHAPES: dict[str, ModelShape] = {
    "Qwen2-0.5B": qwen2_shape(896, 24, 14, 2, 4864, 151936, tied=True),
    "Qwen2-1.5B": qwen2_shape(1536, 28, 12, 2, 8960, 151936, tied=True),
    "Qwen2-7B": qwen2_shape(3584, 28, 28, 4, 18944, 152064, tied=False),
}
"""Public configs (hidden, layers, heads, KV heads, MLP width, vocab, tied embeddings)."""


def kv_bytes_per_token(m: ModelShape, layers: int | None = None) -> int:
    """Bytes of cached keys and values one token holds (all layers unless given)."""
    head_dim = m.hidden_size // m.num_heads
    return (layers or m.num_layers) * 2 * m.num_kv_heads * head_dim * BYTES_PER_PARAM


def forward_seconds(matmul_params: int, weight_bytes: int, kv_per_token: int, layers: int,
                    hidden: int, batch: int, context: int, tokens: int) -> float:  # fmt: skip
    """The roofline time of one forward (module text)."""
    bytes_read = weight_bytes + batch * context * kv_per_token
    flops = 2 * matmul_params * batch * tokens + 4 * layers * hidden * batch * tokens * context
    memory_s = bytes_read / (HBM_BYTES_PER_S * BANDWIDTH_FRACTION)
    compute_s = flops / (PEAK_FLOPS * FLOPS_FRACTION)
    return FORWARD_OVERHEAD_S + max(memory_s, compute_s)


def matmul_params(m: ModelShape) -> int:
    """Parameters a forward multiplies with (and reads): all but an untied input embedding,
    which is a row lookup; i.e. the parameter count with a tied LM head."""
    return qwen2_shape(m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads,
                       m.intermediate_size, m.vocab_size, tied=True).params  # fmt: skip


def _curve(
    matmul: int, kv_per_token: int, layers: int, hidden: int, tokens: int
) -> list[StepPoint]:
    """Points over :data:`BATCHES` x :data:`CONTEXTS` of a forward reading ``matmul`` weights."""
    weights = matmul * BYTES_PER_PARAM
    return [
        StepPoint(
            b,
            c,
            tokens,
            forward_seconds(matmul, weights, kv_per_token, layers, hidden, b, c, tokens),
        )
        for c in CONTEXTS
        for b in BATCHES
    ]


def _target_points(m: ModelShape, tokens: int) -> list[StepPoint]:
    return _curve(matmul_params(m), kv_bytes_per_token(m), m.num_layers, m.hidden_size, tokens)


def drafter_params(m: ModelShape) -> int:
    """Trainable drafter parameters: one decoder layer of the target's shape plus fc 2H -> H."""
    one_layer = qwen2_shape(m.hidden_size, 1, m.num_heads, m.num_kv_heads,
                            m.intermediate_size, m.vocab_size, tied=True)  # fmt: skip
    layer = one_layer.params - m.vocab_size * m.hidden_size - m.hidden_size
    return layer + 2 * m.hidden_size * m.hidden_size + m.hidden_size


def _draft_points(m: ModelShape) -> list[StepPoint]:
    # Reads its own layer, fc and the shared LM head; attends over its own one-layer cache.
    matmul = drafter_params(m) + m.vocab_size * m.hidden_size
    return _curve(matmul, kv_bytes_per_token(m, layers=1), 1, m.hidden_size, 1)


def kv_capacity_tokens(m: ModelShape) -> int:
    """Tokens the KV cache of one GPU holds next to the weights (:data:`KV_MEMORY_FRACTION`)."""
    free = HBM_BYTES * KV_MEMORY_FRACTION - m.params * BYTES_PER_PARAM
    if free <= 0:
        raise ValueError(f"{m.params:,} parameters do not fit one {HBM_BYTES / 1e9:.0f} GB GPU")
    return int(free // kv_bytes_per_token(m))


def notes() -> list[str]:
    """The assumptions, as printed with every result that uses a roofline profile."""
    return [
        "ROOFLINE PROJECTION from first principles, not a measurement (sim/roofline.py)",
        f"HBM {HBM_BYTES_PER_S / 1e12:.2f} TB/s at {BANDWIDTH_FRACTION:.0%} achieved; "
        f"dense bf16 {PEAK_FLOPS / 1e12:.0f} TFLOP/s at {FLOPS_FRACTION:.0%} "
        "(decode/verify/draft), "
        f"{PREFILL_FLOPS_FRACTION:.0%} (prefill), {TRAIN_FLOPS_FRACTION:.0%} (training)",
        f"{FORWARD_OVERHEAD_S * 1e3:g} ms fixed overhead per forward; one GPU per model copy",
        f"weight sync: bf16 weights broadcast at {WEIGHT_SYNC_BYTES_PER_S / 1e9:.0f} GB/s, "
        f"packed into buckets at {_bucket_pack_rate() / 1e9:.0f} GB/s (HBM copy), loaded at "
        f"{LOAD_BYTES_PER_S / 1e9:.0f} GB/s; HTTP: packed at {HTTP_PACK_BYTES_PER_S / 1e9:.2f} "
        f"GB/s and pulled at {HTTP_PULL_BYTES_PER_S / 1e9:.2f} GB/s (the CPU machine's measured "
        "rates); the sharded trainer's gather derived from the broadcast rate",
        f"trainer: (6 + 2 x {TRAINER_EXTRA_FORWARDS}) FLOPs per parameter per token on ONE GPU: "
        "set the job shape's trainer replicas to the trainer GPUs",
        f"KV cache: {KV_MEMORY_FRACTION:.0%} of {HBM_BYTES / 1e9:.0f} GB less the weights, per "
        "rollout GPU; a full cache preempts the newest answer (recompute)",
    ]


def _bucket_pack_rate() -> float:
    """Casting and copying into GPU buckets: each byte read and written once in HBM."""
    return HBM_BYTES_PER_S * BANDWIDTH_FRACTION / 2


def sync_costs(m: ModelShape) -> SyncCosts:
    """The weight sync's per-phase rates on the roofline (every one an assumption)."""
    return SyncCosts(
        version_bytes=m.params * BYTES_PER_PARAM,
        http_pack_bytes_per_s=HTTP_PACK_BYTES_PER_S,
        http_pull_bytes_per_s=HTTP_PULL_BYTES_PER_S,
        load_bytes_per_s=LOAD_BYTES_PER_S,
        broadcast_pack_bytes_per_s=_bucket_pack_rate(),
        broadcast_wire_bytes_per_s=WEIGHT_SYNC_BYTES_PER_S,
        sources={
            "http_pack_bytes_per_s": "assumed: the CPU machine's measured HTTP publish rate",
            "http_pull_bytes_per_s": "assumed: the CPU machine's measured HTTP pull rate",
            "load_bytes_per_s": "assumed: host-to-GPU copy, half of PCIe 5.0 x16",
            "broadcast_pack_bytes_per_s": "assumed: HBM copy, read + write",
            "broadcast_wire_bytes_per_s": "assumed: NCCL over NVLink/InfiniBand",
        },
    )


def roofline_profile(
    model: str = "Qwen2-1.5B", device: str = "H100-class (roofline)"
) -> EngineProfile:
    """The roofline profile of one of :data:`QWEN2_SHAPES` on one H100-class GPU."""
    try:
        m = QWEN2_SHAPES[model]
    except KeyError:
        known = ", ".join(QWEN2_SHAPES)
        raise ValueError(f"model={model!r}: no public shape known; use one of {known}") from None
    train_flops = (6 + 2 * TRAINER_EXTRA_FORWARDS) * m.params
    drafter_train_flops = 6 * drafter_params(m) + 6 * m.vocab_size * m.hidden_size
    return EngineProfile(
        source="roofline",
        device=device,
        engine="roofline",
        model=m,
        decode=_target_points(m, 1),
        verify=[p for k in DEPTHS for p in _target_points(m, k + 1)],
        draft=_draft_points(m),
        prefill_tokens_per_s=PEAK_FLOPS * PREFILL_FLOPS_FRACTION / (2 * m.params),
        drafter_train_tokens_per_s=PEAK_FLOPS * TRAIN_FLOPS_FRACTION / drafter_train_flops,
        kv_cache_tokens=kv_capacity_tokens(m),
        weight_sync_s=m.params * BYTES_PER_PARAM / WEIGHT_SYNC_BYTES_PER_S,
        weight_sync=sync_costs(m),
        trainer_seconds_per_token=train_flops / (PEAK_FLOPS * TRAIN_FLOPS_FRACTION),
        notes=[f"model shape: {model} (public config)", *notes()],
    )
