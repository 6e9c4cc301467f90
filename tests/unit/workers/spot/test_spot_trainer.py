"""The spot trainer: preemptible between steps, resumable, loud on errors, and it really learns."""

from __future__ import annotations

import time

import pytest
import torch
from helpers import mean_accepted_length
from tiny_targets import random_prompts

from longtail_api.policies import DrafterTrainingSpec
from longtail_api.wirecodec import to_wire
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.spot.buffer import CapturedSequence, RolloutBuffer
from longtail_workers.spot.trainer import (
    EmptyBufferError,
    SpotTrainer,
    SpotTrainingError,
    WindowVerdict,
)

VOCAB = 48
SPEC = DrafterTrainingSpec(learning_rate=3e-3, window_tokens=32, max_steps_per_window=10_000)


@pytest.fixture(scope="module")
def filled(target) -> RolloutBuffer:
    """A buffer filled by real rollouts of the target (the worker's capture path)."""
    reqs = [
        GenerationRequest(p, max_new_tokens=48, temperature=1.0, seed=i, return_hidden_states=True)
        for i, p in enumerate(random_prompts(0, 64, VOCAB))
    ]
    buf = RolloutBuffer(max_tokens=100_000, max_bytes=1 << 30)
    buf.add_results(TorchEngine(target).generate(reqs), policy_version=0, step=0)
    return buf


def trainer(target, buffer, seed: int = 1, **kw) -> SpotTrainer:
    drafter = EagleDrafter(target, target_id="tiny-spot", seed=seed)
    return SpotTrainer(drafter, buffer, SPEC, pack_tokens=64, rows_per_step=2, **kw)


def run(t: SpotTrainer, steps: int) -> None:
    t.start(steps)
    assert t.wait_stopped(60.0)
    t.raise_if_failed()


def test_refuses_an_empty_buffer(target) -> None:
    t = trainer(target, RolloutBuffer(max_tokens=1000, max_bytes=1 << 30))
    with pytest.raises(EmptyBufferError, match="nothing to train"):
        t.start(5)
    assert t.state == "idle"


def test_window_is_bounded_by_max_steps_per_window(target, filled) -> None:
    spec = DrafterTrainingSpec(window_tokens=32, max_steps_per_window=3)
    t = SpotTrainer(EagleDrafter(target, target_id="x"), filled, spec, pack_tokens=64)
    assert t.start(10**6) == 3
    assert t.wait_stopped(30.0)
    assert t.last_window is not None and t.last_window.steps == 3
    assert t.last_window.stop_reason == "max_steps"


def test_stop_only_between_steps_and_fast(target, filled) -> None:
    t = trainer(target, filled)
    latencies = []
    for i in range(8):
        t.start()
        time.sleep(0.01 * (i % 3))
        t.request_stop()
        assert t.wait_stopped(5.0), "stop request not honoured within 5 s"
        assert t.state == "idle" and t.last_window is not None
        assert t.last_window.stop_reason == "requested"
        latencies.append(t.last_window.stop_latency_s)
        # No half step: every parameter's AdamW step count equals the steps taken.
        counts = {int(s["step"]) for s in t.optimizer.state.values()}
        assert counts <= {t.total_steps}, (counts, t.total_steps)
    assert max(latencies) < 1.0, latencies  # one optimizer step is ~20 ms here
    assert len(t.stop_latencies) == 8


def test_resume_keeps_the_optimizer_state(target, filled) -> None:
    split, straight, restarted = (trainer(target, filled, seed=5) for _ in range(3))
    run(split, 3)
    run(split, 3)
    run(straight, 6)
    assert split.total_steps == 6
    assert {int(s["step"]) for s in split.optimizer.state.values()} == {6}
    for a, b in zip(split.drafter.parameters(), straight.drafter.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # A fresh optimizer after 3 steps (what a reload would do) ends elsewhere: the check can fail.
    run(restarted, 3)
    restarted.optimizer = torch.optim.AdamW(restarted.drafter.parameters(), lr=SPEC.learning_rate)
    run(restarted, 3)
    diffs = [
        float((a - b).detach().abs().max())
        for a, b in zip(split.drafter.parameters(), restarted.drafter.parameters(), strict=True)
    ]
    assert max(diffs) > 1e-4


def test_a_crash_in_the_thread_surfaces(target) -> None:
    buf = RolloutBuffer(max_tokens=1000, max_bytes=1 << 30)
    wrong = torch.randn(10, 7)  # hidden size 7, the target has 64
    buf.add(CapturedSequence(torch.arange(10), wrong, 0, policy_version=0, step=0))
    t = trainer(target, buf)
    t.start(5)
    assert t.wait_stopped(10.0)
    status = t.status()
    assert status.state == "failed" and status.error is not None
    assert "RuntimeError" in status.error and t.last_window.stop_reason == "error"
    with pytest.raises(SpotTrainingError, match="RuntimeError"):
        t.raise_if_failed()


def test_spot_trained_drafter_gets_more_drafts_accepted(target, filled) -> None:
    untrained = EagleDrafter(target, target_id="tiny-spot", seed=1)
    t = trainer(target, filled, seed=1)
    accuracy_before = t.evaluate()
    run(t, 150)
    assert t.last_window.mean_loss is not None
    accuracy_after = t.evaluate()
    assert accuracy_before is not None and accuracy_after is not None
    assert accuracy_after > accuracy_before + 0.2, (accuracy_before, accuracy_after)
    trained = t.drafter_copy()
    assert not trained.training and trained.lm_head is target.lm_head  # shares, never copies
    before = mean_accepted_length(target, untrained)
    after = mean_accepted_length(target, trained)
    assert after > before + 0.3, (before, after)


def test_quality_gate_keeps_a_better_window_and_reverts_a_worse_one(target, filled) -> None:
    t = trainer(target, filled, seed=2)
    run(t, 150)
    better = t.judge_against_base()  # against the random initial weights
    assert better.keep and better.trained_top1 > better.base_top1 + 0.2, better
    # The fitted drafter becomes the base (as a merged version does), then a window wrecks it.
    t.load_weights(t.drafter_copy().trainable_state_dict(), base_version=0)
    fitted = {n: p.detach().clone() for n, p in t.drafter.named_parameters()}
    same = t.judge_against_base()
    assert same.keep and same.trained_top1 == same.base_top1  # nothing trained since the base
    for group in t.optimizer.param_groups:
        group["lr"] = 1.0
    run(t, 5)
    worse = t.judge_against_base()
    assert worse.pairs >= WindowVerdict.MIN_PAIRS, worse  # enough held-out data to judge
    assert not worse.keep and worse.trained_top1 < worse.base_top1 - 0.1, worse
    t.revert_to_base()
    for name, param in t.drafter.named_parameters():
        torch.testing.assert_close(param, fitted[name], rtol=0, atol=0)
    assert t.pairs_since_base == 0 and t.status().rejected_windows == 1
    assert to_wire(t.status())["rejectedWindows"] == 1
    assert t.judge_against_base().trained_top1 == same.base_top1


def test_quality_gate_needs_enough_held_out_pairs() -> None:
    few = WindowVerdict(trained_top1=0.1, base_top1=0.9, pairs=WindowVerdict.MIN_PAIRS - 1)
    enough = WindowVerdict(trained_top1=0.1, base_top1=0.9, pairs=WindowVerdict.MIN_PAIRS)
    assert few.keep and not enough.keep
    assert WindowVerdict(None, 0.9, 4096).keep and WindowVerdict(0.5, 0.5, 4096).keep
