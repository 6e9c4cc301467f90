"""The policy's token entropy, logged by the GRPO update as a diagnostic (``trainer/grpo.py``).

Known distributions through :func:`token_entropy`, its chunks against one pass, the entropy of
a real model's tempered logits at the response tokens, the loss and gradients untouched by it,
and its way from :func:`train_step` into the step row and the trackers' figures.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_grpo import VOCAB, rollout_batch, tiny_model

from longtail_api.steprow import StepRow
from longtail_workers.tracking.figures import step_figures
from longtail_workers.trainer.grpo import (
    grpo_loss,
    sequence_logprobs,
    sequence_logprobs_and_entropy,
    token_entropy,
)
from longtail_workers.trainer.optim import TrainConfig, build_optimizer, train_step


def test_entropy_of_known_distributions() -> None:
    v = 50
    logits = torch.zeros(1, 4, v)  # position 0: uniform
    logits[0, 1, 7] = 100.0  # one token holds all the mass
    logits[0, 2, 2:] = -math.inf  # two tokens, equally likely
    logits[0, 3] = torch.nan  # not a response position: ignored, reported as 0
    valid = torch.tensor([[True, True, True, False]])
    h = token_entropy(logits, valid)
    torch.testing.assert_close(h, torch.tensor([[math.log(v), 0.0, math.log(2), 0.0]]))


def test_chunks_equal_one_pass_and_the_textbook_formula() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(3, 7, 40, generator=gen)
    valid = torch.rand(3, 7, generator=gen) > 0.3
    one_row = token_entropy(logits, valid, chunk_elements=1)  # one row per chunk
    three_rows = token_entropy(logits, valid, chunk_elements=3 * 40 + 5)
    whole = token_entropy(logits, valid, chunk_elements=10**9)
    logp = torch.log_softmax(logits, dim=-1)
    textbook = torch.where(valid, -(logp.exp() * logp).sum(-1), 0.0)
    torch.testing.assert_close(whole, textbook)
    assert torch.equal(one_row, whole) and torch.equal(three_rows, whole)


def test_entropy_is_the_tempered_distribution_the_token_was_drawn_from() -> None:
    model = tiny_model()
    batch = rollout_batch(model)
    ids, attn, resp = batch.input_ids, batch.attention_mask, batch.response_mask
    with torch.no_grad():
        _, h = sequence_logprobs_and_entropy(model, ids, attn, resp, temperature=0.7)
        for row in range(ids.shape[0]):  # each row alone, unpadded, scored by hand
            keep = attn[row].bool()
            logits = model(input_ids=ids[row, keep][None]).logits[0] / 0.7  # [n, V]
            logp = torch.log_softmax(logits, dim=-1)
            manual = -(logp.exp() * logp).sum(-1)  # [n]: the distribution of token t + 1
            want = torch.zeros(ids.shape[1])
            want[keep] = torch.cat([torch.zeros(1), manual[:-1]])
            want = torch.where(resp[row].bool(), want, 0.0)
            torch.testing.assert_close(h[row], want, atol=1e-5, rtol=1e-5)
    assert float(h[resp.bool()].min()) > 0 and float(h[resp.bool()].max()) <= math.log(VOCAB)


def test_loss_and_gradients_do_not_change_with_the_entropy() -> None:
    model = tiny_model()
    batch = rollout_batch(model, ref=True)
    args = (batch.input_ids, batch.attention_mask, batch.response_mask, 0.9)
    results = []
    for with_entropy in (False, True):
        model.zero_grad()
        if with_entropy:
            logprobs, entropy = sequence_logprobs_and_entropy(model, *args)
            assert not entropy.requires_grad
        else:
            logprobs, entropy = sequence_logprobs(model, *args), None
        loss, stats = grpo_loss(logprobs, batch.old_logprobs, batch.advantages,
                                batch.response_mask, 0.2, batch.ref_logprobs, 0.05,
                                entropy=entropy)  # fmt: skip
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        results.append((loss.detach(), grads, stats))
    (loss0, grads0, stats0), (loss1, grads1, stats1) = results
    assert torch.equal(loss0, loss1)
    assert len(grads0) == len(grads1) > 0
    assert all(torch.equal(a, b) for a, b in zip(grads0, grads1, strict=True))
    assert stats0.entropy == 0.0  # none given
    want = float(entropy[batch.response_mask.bool()].mean())
    assert stats1.entropy == pytest.approx(want) and stats1.entropy > 0
    assert stats1.pg_loss == stats0.pg_loss and stats1.kl_ref == stats0.kl_ref


def test_train_step_reports_the_token_mean_entropy_whatever_its_micro_batches() -> None:
    entropies = []
    for budget in (None, 12):
        model = tiny_model()
        batch = rollout_batch(model)
        with torch.no_grad():
            _, h = sequence_logprobs_and_entropy(
                model, batch.input_ids, batch.attention_mask, batch.response_mask
            )
        cfg = TrainConfig(micro_batch_tokens=budget)
        stats = train_step(model, build_optimizer(model, cfg), batch, cfg)
        assert stats.micro_batches == (1 if budget is None else 3)
        want = float(h[batch.response_mask.bool()].mean())  # before the step: the update's
        assert stats.entropy == pytest.approx(want, rel=1e-5)
        entropies.append(stats.entropy)
    assert entropies[0] == pytest.approx(entropies[1], rel=1e-5)


def test_the_step_row_and_the_trackers_carry_it() -> None:
    model = tiny_model()
    batch = rollout_batch(model)
    cfg = TrainConfig()
    stats = train_step(model, build_optimizer(model, cfg), batch, cfg)
    base = {"step": 3, "policy_version": 3, "drafter_version": -1, "reward_mean": 0.5,
            "accuracy": 0.5, "rollout_s": 1.0, "tail_s": 0.1, "train_s": 0.5,
            "step_s": 1.7}  # fmt: skip
    row = StepRow(**base, train=stats.as_dict())  # as the driver builds it
    line = row.to_dict()
    assert line["train_entropy"] == stats.entropy > 0
    back = StepRow.from_dict(line)
    assert back.train["entropy"] == stats.entropy
    assert step_figures(back)["policy/entropy"] == pytest.approx(stats.entropy)
    old = StepRow.from_dict({k: v for k, v in line.items() if k != "train_entropy"})
    assert "entropy" not in old.train and "policy/entropy" not in step_figures(old)
