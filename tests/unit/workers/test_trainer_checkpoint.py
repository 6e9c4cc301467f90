"""Trainer checkpoints (atomic, pruned, verified) and rollout results -> GRPO batch tensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_targets import tiny_qwen2

from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.torch_engine import TorchEngine
from longtail_workers.trainer.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from longtail_workers.trainer.grpo import sequence_logprobs
from longtail_workers.trainer.optim import TrainConfig, build_optimizer
from longtail_workers.trainer.rollout_batch import build_grpo_batch
from longtail_workers.wire.rollout import Sample


def _model(seed: int = 0) -> torch.nn.Module:
    return tiny_qwen2(seed=seed, vocab_size=32, hidden_size=32, intermediate_size=64)


def _save(root: Path, step: int, model: torch.nn.Module, keep: int = 2) -> Path:
    opt = build_optimizer(model, TrainConfig(learning_rate=1e-3))
    return save_checkpoint(root, step=step, model=model, optimizer=opt, policy_version=step,
                           drafter_version=-1, keep_last=keep, extra={"x": 1})  # fmt: skip


def test_save_load_round_trip_and_keep_last(tmp_path: Path) -> None:
    a, b = _model(0), _model(1)
    for step in (1, 2, 3):
        _save(tmp_path, step, a)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]  # keep_last=2
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "step-000003"
    opt = build_optimizer(b, TrainConfig(learning_rate=1e-3))
    state = load_checkpoint(latest, b, opt)
    assert state.step == 3 and state.policy_version == 3 and state.extra == {"x": 1}
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(),
                                                 strict=True))  # fmt: skip


def test_debris_of_a_crashed_write_is_ignored_and_cleaned(tmp_path: Path) -> None:
    model = _model()
    _save(tmp_path, 1, model)
    (tmp_path / ".tmp-dead").mkdir()  # a writer killed mid-checkpoint
    (tmp_path / "step-000009").mkdir()  # renamed dir without state.json never counts
    assert latest_checkpoint(tmp_path).name == "step-000001"  # type: ignore[union-attr]
    _save(tmp_path, 2, model)
    assert not (tmp_path / ".tmp-dead").exists()


def test_corrupt_weights_are_refused(tmp_path: Path) -> None:
    path = _save(tmp_path, 1, _model())
    state = json.loads((path / "state.json").read_text())
    state["model_sha256"] = "0" * 64
    (path / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(path, _model(), None)


def test_batch_from_engine_results_reproduces_rollout_logprobs() -> None:
    torch.set_num_threads(1)
    model = _model(3)
    engine = TorchEngine(model)
    results = engine.generate(
        [GenerationRequest([1, 2, 3][: 1 + i % 3], 8, seed=i) for i in range(5)]
    )
    batch = build_grpo_batch(results, [0.5, -0.5, 1.0, 0.0, -1.0], pad_id=0)
    assert batch.advantages.tolist() == [0.5, -0.5, 1.0, 0.0, -1.0]
    for row, r in enumerate(results):
        p, o = len(r.prompt_token_ids), len(r.output_token_ids)
        assert batch.response_mask[row].tolist() == [0] * p + [1] * o + [0] * (
            batch.input_ids.shape[1] - p - o
        )
    with torch.no_grad():
        lp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
    mask = batch.response_mask.bool()
    assert torch.allclose(lp[mask], batch.old_logprobs[mask], atol=1e-4)


def test_batch_rejects_inconsistent_samples() -> None:
    bad = Sample("x", [1, 2], [3, 4], [-0.1], "stop")
    with pytest.raises(ValueError, match="2 output tokens but 1 log-probs"):
        build_grpo_batch([bad], [1.0], pad_id=0)
    with pytest.raises(ValueError, match="one advantage per answer"):
        build_grpo_batch([bad], [1.0, 2.0], pad_id=0)
