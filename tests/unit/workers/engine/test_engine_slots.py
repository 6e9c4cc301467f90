"""The static slot cache and its attention give what an uncached forward gives.

``kvcache/slots.py`` + ``kvcache/slot_attention.py`` through the model's own decoder
(``engine/target.py``): right-padded prefill into rows below others, single-token decode, and a
multi-token verify (each query reads up to its own slot: lower-right causal) all match direct
forwards of the same prefixes; garbage in other rows and past a row's length is never read; the
model keeps working for every other caller (its stock attention, with its own masks), such as
``response_states``, the one batched recompute of the states behind each output token. Also the
device random numbers match their definition bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_targets import tiny_qwen2

from longtail_workers.engine.sampling import (
    counter_uniforms,
    seed_bits,
    stream_keys,
    torch_uniforms,
)
from longtail_workers.engine.target import TargetModel, response_states
from longtail_workers.kvcache.slots import SlotAttention

VOCAB = 32


@pytest.fixture(scope="module")
def target() -> TargetModel:
    torch.set_num_threads(1)
    return TargetModel(tiny_qwen2(seed=5, vocab_size=VOCAB, sharpness=5.0, dtype=torch.float64))


def _reference(target: TargetModel, tokens: list[int]) -> torch.Tensor:
    """Logits of an uncached forward at every position ``[T, V]``."""
    with torch.no_grad():
        return target.model(input_ids=torch.tensor([tokens])).logits[0]


def _forward(target, kv, ids: list[list[int]], pos: list[list[int]], row0: int = 0):
    at = torch.tensor(pos)
    step = SlotAttention(at, torch.zeros_like(at), span=int(at.max()) + 1, row0=row0)
    return target.logits(target.forward(torch.tensor(ids), kv, step))


def test_response_states_are_each_rows_own_forward(target: TargetModel) -> None:
    seqs = [([3, 1, 4], [1, 5, 9, 2]), ([6], [5]), ([3, 5, 8, 9, 7, 9], [3, 2])]
    states = response_states(target.model, seqs)  # right-padded batch, no mask
    with torch.no_grad():
        for (p, o), h in zip(seqs, states, strict=True):
            # What the vLLM engine and the drafter windows each computed: the row's own forward.
            own = target.decoder(input_ids=torch.tensor([p + o[:-1]])).last_hidden_state[0]
            torch.testing.assert_close(h, own[len(p) - 1 :], rtol=0, atol=1e-10)  # [T_out, H]
            # Off by one position (the classic pairing bug) is far from it.
            assert len(o) < 2 or not torch.allclose(h[1:], own[len(p) - 1 : -1], atol=1e-3)
    assert response_states(target.model, []) == []
    with pytest.raises(ValueError, match="at least one prompt token"):
        response_states(target.model, [([], [1, 2])])


def test_prefill_decode_and_verify_match_uncached_forwards(target: TargetModel) -> None:
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (2, 5, 3)]
    kv = target.new_cache(5, 16)
    for buf in kv.keys + kv.values:
        # Nothing unwritten may ever count. (Finite garbage: the reference path masks slots
        # out of a softmax, and 0 * NaN would still be NaN; the buffers start zeroed.)
        buf.fill_(1e6)
    width = max(len(p) for p in prompts)
    ids = [p + [0] * (width - len(p)) for p in prompts]  # right-padded
    logits = _forward(target, kv, ids, [list(range(width))] * 3, row0=1)  # rows 1..3
    for b, p in enumerate(prompts):
        torch.testing.assert_close(logits[b, : len(p)], _reference(target, p), rtol=0, atol=1e-10)
    seqs = [list(p) for p in prompts]
    for _ in range(2):  # decode: one token per row at its own length
        nxt = [[int(torch.randint(0, VOCAB, (1,), generator=gen))] for _ in seqs]
        for s, t in zip(seqs, nxt, strict=True):
            s.extend(t)
        logits = _forward(target, kv, nxt, [[len(s) - 1] for s in seqs], row0=1)
        for b, s in enumerate(seqs):
            torch.testing.assert_close(logits[b, 0], _reference(target, s)[-1], rtol=0, atol=1e-10)
    drafts = [torch.randint(0, VOCAB, (3,), generator=gen).tolist() for _ in seqs]
    pos = [list(range(len(s), len(s) + 3)) for s in seqs]
    logits = _forward(target, kv, drafts, pos, row0=1)  # verify: 3 queries per row
    for b, (s, d) in enumerate(zip(seqs, drafts, strict=True)):
        ref = _reference(target, s + d)[len(s) :]
        torch.testing.assert_close(logits[b], ref, rtol=0, atol=1e-10)
    # A rejected draft's slot is simply overwritten: rewrite position len(s) with a new token.
    logits = _forward(target, kv, [[d[1]] for d in drafts], [[len(s)] for s in seqs], row0=1)
    for b, (s, d) in enumerate(zip(seqs, drafts, strict=True)):
        ref = _reference(target, [*s, d[1]])[-1]
        torch.testing.assert_close(logits[b, 0], ref, rtol=0, atol=1e-10)


def test_the_mask_reads_lo_to_q_pos() -> None:
    q_pos = torch.tensor([[3, 4], [0, 1]])
    lo = torch.tensor([[1, 2], [0, 0]])
    mask = SlotAttention(q_pos, lo, span=6).mask()[:, 0]  # [B, Q, S]
    want = [[[lo[b, i] <= s <= q_pos[b, i] for s in range(6)] for i in range(2)] for b in range(2)]
    assert mask.tolist() == want


def test_other_callers_keep_the_stock_attention(target: TargetModel) -> None:
    assert target.config._attn_implementation.startswith("longtail_")
    ids = torch.tensor([[3, 4, 5, 6], [0, 0, 7, 8]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    fresh = tiny_qwen2(seed=5, vocab_size=VOCAB, sharpness=5.0, dtype=torch.float64)
    with torch.no_grad():
        mine = target.model(input_ids=ids, attention_mask=mask).logits
        stock = fresh(input_ids=ids, attention_mask=mask).logits
    assert fresh.config._attn_implementation == "sdpa"
    torch.testing.assert_close(mine[:, -1], stock[:, -1], rtol=0, atol=0)


def _uniforms_by_definition(seeds: list[int], positions: np.ndarray, stream: int) -> np.ndarray:
    """SplitMix64 over uint64 in NumPy: the definition the device version must reproduce."""

    def mix(x: np.ndarray) -> np.ndarray:
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))

    with np.errstate(over="ignore"):
        s = mix(
            np.array([x % 2**64 for x in seeds], dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        )
        key = positions.astype(np.uint64) * np.uint64(0xD1B54A32D192ED03) + np.uint64(
            ((stream + 1) * 0x8CB92BA72F3D8DD7) % 2**64
        )
        h = mix(mix(s[:, None] ^ key))
    return (h >> np.uint64(11)).astype(np.float64) / 2.0**53


@pytest.mark.parametrize("stream", [0, 3])
def test_device_uniforms_match_their_definition_bit_for_bit(stream: int) -> None:
    seeds = [0, 1, 2**63 - 1, 2**63, 2**64 - 1, -5, 12345678901234567890]
    positions = np.arange(len(seeds) * 9).reshape(len(seeds), 9)
    keys = stream_keys(torch.tensor([seed_bits(s) for s in seeds]))
    want = _uniforms_by_definition(seeds, positions, stream)
    # The CPU path (NumPy) and the torch arithmetic a GPU runs, both bit for bit.
    for got in (
        counter_uniforms(keys, torch.from_numpy(positions), stream),
        torch_uniforms(keys, torch.from_numpy(positions), stream),
    ):
        assert np.array_equal(got.numpy(), want)
        assert float(got.min()) >= 0.0 and float(got.max()) < 1.0


@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
def test_the_engine_on_the_triton_kernel_matches_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole engine with ``attention_backend='triton'`` (the kernel a GPU runs, here in
    Triton's interpreter) gives the torch reference's greedy tokens, plain and speculative."""
    pytest.importorskip("triton", reason="Triton is not installed (the dev extra pins it)")
    from longtail_api.policies import SpeculativeSpec, StrategySpec
    from longtail_workers.drafter.model import EagleDrafter
    from longtail_workers.engine.interface import GenerationRequest
    from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    model = tiny_qwen2(seed=6, vocab_size=VOCAB, sharpness=30.0, dtype=torch.float32)
    drafter = EagleDrafter(model, target_id="t", seed=2)
    spec = SpeculativeSpec(
        enabled=True, batch_threshold=8, warmup_steps=0, strategies=[StrategySpec(draft_depth=3)]
    )
    requests = [
        GenerationRequest([1 + i, 2, 3][: 1 + i % 3], max_new_tokens=6 + i, temperature=0.0)
        for i in range(3)
    ]
    outputs = {}
    for backend in ("torch", "triton"):
        engine = TorchEngine(
            model,
            config=EngineConfig(max_running=2, attention_backend=backend),
            speculative=spec,
            drafter=drafter,
        )
        assert engine.backend == backend
        outputs[backend] = [r.output_token_ids for r in engine.generate(requests)]
        assert engine.stats.sd_steps > 0
    assert outputs["triton"] == outputs["torch"]
