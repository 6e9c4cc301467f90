"""``longtail profile`` on micro random models: the file it writes, its curves, its refusals."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from tiny_targets import tiny_qwen2

from longtail_api.policies import HistorySpec
from longtail_api.profile import EngineProfile
from longtail_cli.main import main
from longtail_workers.engine.native.history import HistoryIndex
from longtail_workers.engine.native.torch_engine import EngineConfig
from longtail_workers.engine.target import TargetModel
from longtail_workers.profile import history_costs
from longtail_workers.profile.calls import CallShape, call_costs
from longtail_workers.profile.engine_steps import catch_up_tokens_per_s, engine_curves, step_config
from longtail_workers.profile.forwards import StepGrid, capped_contexts, step_curves
from longtail_workers.profile.merge import merge_costs
from longtail_workers.profile.models import make_drafter
from longtail_workers.profile.timing import Repeats


def test_quick_profile_writes_a_valid_file(tmp_path: Path, capsys) -> None:
    out = tmp_path / "p.json"
    args = ["profile", "--shape", "micro", "--quick", "--device", "cpu", "--threads", "1"]
    code = main([*args, "--batches", "1,3", "--contexts", "8,24", "--out", str(out),
                 "--history-accepted-length", "2", "--hybrid-history-share", "0.3"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    profile = EngineProfile.read(out)
    assert (profile.source, profile.engine, profile.model.hidden_size) == ("measured", "torch", 64)
    assert profile.device.startswith("cpu")
    for curve in (profile.decode, profile.verify, profile.draft):
        assert {(p.batch, p.context) for p in curve} == {(b, c) for b in (1, 3) for c in (8, 24)}
        assert all(p.seconds > 0 for p in curve)
    assert {p.tokens for p in profile.decode} == {1}
    assert {p.tokens for p in profile.verify} == {5}  # the quick preset's depth 4, plus one
    assert profile.prefill_tokens_per_s > 0
    assert profile.drafter_train_tokens_per_s > 0
    assert profile.trainer_seconds_per_token > 0
    # Whole engine steps: plain decode at every point, speculative ones at k + 1 = 5 tokens.
    assert {(p.batch, p.context, p.tokens) for p in profile.speculative} == {
        (b, c, 5) for b in (1, 3) for c in (8, 24)
    }
    # The history drafter: history-only steps through the engine at the same points, one
    # row's proposal per context and depth, and the accepted lengths the steps were timed at.
    assert {(p.batch, p.context, p.tokens) for p in profile.history_speculative} == {
        (b, c, 5) for b in (1, 3) for c in (8, 24)
    }
    assert all(p.seconds > 0 for p in profile.history_speculative)
    assert {(p.batch, p.context, p.tokens) for p in profile.history_propose} == {
        (1, 8, 4), (1, 24, 4)
    }  # fmt: skip
    assert profile.accepted_length == {"learned": 3.0, "history": 2.0}
    assert profile.hybrid_history_share == 0.3 and profile.hybrid_history_accepted_length == 2.5
    assert profile.weight_sync_s > 0
    # The weight sync's phases, both transports, measured here (sim/sync.py charges them).
    sync = profile.weight_sync
    assert sync is not None and sync.version_bytes > 0 and sync.gather_bytes_per_s is None
    rates = ("http_pack", "http_pull", "load", "broadcast_pack", "broadcast_wire")
    for name in (f"{r}_bytes_per_s" for r in rates):
        assert (getattr(sync, name) or 0) > 0 and sync.sources[name].startswith("measured"), name
    # What a step costs beyond those, through the real worker service, update and registry.
    extra = profile.overheads
    assert extra is not None and extra.call_s > 0 and extra.merge_s > 0
    assert extra.engine_step_s >= 0 and extra.engine_warmup_s >= 0 and extra.trainer_warmup_s >= 0
    assert "wrote" in capsys.readouterr().out


def test_call_costs_separate_the_per_call_and_per_step_parts() -> None:
    """A real rollout worker served over HTTP: the short and the long call's time outside the
    engine's steps give a per-call part and a per-step part; both are small beside a step."""
    torch.set_num_threads(1)
    model = tiny_qwen2(seed=1, vocab_size=64, hidden_size=32, intermediate_size=64)
    drafter = make_drafter(model, "micro", 0, "longtail")
    gen = torch.Generator().manual_seed(0)
    shape = CallShape(batch=6, prompt=8, longest=48)
    assert shape.budgets() == [3, 5, 9, 16, 28, 48] and shape.budgets(0.25)[-1] == 12
    costs = call_costs(model, drafter, shape, repeats=1, gen=gen)
    assert costs.call_s > 0 and costs.step_s >= 0 and costs.warmup_s >= 0
    assert costs.call_s < 1.0 and costs.step_s < 0.05


def test_merge_costs_time_the_registry_path_with_its_checks() -> None:
    torch.set_num_threads(1)
    model = tiny_qwen2(seed=1, vocab_size=64, hidden_size=32, intermediate_size=64)
    drafter = make_drafter(model, "micro", 0, "longtail")
    gen = torch.Generator().manual_seed(0)
    costs = merge_costs(model, drafter, [(8, 40)] * 16, repeats=1, gen=gen)
    assert costs.merge_s > 0 and costs.per_candidate_s >= 0


