"""A stop during a step's policy update abandons that step (issue #48 item 10).

The real :class:`~longtail_workers.trainer.driver.StepDriver` on a tiny policy (world 1), with a
rollout pool and a verifier that answer at once and a weight store as the publisher. The stop
(what SIGTERM or Ctrl-C sets) arrives in the middle of step 2's update, after its first
micro-batch: the driver abandons step 2, checkpoints step 1 and returns ``stopped``; the policy
and its checkpoint are step 1's, no row is written for step 2. Before the fix the update ran to
its end and step 2 was checkpointed as if the stop had come after it.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from tiny_targets import tiny_qwen2

from longtail_api.steprow import StepRow
from longtail_workers.data.records import Example
from longtail_workers.jobspec import load_job_spec
from longtail_workers.models.tokenizer import build_char_tokenizer
from longtail_workers.trainer.checkpoint import latest_checkpoint
from longtail_workers.trainer.dispatch import RolloutOutcome
from longtail_workers.trainer.driver import DriverConfig, StepDriver
from longtail_workers.weights.store import WeightStore
from longtail_workers.wire.rollout import Sample

REPO = Path(__file__).resolve().parents[4]


class InstantPool:
    """Every request answered at once with a fixed short answer."""

    def revive(self) -> None:
        pass

    def run(self, requests: list[Any], step: int, version: int, stop: threading.Event,
            group: int = 1, started: Any = None) -> RolloutOutcome:  # fmt: skip
        if started is not None:
            started()
        samples = [
            Sample(r.request_id, list(r.prompt_token_ids), [50 + i % 7, 51, 52], [-1.0, -1.2, -0.8])
            for i, r in enumerate(requests)
        ]
        return RolloutOutcome(samples, [], 0.01, 0.01)


class AlternatingVerifier:
    """Half the answers right: every group has a preference, so every update moves weights."""

    def verify(self, pairs: list[tuple[str, str]], **_: Any) -> SimpleNamespace:
        results = [SimpleNamespace(reward=float(i % 2), correct=bool(i % 2))
                   for i in range(len(pairs))]  # fmt: skip
        return SimpleNamespace(results=results)


def test_a_stop_mid_update_abandons_the_step_and_checkpoints_the_last_completed(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    spec = load_job_spec(str(REPO / "tests" / "e2e_local" / "ci-tiny.yaml"))
    algo = dataclasses.replace(spec.algorithm, total_steps=3, kl_coef=0.0)
    spec = dataclasses.replace(spec, algorithm=algo)
    tok = build_char_tokenizer()
    model = tiny_qwen2(vocab_size=len(tok))
    # Prompts long enough for several micro-batches of the job's 64 tokens per update.
    train = [Example(f"What is {i} plus one? Answer:", str(i + 1), i) for i in range(16)]
    config = DriverConfig(run_dir=tmp_path, checkpoint_dir=tmp_path / "checkpoints")
    rows: list[StepRow] = []
    weights: dict[int, dict[str, torch.Tensor]] = {}

    def on_row(row: StepRow) -> None:
        rows.append(row)
        weights[row.step] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    driver = StepDriver(spec, model, tok, train, [], InstantPool(), AlternatingVerifier(),  # type: ignore[arg-type]
                        WeightStore(keep_last=2), config, on_row=on_row)  # fmt: skip
    assert driver.train_cfg.micro_batch_tokens == 64  # the job's: several passes per update
    passes = [0]

    def stop_in_step_2(module: torch.nn.Module, args: Any) -> None:
        if module.training and driver.state.step == 1:  # step 2's update is running
            passes[0] += 1
            if passes[0] == 1:
                driver.stop.set()  # SIGTERM, after its first micro-batch began

    hook = model.register_forward_pre_hook(stop_in_step_2)
    try:
        assert driver.run(0) == "stopped"
    finally:
        hook.remove()
    assert passes[0] == 1  # no micro-batch ran after the stop
    assert [r.step for r in rows] == [1] and driver.state.step == 1
    assert driver.state.policy_version == 1  # nothing was published for step 2
    ckpt = latest_checkpoint(config.checkpoint_dir)
    assert ckpt is not None and ckpt.name.endswith("000001")
    for name, tensor in model.state_dict().items():  # the policy is step 1's, untouched
        assert torch.equal(tensor, weights[1][name]), name
    assert all(p.grad is None for p in model.parameters())
