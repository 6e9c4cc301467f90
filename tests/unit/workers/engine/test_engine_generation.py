"""The torch engine's plain decoding: stop conditions, admission, seeds, log-probs, hidden states.

Everything is checked against direct, uncached forwards of the same model (the definition of
the numbers in ``engine/interface.py``), in float64 so that batched and unbatched forwards agree
to rounding.
"""

from __future__ import annotations

import pytest
import torch
from tiny_targets import tiny_qwen2

from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
from longtail_workers.engine.sampling import sampling_probs

VOCAB = 40


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.set_num_threads(1)
    return tiny_qwen2(seed=7, vocab_size=VOCAB, sharpness=8.0, dtype=torch.float64)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (1 + (5 * i) % 13,), generator=gen).tolist() for i in range(n)]


def test_max_new_tokens_and_stop_token(model) -> None:
    engine = TorchEngine(model)
    free = engine.generate([GenerationRequest([1, 2, 3], max_new_tokens=12, temperature=0.0)])[0]
    assert free.finish_reason == "length" and len(free.output_token_ids) == 12
    # Stop on the 5th generated token: it is kept, nothing after it.
    stop = free.output_token_ids[4]
    first = free.output_token_ids.index(stop)
    stopped = engine.generate(
        [GenerationRequest([1, 2, 3], max_new_tokens=12, temperature=0.0, stop_token_ids=[stop])]
    )[0]
    assert stopped.finish_reason == "stop"
    assert stopped.output_token_ids == free.output_token_ids[: first + 1]
    one = engine.generate([GenerationRequest([1, 2, 3], max_new_tokens=1, temperature=0.0)])[0]
    assert one.output_token_ids == free.output_token_ids[:1] and one.finish_reason == "length"


def test_continuous_admission_more_prompts_than_slots(model) -> None:
    prompts = _prompts(11)
    requests = [
        GenerationRequest(p, max_new_tokens=3 + (i * 5) % 17, temperature=0.0, request_id=str(i))
        for i, p in enumerate(prompts)
    ]
    wide = TorchEngine(model, config=EngineConfig(max_running=16)).generate(requests)
    narrow_engine = TorchEngine(model, config=EngineConfig(max_running=3))
    narrow = narrow_engine.generate(requests)
    assert [r.request_id for r in narrow] == [str(i) for i in range(11)]  # request order
    for a, b in zip(wide, narrow, strict=True):
        assert a.output_token_ids == b.output_token_ids
        assert len(b.output_token_ids) == requests[int(b.request_id)].max_new_tokens
    assert narrow_engine.stats.max_batch_size == 3
    assert narrow_engine.stats.prefill_steps > 3  # admitted in several waves as rows finished


def test_seeded_sampling_is_independent_of_batch_composition(model) -> None:
    prompts = _prompts(6, seed=1)
    reqs = [
        GenerationRequest(p, max_new_tokens=15, temperature=0.9, top_p=0.9, seed=100 + i)
        for i, p in enumerate(prompts)
    ]
    together = TorchEngine(model, config=EngineConfig(max_running=6)).generate(reqs)
    # Reversed order, two at a time, and each alone: same tokens per request.
    rev = TorchEngine(model, config=EngineConfig(max_running=2)).generate(reqs[::-1])[::-1]
    alone = [TorchEngine(model).generate([r])[0] for r in reqs[:3]]
    for a, b in zip(together, rev, strict=True):
        assert a.output_token_ids == b.output_token_ids
    for a, b in zip(together, alone, strict=False):
        assert a.output_token_ids == b.output_token_ids
    reseeded = TorchEngine(model).generate([GenerationRequest(prompts[0], 15, 0.9, 0.9, seed=7)])
    assert reseeded[0].output_token_ids != together[0].output_token_ids
    unseeded = TorchEngine(model).generate([GenerationRequest(prompts[0], 15, 0.9, seed=None)] * 2)
    assert all(len(r.output_token_ids) == 15 for r in unseeded)


@pytest.mark.parametrize(("temperature", "top_p"), [(0.0, 1.0), (0.7, 0.8), (1.3, 1.0)])
def test_logprobs_and_hidden_states_match_a_direct_forward(model, temperature, top_p) -> None:
    prompts = _prompts(5, seed=2)
    reqs = [
        GenerationRequest(
            p,
            max_new_tokens=9,
            temperature=temperature,
            top_p=top_p,
            seed=i,
            return_hidden_states=True,
        )
        for i, p in enumerate(prompts)
    ]
    results = TorchEngine(model, config=EngineConfig(max_running=5)).generate(reqs)
    for req, res in zip(reqs, results, strict=True):
        p, out = list(req.prompt_token_ids), res.output_token_ids
        ids = torch.tensor([p + out])
        with torch.no_grad():
            hidden = model.get_decoder()(input_ids=ids).last_hidden_state[0]  # [P+T, H]
            logits = model(input_ids=ids).logits[0]  # [P+T, V]
        producing = slice(len(p) - 1, len(p) - 1 + len(out))
        t = temperature if temperature > 0 else 1.0
        expected = torch.log_softmax(logits[producing] / t, dim=-1)
        expected = expected.gather(1, torch.tensor(out)[:, None]).squeeze(1)
        assert res.output_logprobs == pytest.approx(expected.tolist(), abs=1e-9)
        assert res.hidden_states is not None and res.hidden_states.shape == (len(out), 64)
        torch.testing.assert_close(res.hidden_states, hidden[producing], rtol=0, atol=1e-9)
        probs = sampling_probs(
            logits[producing][None],
            torch.tensor([temperature], dtype=torch.float64),
            torch.tensor([top_p], dtype=torch.float64),
        )[0]
        # Every sampled token is inside the (temperature, top-p) support; greedy = argmax.
        assert bool((probs.gather(1, torch.tensor(out)[:, None]) > 0).all())
        if temperature == 0.0:
            assert out == logits[producing].argmax(-1).tolist()


def test_hidden_states_only_when_asked(model) -> None:
    res = TorchEngine(model).generate([GenerationRequest([4, 5], max_new_tokens=3)])[0]
    assert res.hidden_states is None


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (dict(prompt_token_ids=[], max_new_tokens=2), "prompt_token_ids is empty"),
        (dict(prompt_token_ids=[VOCAB], max_new_tokens=2), "outside the model's vocabulary"),
        (dict(prompt_token_ids=[1], max_new_tokens=0), "max_new_tokens=0"),
        (dict(prompt_token_ids=[1], max_new_tokens=2, temperature=-1), "temperature=-1"),
        (dict(prompt_token_ids=[1], max_new_tokens=2, top_p=0.0), "top_p=0.0"),
        (dict(prompt_token_ids=[1], max_new_tokens=600), "max_position_embeddings"),
    ],
)
def test_invalid_requests_are_refused_with_the_field_named(model, kwargs, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        TorchEngine(model).generate([GenerationRequest(**kwargs)])


def test_training_mode_model_is_refused() -> None:
    model = tiny_qwen2(seed=1, vocab_size=VOCAB).train()
    with pytest.raises(ValueError, match=r"model\.eval\(\)"):
        TorchEngine(model)


def test_float32_model_runs(model) -> None:
    small = tiny_qwen2(seed=2, vocab_size=VOCAB)
    res = TorchEngine(small).generate([GenerationRequest([1, 2], max_new_tokens=5, seed=0)])
    assert len(res[0].output_token_ids) == 5
    assert all(lp <= 0 for lp in res[0].output_logprobs)