def test_engine_steps_can_be_timed_beside_neighbour_engines(tmp_path: Path, capsys) -> None:
    out = tmp_path / "p.json"
    args = ["profile", "--shape", "micro", "--quick", "--device", "cpu", "--threads", "1",
            "--concurrent", "2", "--batches", "2", "--contexts", "8",
            "--out", str(out)]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    profile = EngineProfile.read(out)
    assert profile.device.endswith("2 engines side by side")
    assert len(profile.decode) == 1 and profile.decode[0].seconds > 0
    assert main([*args[:-2], "--concurrent", "0", "--out", str(out)]) == 2
    assert "--concurrent 0: must be >= 1" in capsys.readouterr().err


def test_every_batch_context_and_depth_is_timed() -> None:
    policy = tiny_qwen2(max_position_embeddings=64)
    target, drafter = TargetModel(policy), make_drafter(policy, "tiny", seed=0)
    grid = StepGrid(batches=(1, 2, 5), contexts=(4, 16), depths=(1, 3))
    lines: list[str] = []
    curves = step_curves(
        target, drafter, grid, Repeats(warmup=0, repeats=1), torch.Generator(), lines.append
    )
    points = {(b, c) for b in grid.batches for c in grid.contexts}
    assert {(p.batch, p.context) for p in curves.decode} == points
    assert {(p.batch, p.context, p.tokens) for p in curves.verify} == {
        (b, c, k + 1) for b, c in points for k in grid.depths
    }
    assert {(p.batch, p.context) for p in curves.draft} == points
    assert len(lines) == len(points)
    assert all(p.seconds > 0 for p in curves.decode + curves.verify + curves.draft)


def test_contexts_are_capped_by_the_model_positions() -> None:
    assert capped_contexts([128, 512, 2048], 2048, [2, 8]) == (128, 512, 2039)
    assert capped_contexts([64, 16], None, [4]) == (16, 64)
    with pytest.raises(ValueError, match="--depths 8"):
        capped_contexts([4], 8, [8])


@pytest.mark.parametrize("models", [[], ["--model", "builtin:tiny", "--shape", "micro"]])
def test_exactly_one_model_source(tmp_path: Path, capsys, models: list[str]) -> None:
    out = tmp_path / "p.json"
    assert main(["profile", *models, "--device", "cpu", "--out", str(out)]) == 2
    assert "give exactly one of --model" in capsys.readouterr().err
    assert not out.exists()


def test_a_point_larger_than_the_default_prefill_budget_runs_at_its_full_batch() -> None:
    # 64 prompts of 1,024 tokens are four of the engine's default prefill groups: admitted one
    # group a step, the first rows finished before the batch was ever full (found on an H200 at
    # batch 256, context 2,048).
    policy = tiny_qwen2(max_position_embeddings=1100)
    drafter = make_drafter(policy, "tiny", seed=0)
    grid = StepGrid(batches=(64,), contexts=(1024,), depths=(2,))
    curves = engine_curves(policy, drafter, grid, 6, torch.Generator(), lambda _: None)
    assert [(p.batch, p.context) for p in curves.decode] == [(64, 1024)]
    assert [(p.batch, p.tokens) for p in curves.speculative] == [(64, 3)]
    assert step_config(64, 1024).max_prefill_tokens >= 64 * 1024
    assert step_config(1, 8).max_prefill_tokens == EngineConfig.max_prefill_tokens


def test_the_drafters_catch_up_is_timed_when_sd_switches_on() -> None:
    # 8 answers of which 4 stop at 48 tokens: SD (threshold 4) switches on and its first step
    # reads 4 x 48 response pairs, far more than the 4 x 3 of the next ones: a positive excess.
    policy = tiny_qwen2(max_position_embeddings=128)
    drafter = make_drafter(policy, "tiny", seed=0)
    gen = torch.Generator().manual_seed(0)
    rate = catch_up_tokens_per_s(policy, drafter, 4, 8, 48, 4, 3, gen, accepted_drafts=2)
    assert rate is not None and rate > 0


def test_history_proposals_are_timed_on_an_index_where_rows_find_matches() -> None:
    # The synthetic group shares most of its text, so most rows' lookups find a match (the
    # walk the engine pays for), and every (context, depth) gets one per-row point.
    rng = random.Random(0)
    solution = history_costs._solution(rng, 300)
    index = HistoryIndex(HistorySpec())
    for tokens in history_costs._answers(rng, solution, 8):
        done = index.admit([1, 2, 3])
        index.extend(done, tokens)
        index.finish(done)
    rows = []
    for tokens in history_costs._answers(rng, solution, 8):
        rows.append(index.admit([1, 2, 3]))
        index.extend(rows[-1], tokens[:200])
    matched = [index.propose(row, 4)[1] >= HistorySpec().hybrid_min_match for row in rows]
    assert sum(matched) >= len(rows) // 2
    points = history_costs.propose_points((16, 64), (2, 4), group=4, rounds=3)
    assert [(p.batch, p.context, p.tokens) for p in points] == [
        (1, 16, 2), (1, 16, 4), (1, 64, 2), (1, 64, 4)
    ]  # fmt: skip
    assert all(p.seconds > 0 for p in points)
    with pytest.raises(ValueError, match="context=0"):
        history_costs.propose_seconds(0, 2, 4, 3)
