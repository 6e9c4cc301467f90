"""One pairing convention: the engine's draft step computes exactly what training pairs teach.

For every drafting phase of a real SD run (sampling at temperature 1, so acceptance is ragged;
SD switching on mid-generation, so the drafter is re-prefilled; more prompts than slots, so rows
are admitted while SD is on), the drafter logits that proposed the first draft token of each row
must equal the drafter's output, on ``build_training_pairs(context, target hidden states)``, at
the last pair. The drafter's context is the response (pairs from P-1 on), as the trainers
build it. A builder that is off by one (the pitfall TLT's reference code had), and a context that
also holds the prompt's pairs, must NOT reproduce them, which shows the check can fail.
"""

from __future__ import annotations

import pytest
import torch
from helpers import fixed_sd

from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.pairs import (
    DrafterInputs,
    DrafterTargets,
    build_training_pairs,
    sequence_from_result,
)
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.specdec import DraftTrace
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine

VOCAB = 16


# conftest.py's ``target`` fixture builds this policy
TARGET = dict(
    seed=8,
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    sharpness=10.0,
    dtype=torch.float64,
)


def _off_by_one_pairs(tokens: torch.Tensor, hidden: torch.Tensor, start: int = 0):
    """The classic bug: token t paired with state t (instead of token t+1 with state t)."""
    n = tokens.shape[-1]
    pos = torch.arange(n - 1) + start
    return DrafterInputs(tokens[:-1], hidden[:-1], pos), DrafterTargets(hidden[1:])


def _drafter_logits_from_pairs(
    target, drafter, context: list[int], first: int, builder, drafts: list[int] = ()
) -> torch.Tensor:
    """Reference drafter logits ``[1 + len(drafts), V]`` from an uncached forward.

    Row 0 comes from the pairs of ``context[first:]`` (``first`` = P-1: the response, as trainers
    build it; 0: the whole context); row i (i >= 1) from also feeding draft i with the previous
    step's output feature in place of the (unknown) target state, as drafting does.
    """
    tokens = torch.tensor(context)
    with torch.no_grad():
        hidden = target.get_decoder()(input_ids=tokens[None]).last_hidden_state[0]  # [N, H]
        inputs, _ = builder(tokens[first:], hidden[first:], first)
        ids, hid, pos = inputs.input_ids, inputs.hidden, inputs.position_ids
        feats = drafter(ids[None], hid[None], pos[None])[0]  # [N-1, H]
        out = [drafter.logits(feats[-1])]
        for d in drafts:
            ids = torch.cat([ids, torch.tensor([d])])
            hid = torch.cat([hid, feats[-1:]])
            pos = torch.cat([pos, pos[-1:] + 1])
            feats = drafter(ids[None], hid[None], pos[None])[0]
            out.append(drafter.logits(feats[-1]))
        return torch.stack(out)


def _traces(target) -> tuple[list[DraftTrace], TorchEngine, EagleDrafter]:
    traces: list[DraftTrace] = []
    drafter = EagleDrafter(target, target_id="tiny-pairs", seed=2)
    spec = fixed_sd(threshold=4, warmup=1)
    engine = TorchEngine(
        target,
        config=EngineConfig(max_running=5),
        speculative=spec,
        drafter=drafter,
        draft_observer=traces.append,
    )
    gen = torch.Generator().manual_seed(3)
    reqs = [
        GenerationRequest(
            torch.randint(0, VOCAB, (2 + i % 5,), generator=gen).tolist(),
            max_new_tokens=8 + 4 * i,
            temperature=1.0,
            seed=i,
        )
        for i in range(9)
    ]
    engine.generate(reqs)
    return traces, engine, drafter


def test_engine_draft_step_uses_the_training_pair_convention(target) -> None:
    traces, engine, drafter = _traces(target)
    assert engine.stats.plain_steps > 0 and engine.stats.sd_steps > 0  # switched on mid-way
    assert len(engine.stats.accepted_length_hist) >= 3  # ragged catch-up blocks
    checked = off_by_one = with_prompt = 0
    for trace in traces:
        for row, context in enumerate(trace.contexts):
            drafts = trace.drafts[row, :-1].tolist()
            first = trace.prompt_lengths[row] - 1
            expected = _drafter_logits_from_pairs(
                target, drafter, context, first, build_training_pairs, drafts
            )
            torch.testing.assert_close(trace.draft_logits[row], expected, rtol=0, atol=1e-9)
            got = trace.draft_logits[row, 0]
            wrong = _drafter_logits_from_pairs(target, drafter, context, first, _off_by_one_pairs)
            off_by_one += int(not torch.allclose(got, wrong[0], atol=1e-6))
            whole = _drafter_logits_from_pairs(target, drafter, context, 0, build_training_pairs)
            with_prompt += int(not torch.allclose(got, whole[0], atol=1e-6))
            checked += 1
    assert checked >= 40
    assert off_by_one == checked  # the off-by-one convention never matches the engine
    assert with_prompt == checked  # nor does a drafter that also reads the prompt's pairs


def test_build_training_pairs_layout() -> None:
    tokens = torch.tensor([10, 11, 12, 13])
    hidden = torch.arange(8.0).view(4, 2)
    inputs, targets = build_training_pairs(tokens, hidden, start_position=5)
    assert inputs.input_ids.tolist() == [11, 12, 13]  # x_{t+1}
    assert inputs.hidden.tolist() == hidden[:3].tolist()  # h_t
    assert inputs.position_ids.tolist() == [5, 6, 7]  # t
    assert targets.hidden.tolist() == hidden[1:].tolist()  # h_{t+1}
    batched, _ = build_training_pairs(tokens.expand(2, 4), hidden.expand(2, 4, 2))
    assert batched.input_ids.shape == (2, 3) and batched.position_ids.shape == (2, 3)
    with pytest.raises(ValueError, match="one state per token"):
        build_training_pairs(tokens, hidden[:3])
    with pytest.raises(ValueError, match="at least 2 tokens"):
        build_training_pairs(tokens[:1], hidden[:1])


def test_sequence_from_result_aligns_states_with_tokens(target) -> None:
    engine = TorchEngine(target)
    res = engine.generate(
        [
            GenerationRequest(
                [3, 1, 4, 1], max_new_tokens=6, temperature=0.8, seed=1, return_hidden_states=True
            )
        ]
    )[0]
    tokens, hidden, start = sequence_from_result(
        res.prompt_token_ids, res.output_token_ids, res.hidden_states
    )
    assert start == 3 and tokens.tolist() == [1, *res.output_token_ids[:-1]]
    full = torch.tensor([[3, 1, 4, 1, *res.output_token_ids]])
    with torch.no_grad():
        direct = target.get_decoder()(input_ids=full).last_hidden_state[0]
    # hidden[i] is the state after reading tokens[i] (absolute position start + i).
    torch.testing.assert_close(hidden, direct[start : start + len(tokens)], rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match="return_hidden_states"):
        sequence_from_result([1], [2, 3], torch.zeros(1, 32))
