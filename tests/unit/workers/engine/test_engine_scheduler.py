"""Admission and prefill grouping: the FIFO scheduler and ``length_groups``.

``length_groups`` is checked against brute force over every contiguous split of the sorted
lengths (the cost model in its docstring), and the engine is checked to produce the same tokens
whether an admitted group is prefilled whole or split by length.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from tiny_targets import tiny_qwen2

from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.batch import SequenceState
from longtail_workers.engine.native.scheduler import Scheduler, length_groups
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine


def _cost(lengths: list[int], groups: list[list[int]], split_cost: int) -> int:
    return sum(split_cost + len(g) * max(lengths[i] for i in g) for g in groups)


def _brute_force(lengths: list[int], split_cost: int) -> int:
    ls = sorted(lengths)
    n = len(ls)
    best = None
    for k in range(n):
        for cuts in itertools.combinations(range(1, n), k):
            bounds = [0, *cuts, n]
            cost = sum(split_cost + (b - a) * ls[b - 1] for a, b in itertools.pairwise(bounds))
            best = cost if best is None else min(best, cost)
    assert best is not None
    return best


@pytest.mark.parametrize("split_cost", [0, 5, 20, 1000])
@pytest.mark.parametrize("seed", range(6))
def test_length_groups_is_optimal_and_a_partition(split_cost: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 60, (8,), generator=gen).tolist()
    groups = length_groups(lengths, split_cost)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert _cost(lengths, groups, split_cost) == _brute_force(lengths, split_cost)
    widths = [max(lengths[i] for i in g) for g in groups]
    assert widths == sorted(widths)  # shortest prompts first


def test_length_groups_extremes_and_the_builtin_batch() -> None:
    lengths = [3, 9, 3, 9, 27]
    assert len(length_groups(lengths, 10**6)) == 1  # splitting never pays
    assert sorted(sorted(g) for g in length_groups(lengths, 0)) == [[0, 2], [1, 3], [4]]
    assert length_groups([], 64) == []
    # The built-in task's 64-prompt long-tail batch (bench/specdec.py): one group pads 5,312
    # tokens; the split keeps the padding under a third of that.
    builtin = [11] * 36 + [14] * 4 + [17] * 6 + [20] + [23] * 4 + [26] * 3
    builtin += [29, 32, 35, 35, 41, 56, 59, 59, 59, 83]
    groups = length_groups(builtin, 64)
    padded = sum(len(g) * max(builtin[i] for i in g) for g in groups)
    assert 64 * 83 == 5312 and padded < 5312 / 3
    with pytest.raises(ValueError, match="split_cost=-1"):
        length_groups(builtin, -1)


def test_scheduler_admits_fifo_within_slots_and_budget() -> None:
    def seq(i: int, n: int) -> SequenceState:
        req = GenerationRequest([1] * n, max_new_tokens=1)
        return SequenceState(
            index=i,
            request=req,
            seed=0,
            keep_hidden=False,
            prompt=[1] * n,
        )

    sched = Scheduler(max_running=3, max_prefill_tokens=20)
    sched.add([seq(0, 4), seq(1, 8), seq(2, 4), seq(3, 30)])
    first = sched.admit(running=0)
    assert [s.index for s in first] == [0, 1]  # a third prompt would pad 3 x 8 = 24 > 20
    assert [s.index for s in sched.admit(running=2)] == [2]
    assert sched.admit(running=3) == []  # no free slot
    assert [s.index for s in sched.admit(running=0)] == [3]  # over budget, but never starved
    with pytest.raises(ValueError, match="max_running=0"):
        Scheduler(0, 10)


def test_split_prefill_gives_the_same_tokens_as_one_group() -> None:
    torch.set_num_threads(1)
    model = tiny_qwen2(seed=3, vocab_size=40, sharpness=8.0, dtype=torch.float64)
    gen = torch.Generator().manual_seed(5)
    lengths = [2, 2, 3, 3, 3, 9, 17, 30]
    reqs = [
        GenerationRequest(
            torch.randint(0, 40, (n,), generator=gen).tolist(),
            max_new_tokens=6 + i,
            temperature=0.8,
            seed=50 + i,
        )
        for i, n in enumerate(lengths)
    ]
    whole = TorchEngine(model, config=EngineConfig(prefill_split_cost=10**6))
    split = TorchEngine(model, config=EngineConfig(prefill_split_cost=0))
    a, b = whole.generate(reqs), split.generate(reqs)
    assert whole.stats.prefill_steps == 1
    assert split.stats.prefill_steps == len(set(lengths))
    for x, y in zip(a, b, strict=True):
        assert x.output_token_ids == y.output_token_ids
        assert x.output_logprobs == pytest.approx(y.output_logprobs, abs=1e-9)


def test_engine_config_errors_name_the_field() -> None:
    model = tiny_qwen2(seed=3, vocab_size=40, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"EngineConfig\.prefill_split_cost=-1"):
        TorchEngine(model, config=EngineConfig(prefill_split_cost=-1))
    with pytest.raises(ValueError, match=r"EngineConfig\.drafter_context_window=0"):
        TorchEngine(model, config=EngineConfig(drafter_context_window=0))
