"""GRPO maths on hand-computed cases, log-probs against a manual gather, and one train step."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from longtail_api.spec import AlgorithmSpec
from longtail_workers.trainer.batch import GrpoBatch, micro_batches
from longtail_workers.trainer.grpo import (
    group_advantages,
    grpo_loss,
    k3_kl,
    sequence_logprobs,
)
from longtail_workers.trainer.optim import (
    CPU_MICRO_BATCH_TOKENS,
    GPU_MICRO_BATCH_TOKENS,
    TrainConfig,
    UpdateAbandoned,
    build_optimizer,
    micro_batch_budget,
    train_step,
)

VOCAB = 32


def tiny_model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(config).eval()  # eval: no dropout, as in rollout


# --- group_advantages ------------------------------------------------------------------------


def test_advantages_groups_of_two_use_unbiased_std() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=2)
    # Each group [1, 0]: mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / 0.7071 = +-0.7071.
    expected = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(adv, torch.tensor([expected, -expected, -expected, expected]))


def test_advantages_group_of_four_unbiased_not_population() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4)
    expected = 0.5 / (math.sqrt(1.0 / 3.0) + 1e-6)  # unbiased std of [1,0,0,1] = sqrt(1/3)
    torch.testing.assert_close(adv, torch.tensor([expected, -expected, -expected, expected]))
    assert abs(float(adv[0]) - 1.0) > 0.1  # the population std would give exactly +-1


def test_zero_variance_group_gets_exact_zeros() -> None:
    # 0.9 is not representable: the float32 mean of [0.9] * 3 is not 0.9, so a naive
    # (r - mean) / (std + eps) gives 0.0555 here instead of 0.
    rewards = torch.tensor([0.9, 0.9, 0.9, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    adv = group_advantages(rewards, group_size=3)
    assert torch.equal(adv[:3], torch.zeros(3))
    assert torch.equal(adv[6:], torch.zeros(3))
    assert adv[3] > 0 > adv[4]
    assert torch.isfinite(adv).all()


def test_advantages_without_std_are_centred_rewards() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, normalize_std=False)
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]))


@pytest.mark.parametrize(
    ("rewards", "group_size", "match"),
    [
        (torch.zeros(2, 2), 2, "1-D tensor"),
        (torch.zeros(5), 2, "not a positive multiple of group_size=2"),
        (torch.zeros(0), 2, "not a positive multiple"),
        (torch.zeros(4), 1, "group_size must be an int >= 2"),
        (torch.zeros(4), 0, "group_size must be an int >= 2"),
        (torch.tensor([1.0, float("nan")]), 2, r"non-finite at indices \[1\]"),
    ],
)
def test_advantages_reject_bad_input(rewards: torch.Tensor, group_size: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards, group_size)


# --- grpo_loss ---------------------------------------------------------------------------------


def test_ratio_one_gives_minus_token_mean_advantage_on_ragged_rows() -> None:
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 0, 0]])  # 3 tokens and 1 token
    logp = torch.full((2, 4), -1.0)
    adv = torch.tensor([1.0, -2.0])
    loss, stats = grpo_loss(logp, logp.clone(), adv, mask, clip_ratio=0.2)
    token_mean = -(3 * 1.0 + 1 * -2.0) / 4  # every token weighs the same
    sequence_mean = -(1.0 + -2.0) / 2  # what per-sequence averaging would give
    assert float(loss) == pytest.approx(token_mean)
    assert float(loss) != pytest.approx(sequence_mean)
    assert stats.tokens == 4
    assert stats.ratio_mean == pytest.approx(1.0)
    assert stats.approx_kl == pytest.approx(0.0)
    assert stats.clip_fraction == 0.0


@pytest.mark.parametrize(
    ("ratio", "advantage", "expected", "clip_fraction"),
    [
        (1.5, 1.0, -1.2, 1.0),  # gain capped at 1 + eps
        (1.5, -1.0, 1.5, 0.0),  # pessimistic: the unclipped, larger loss
        (0.5, 1.0, -0.5, 0.0),  # pessimistic: the unclipped, smaller gain
        (0.5, -1.0, 0.8, 1.0),  # gain capped at 1 - eps
    ],
)
def test_clipped_surrogate(
    ratio: float, advantage: float, expected: float, clip_fraction: float
) -> None:
    old = torch.tensor([[-2.0]])
    logp = (old + math.log(ratio)).requires_grad_()
    loss, stats = grpo_loss(logp, old, torch.tensor([advantage]), torch.ones(1, 1), clip_ratio=0.2)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)
    assert stats.clip_fraction == clip_fraction
    loss.backward()
    assert logp.grad is not None
    # Clipped tokens carry no gradient; unclipped ones carry -A * ratio.
    want = 0.0 if clip_fraction else -advantage * ratio
    assert float(logp.grad) == pytest.approx(want, rel=1e-5)


def test_masked_tokens_are_ignored_even_when_nan() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    logp = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, float("inf"), 1e4]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.9, float("nan")], [-0.4, -float("inf"), -1e4]])
    ref = torch.tensor([[-1.0, -2.5, float("nan")], [-0.7, 3.0, float("nan")]])
    adv = torch.tensor([0.5, -1.0])
    loss, _ = grpo_loss(logp, old, adv, mask, 0.2, ref_logprobs=ref, kl_coef=0.1)
    clean = torch.tensor([[-1.0, -2.0, -1.0], [-0.5, -1.0, -1.0]], requires_grad=True)
    # Only the valid entries of old/ref matter, so the two losses agree.
    old_valid = torch.where(mask.bool(), old, torch.zeros(()))
    ref_valid = torch.where(mask.bool(), ref, torch.zeros(()))
    same, _ = grpo_loss(clean, old_valid, adv, mask, 0.2, ref_valid, 0.1)
    assert torch.isfinite(loss)
    assert float(loss.detach()) == pytest.approx(float(same.detach()))
    loss.backward()
    assert logp.grad is not None
    assert torch.isfinite(logp.grad).all()
    assert torch.equal(logp.grad[~mask.bool()], torch.zeros(3))


def test_k3_kl_hand_value_and_weight() -> None:
    logp = torch.tensor([[math.log(0.25)]])
    ref = torch.tensor([[math.log(0.5)]])  # d = ref - logp = log 2
    expected = 2.0 - math.log(2.0) - 1.0  # exp(d) - d - 1 = 0.30685
    assert float(k3_kl(ref, logp, torch.ones(1, 1))) == pytest.approx(expected)
    loss, stats = grpo_loss(
        logp, logp, torch.zeros(1), torch.ones(1, 1), 0.2, ref_logprobs=ref, kl_coef=0.5
    )
    assert float(loss) == pytest.approx(0.5 * expected)  # A = 0: only the KL term remains
    assert stats.kl_ref == pytest.approx(expected)


def test_loss_rejects_bad_shapes_and_empty_mask() -> None:
    logp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"advantages must be \[B\] = \[2\]"):
        grpo_loss(logp, logp, torch.zeros(2, 1), torch.ones(2, 3), 0.2)
    with pytest.raises(ValueError, match="mask must have the shape of logprobs"):
        grpo_loss(logp, logp, torch.zeros(2), torch.ones(2, 4), 0.2)
    with pytest.raises(ValueError, match="no response tokens"):
        grpo_loss(logp, logp, torch.zeros(2), torch.zeros(2, 3), 0.2)
    with pytest.raises(ValueError, match="clip_ratio"):
        grpo_loss(logp, logp, torch.zeros(2), torch.ones(2, 3), 1.5)


# --- sequence_logprobs -------------------------------------------------------------------------


def test_sequence_logprobs_equals_manual_gather_at_temperature() -> None:
    model = tiny_model()
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    attn = torch.ones_like(ids)
    resp = torch.zeros_like(ids)
    resp[:, 4:] = 1
    out = sequence_logprobs(model, ids, attn, resp, temperature=0.7)
    with torch.no_grad():
        logits = model(input_ids=ids).logits / 0.7  # [B, T, V]
    manual = torch.log_softmax(logits, dim=-1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(out[:, 4:], manual[:, 3:], atol=1e-5, rtol=1e-5)
    assert torch.equal(out[:, :4], torch.zeros(2, 4))
    assert out.requires_grad  # the trainer differentiates through it


def test_sequence_logprobs_padding_side_does_not_change_values() -> None:
    model = tiny_model()
    seq = torch.tensor([[5, 9, 3, 7, 2, 11]])
    resp = torch.tensor([[0, 0, 0, 1, 1, 1]])
    alone = sequence_logprobs(model, seq, torch.ones_like(seq), resp)
    pad = torch.zeros(1, 3, dtype=torch.long)
    left = sequence_logprobs(
        model,
        torch.cat([pad, seq], 1),
        torch.cat([pad, torch.ones_like(seq)], 1),
        torch.cat([pad, resp], 1),
    )
    right = sequence_logprobs(
        model,
        torch.cat([seq, pad], 1),
        torch.cat([torch.ones_like(seq), pad], 1),
        torch.cat([resp, pad], 1),
    )
    torch.testing.assert_close(left[:, 3:], alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(right[:, :6], alone, atol=1e-5, rtol=1e-5)


def test_sequence_logprobs_rejects_bad_input() -> None:
    model = tiny_model()
    ids = torch.ones(1, 4, dtype=torch.long)
    resp = torch.tensor([[0, 0, 1, 1]])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sequence_logprobs(model, ids, torch.ones_like(ids), resp, temperature=0.0)
    with pytest.raises(ValueError, match="first position has no context"):
        sequence_logprobs(model, ids, torch.ones_like(ids), torch.ones_like(ids))
    with pytest.raises(ValueError, match="marks padding"):
        sequence_logprobs(model, ids, torch.tensor([[1, 1, 1, 0]]), resp)


# --- micro-batches and train_step --------------------------------------------------------------


def rollout_batch(model: Qwen2ForCausalLM, ref: bool = False) -> GrpoBatch:
    """Four left-padded sequences of different lengths, scored by ``model`` as the old policy."""
    gen = torch.Generator().manual_seed(3)
    lengths, prompt, width = [10, 6, 8, 4], 2, 10
    ids = torch.zeros(4, width, dtype=torch.long)
    attn = torch.zeros(4, width, dtype=torch.long)
    resp = torch.zeros(4, width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.randint(1, VOCAB, (n,), generator=gen)
        attn[row, width - n :] = 1
        resp[row, width - n + prompt :] = 1
    with torch.no_grad():
        old = sequence_logprobs(model, ids, attn, resp)
    return GrpoBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=resp,
        old_logprobs=old,
        advantages=group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2),
        ref_logprobs=old.clone() if ref else None,
    )


def test_micro_batches_respect_budget_and_drop_loss_free_rows() -> None:
    batch = rollout_batch(tiny_model())
    resp = batch.response_mask.clone()
    resp[1] = 0  # no response tokens: no loss, not worth a forward pass
    batch = GrpoBatch(**{**batch.__dict__, "response_mask": resp})
    chunks = micro_batches(batch, max_tokens=16)
    assert sum(c.num_sequences for c in chunks) == 3
    for chunk in chunks:
        b, t = chunk.input_ids.shape
        assert b * t <= 16 or b == 1  # a row longer than the budget rides alone
        assert bool(chunk.attention_mask[:, 0].any())  # leading all-padding columns are cut
    assert sum(c.num_tokens for c in chunks) == batch.num_tokens


def test_train_step_decreases_loss_and_reports_stats() -> None:
    model = tiny_model()
    batch = rollout_batch(model, ref=True)
    cfg = TrainConfig(learning_rate=3e-3, kl_coef=0.01, micro_batch_tokens=24)
    optimizer = build_optimizer(model, cfg)
    history = [train_step(model, optimizer, batch, cfg) for _ in range(4)]
    first, last = history[0], history[-1]
    assert first.ratio_mean == pytest.approx(1.0)  # old logprobs are the current policy's
    assert first.kl_ref == pytest.approx(0.0, abs=1e-6)
    assert last.loss < first.loss - 0.05
    assert last.approx_kl > 0 and last.kl_ref > 0  # the policy moved away from old and ref
    assert first.micro_batches > 1 and first.tokens == batch.num_tokens == 20
    assert all(p.grad is None for p in model.parameters())  # zeroed after the step


def test_micro_batched_update_equals_full_batch_update() -> None:
    deltas = []
    for budget in (None, 12):
        model = tiny_model()
        batch = rollout_batch(model)
        before = [p.detach().clone() for p in model.parameters()]
        cfg = TrainConfig(max_grad_norm=None, micro_batch_tokens=budget)
        sgd = torch.optim.SGD(model.parameters(), lr=1.0)  # update = -gradient, exactly
        stats = train_step(model, sgd, batch, cfg)
        deltas.append([p.detach() - b for p, b in zip(model.parameters(), before, strict=True)])
        assert stats.micro_batches == (1 if budget is None else 3)  # spans 4+6 | 8 | 10
    for full, micro in zip(*deltas, strict=True):
        torch.testing.assert_close(micro, full, atol=1e-6, rtol=1e-4)


def test_gradient_clipping_bounds_the_update_and_reports_pre_clip_norm() -> None:
    model = tiny_model()
    batch = rollout_batch(model)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = TrainConfig(max_grad_norm=1e-3)
    stats = train_step(model, torch.optim.SGD(model.parameters(), lr=1.0), batch, cfg)
    assert stats.grad_clipped and stats.grad_norm > 1e-3 and not stats.skipped
    moved = torch.sqrt(
        sum(((p.detach() - b) ** 2).sum() for p, b in zip(model.parameters(), before, strict=True))
    )
    assert float(moved) == pytest.approx(1e-3, rel=1e-3)  # SGD lr 1: |update| = clipped norm


def test_non_finite_gradient_skips_the_update() -> None:
    model = tiny_model()
    batch = rollout_batch(model)
    bad = GrpoBatch(**{**batch.__dict__, "advantages": torch.tensor([float("nan"), 1.0, 0.0, 0.0])})
    before = [p.detach().clone() for p in model.parameters()]
    stats = train_step(model, torch.optim.SGD(model.parameters(), lr=1.0), bad, TrainConfig())
    assert stats.skipped and not math.isfinite(stats.grad_norm)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))


def test_train_config_from_algorithm_and_validation() -> None:
    algo = AlgorithmSpec(learning_rate=2e-6, kl_coef=0.05, clip_ratio=0.3, temperature=0.0)
    cfg = TrainConfig.from_algorithm(algo, micro_batch_tokens=4096)
    assert (cfg.learning_rate, cfg.kl_coef, cfg.clip_ratio) == (2e-6, 0.05, 0.3)
    assert cfg.temperature == 1.0  # greedy rollouts are scored at temperature 1
    assert cfg.micro_batch_tokens == 4096
    with pytest.raises(ValueError, match=r"clip_ratio=1\.5"):
        TrainConfig(clip_ratio=1.5)


def test_the_micro_batch_budget_is_the_job_setting_else_the_device_default() -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert micro_batch_budget(0, cpu) == CPU_MICRO_BATCH_TOKENS == 1024
    assert micro_batch_budget(None, gpu) == GPU_MICRO_BATCH_TOKENS == 16384
    assert micro_batch_budget(3000, cpu) == micro_batch_budget(3000, gpu) == 3000


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_train_step_moves_the_host_batch_to_the_policy_device() -> None:
    # The driver builds the batch on the host; the first GPU sitting of #35 failed here
    # (index on cpu) because no update had ever run on a GPU.
    model = tiny_model()
    host = rollout_batch(model, ref=True)  # built on the host, as the driver does
    model = model.cuda()
    cfg = TrainConfig(learning_rate=3e-3, kl_coef=0.01, micro_batch_tokens=24)
    stats = train_step(model, build_optimizer(model, cfg), host, cfg)  # not moved by the caller
    assert stats.tokens == host.num_tokens and math.isfinite(stats.loss)


def test_a_batch_moves_whole_to_a_device() -> None:
    batch = rollout_batch(tiny_model(), ref=True)
    moved = batch.to(torch.device("cpu"))
    for name in (
        "input_ids",
        "attention_mask",
        "response_mask",
        "old_logprobs",
        "advantages",
        "ref_logprobs",
    ):
        assert torch.equal(getattr(moved, name), getattr(batch, name)), name


# --- a stop during the update (issue #48 item 10) ----------------------------------------------


class StopAfter:
    """A stop flag that is raised once it has been asked ``checks`` times; counts the asks."""

    def __init__(self, checks: int) -> None:
        self.checks, self.asked = checks, 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.asked > self.checks


@pytest.mark.parametrize("checks", [0, 1, 3], ids=["before-any", "after-one", "before-step"])
def test_a_stop_abandons_the_update_and_applies_nothing(checks: int) -> None:
    model = tiny_model()
    batch = rollout_batch(model)
    cfg = TrainConfig(learning_rate=3e-3, micro_batch_tokens=12)  # 3 micro-batches, then a step
    optimizer = build_optimizer(model, cfg)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(UpdateAbandoned, match="stop requested: the policy update was abandoned"):
        train_step(model, optimizer, batch, cfg, stop=StopAfter(checks))
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert all(p.grad is None for p in model.parameters())  # the partial gradient is dropped
    assert not optimizer.state  # AdamW took no step: its moments are still empty
    # The next update runs whole, as if the abandoned one had never started.
    stats = train_step(model, optimizer, batch, cfg, stop=lambda: False)
    assert stats.micro_batches == 3 and not stats.skipped


def test_the_stop_is_asked_between_micro_batches_and_before_the_step() -> None:
    model = tiny_model()
    cfg = TrainConfig(micro_batch_tokens=12)
    never = StopAfter(1_000)
    stats = train_step(model, build_optimizer(model, cfg), rollout_batch(model), cfg, stop=never)
    assert never.asked == stats.micro_batches + 1 == 3 + 1
