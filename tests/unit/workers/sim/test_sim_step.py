"""The step simulator's event logic on hand-computed cases (constant-latency profiles)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from longtail_api.policies import HarvestSpec, SelectorSpec, SpeculativeSpec, StrategySpec
from longtail_api.profile import EngineProfile, ModelShape, Overheads, StepPoint
from longtail_workers.sim.step import JobShape, compare, simulate_step

DECODE_S, VERIFY_S, DRAFT_S = 0.1, 0.2, 0.01
SHAPE = ModelShape(8, 1, 1, 1, 16, 32, 1000, "float32")


def flat_profile() -> EngineProfile:
    """Every call costs the same whatever the batch or context (hand-computable)."""
    return EngineProfile(
        source="measured",
        device="test",
        engine="torch",
        model=SHAPE,
        decode=[StepPoint(1, 0, 1, DECODE_S)],
        verify=[StepPoint(1, 0, 2, VERIFY_S)],
        draft=[StepPoint(1, 0, 1, DRAFT_S)],
        prefill_tokens_per_s=100.0,
        drafter_train_tokens_per_s=1000.0,
        trainer_seconds_per_token=0.001,
    )


NO_SD = SpeculativeSpec(enabled=False)
NO_HARVEST = HarvestSpec(enabled=False)


def sd(threshold: int, warmup: int = 0, depth: int = 2) -> SpeculativeSpec:
    return SpeculativeSpec(
        batch_threshold=threshold,
        warmup_steps=warmup,
        strategies=[StrategySpec(draft_depth=depth)],
        selector=SelectorSpec(type="fixed"),
    )


def shape(**kw: object) -> JobShape:
    base: dict[str, object] = dict(
        rollout_workers=1, gpus_per_worker=1, prompts=1, group=4, max_running=4,
        prompt_tokens=0, speculative=NO_SD, harvest=NO_HARVEST,
    )  # fmt: skip
    base.update(kw)
    return JobShape(**base)  # type: ignore[arg-type]


def test_one_worker_fixed_lengths_whole_batch() -> None:
    # prefill 4 x 10 tokens at 100 tok/s = 0.4 s and the first token of each; the longest
    # answer's other 4 tokens take 4 decode steps = 0.4 s; trainer: 15 response + 4 x 10 prompt
    # tokens x 1 ms; sync 0.5 s.
    r = simulate_step(shape(prompt_tokens=10, weight_sync_s=0.5), [3, 5, 5, 2], flat_profile())
    assert r.rollout_s == pytest.approx(0.8)
    assert r.response_tokens == 15
    assert r.trainer_s == pytest.approx(0.055)
    assert r.step_s == pytest.approx(0.8 + 0.055 + 0.5)
    assert r.tail_s == 0 and r.idle_gpu_s == 0 and r.source == "measured"


def test_continuous_batching_admits_as_answers_finish() -> None:
    # max_running 2, prompt 10 tokens (0.1 s prefill each, first token included): prefill A,B
    # (t=0.2) -> 2 steps (A done at 3, t=0.4) -> prefill C (0.5) -> 2 steps (B done at 5, C at 3,
    # 0.7) -> prefill D (0.8) -> 1 step (D done at 2, C at 4, 0.9) -> 1 step (C done, 1.0).
    r = simulate_step(shape(prompt_tokens=10, max_running=2), [3, 5, 5, 2], flat_profile())
    assert r.rollout_s == pytest.approx(1.0)
    assert r.workers[0].decode_steps == 6
    kinds = [s.kind for s in r.segments]
    assert kinds == ["prefill", "decode", "prefill", "decode", "prefill", "decode"]


def test_tail_of_one_long_answer() -> None:
    # Two workers, one answer each, free prefill (its first token included): 9 steps vs 1 step
    # of 0.1 s; 2 GPUs per worker.
    s = shape(rollout_workers=2, gpus_per_worker=2, prompts=2, group=1)
    r = simulate_step(s, [10, 2], flat_profile())
    assert [w.done_s for w in r.workers] == pytest.approx([0.9, 0.1])
    assert r.first_done_s == pytest.approx(0.1)
    assert r.tail_s == pytest.approx(0.8)
    assert r.idle_gpu_s == pytest.approx(0.8 * 2)
    assert r.harvested_gpu_s == 0
    idle = [seg for seg in r.segments if seg.kind == "idle"]
    assert [(seg.worker, seg.start, seg.end) for seg in idle] == [
        (1, pytest.approx(0.1), pytest.approx(0.9))
    ]


def test_whole_groups_are_dealt_round_robin() -> None:
    # 3 prompts x 2 answers on 2 workers: worker 0 gets prompts 0 and 2 (longest 3 tokens: 2
    # decode steps after the prefill's), worker 1 prompt 1 (7 tokens: 6 steps).
    s = shape(rollout_workers=2, prompts=3, group=2)
    r = simulate_step(s, [1, 1, 7, 7, 3, 3], flat_profile())
    assert [w.answers for w in r.workers] == [4, 2]
    assert [w.done_s for w in r.workers] == pytest.approx([0.2, 0.6])


@pytest.mark.parametrize(
    ("idle_seconds", "harvested"), [(0.0, 0.8), (0.3, 0.5), (0.8, 0.0), (1.0, 0.0)]
)
def test_harvest_window_starts_after_idle_seconds(idle_seconds: float, harvested: float) -> None:
    s = shape(rollout_workers=2, gpus_per_worker=2, prompts=2, group=1,
              harvest=HarvestSpec(idle_seconds=idle_seconds))  # fmt: skip
    r = simulate_step(s, [10, 2], flat_profile())
    assert r.idle_gpu_s == pytest.approx(1.6)
    assert r.harvested_gpu_s == pytest.approx(harvested * 2)
    assert r.drafter_train_tokens == pytest.approx(harvested * 1000.0)
    if harvested:
        (h,) = [seg for seg in r.segments if seg.kind == "harvest"]
        assert (h.start, h.end) == (pytest.approx(0.1 + idle_seconds), pytest.approx(0.9))


def test_harvest_ignores_ineligible_roles() -> None:
    s = shape(rollout_workers=2, prompts=2, group=1,
              harvest=HarvestSpec(idle_seconds=0.0, eligible_roles=["trainer"]))  # fmt: skip
    assert simulate_step(s, [10, 2], flat_profile()).harvested_gpu_s == 0


def test_sd_switches_on_when_running_batch_reaches_threshold() -> None:
    # Lengths 1, 2, 20, 20 with threshold 2: the prefill gives every answer its first token (A
    # is done); decode at 3 running (B done); at 2 running SD is on (warm-up 0). C and D then
    # hold 2 tokens and gain 3 per SD step (accepted length 3): 6 SD steps of 2 drafts + 1 verify.
    r = simulate_step(shape(speculative=sd(2), accepted_length=3.0), [1, 2, 20, 20], flat_profile())
    w = r.workers[0]
    assert (w.decode_steps, w.speculative_steps) == (1, 6)
    assert r.rollout_s == pytest.approx(DECODE_S + 6 * (2 * DRAFT_S + VERIFY_S))
    assert [(s.kind, s.end) for s in r.segments] == [
        ("decode", pytest.approx(0.1)),
        ("speculative", pytest.approx(r.rollout_s)),
    ]


def test_switching_sd_on_pays_the_drafters_catch_up() -> None:
    # As above, with the drafter reading 100 response tokens/s: at the switch C and D hold 2
    # tokens each, so the first SD step costs 4 / 100 s more; later SD steps nothing more.
    profile = dataclasses.replace(flat_profile(), drafter_catch_up_tokens_per_s=100.0)
    r = simulate_step(shape(speculative=sd(2), accepted_length=3.0), [1, 2, 20, 20], profile)
    assert r.rollout_s == pytest.approx(DECODE_S + 0.04 + 6 * (2 * DRAFT_S + VERIFY_S))
    # a drafter context window of 1 pair caps what it reads at 1 token a row
    s = shape(speculative=dataclasses.replace(sd(2), drafter_context_window=1), accepted_length=3.0)
    r = simulate_step(s, [1, 2, 20, 20], profile)
    assert r.rollout_s == pytest.approx(DECODE_S + 0.02 + 6 * (2 * DRAFT_S + VERIFY_S))


def test_sd_warmup_delays_the_switch() -> None:
    # Warm-up 1: one more plain step at 2 running (C, D at 3), then 17 tokens at 3 per step.
    r = simulate_step(
        shape(speculative=sd(2, warmup=1), accepted_length=3.0), [1, 2, 20, 20], flat_profile()
    )
    assert (r.workers[0].decode_steps, r.workers[0].speculative_steps) == (2, 6)
    assert r.response_tokens == 43


def test_fractional_accepted_length_accumulates() -> None:
    # One answer of 10 tokens, threshold 1: 1 from the prefill, then gains 2.5 -> 2, 3, 2, (2).
    s = shape(group=1, speculative=sd(1, depth=4), accepted_length=2.5)
    r = simulate_step(s, [10], flat_profile())
    assert r.workers[0].speculative_steps == 4


def test_accepted_length_is_capped_by_depth() -> None:
    s = shape(group=1, speculative=sd(1, depth=1), accepted_length=5.0)
    r = simulate_step(s, [10], flat_profile())
    assert r.workers[0].speculative_steps == 5  # at most depth + 1 = 2 tokens a step


def test_a_full_kv_cache_holds_answers_back_and_preempts_the_newest() -> None:
    # Capacity 5 tokens, free prompts: A and B (4 tokens each) are admitted (1 token each after
    # the prefill); after 2 steps they hold 3 + 3 = 6 > 5, so B (the newest) is preempted with 3
    # tokens. A alone (3 tokens) leaves no room for B's 3 + 1; A finishes after one more step.
    # B is then prefilled again (3 tokens at 100 tok/s = 0.03 s), which samples its last token.
    profile = dataclasses.replace(flat_profile(), kv_cache_tokens=5)
    r = simulate_step(shape(group=2), [4, 4], profile)
    w = r.workers[0]
    assert (w.decode_steps, w.preempted, w.tokens) == (3, 1, 8)
    assert r.preempted == 1
    assert r.rollout_s == pytest.approx(3 * DECODE_S + 0.03)
    assert [seg.kind for seg in r.segments] == ["decode", "prefill"]
    unbounded = simulate_step(shape(group=2), [4, 4], flat_profile())
    assert unbounded.preempted == 0 and unbounded.rollout_s == pytest.approx(3 * DECODE_S)


def context_profile(engine: str, device: str = "cpu (test)") -> EngineProfile:
    """A decode step costs 1 ms per token of context (points at 100 and 200, linear between)."""
    return dataclasses.replace(
        flat_profile(),
        engine=engine,
        device=device,
        decode=[StepPoint(1, 100, 1, 0.1), StepPoint(1, 200, 1, 0.2)],
    )


@pytest.mark.parametrize(
    ("engine", "decode_s"),
    [
        # torch pads every row to the longest: 150 + 1 tokens, then (the 150-token prompt's
        # answer done after its one step) the other's 100 + 2, 100 + 3.
        ("torch", 0.151 + 0.102 + 0.103),
        # vLLM reads each row's own tokens: the mean (150 + 100) / 2 + 1, then 102, 103.
        ("vllm", 0.126 + 0.102 + 0.103),
        # So does the torch engine on a GPU (its Triton kernel reads each row's real length).
        ("torch on a GPU", 0.126 + 0.102 + 0.103),
    ],
)
def test_context_is_the_longest_row_for_a_padded_engine(engine: str, decode_s: float) -> None:
    # two prompts of 150 and 100 tokens, one answer each (2 and 4 tokens): prefill 250 tokens
    # at 100 tok/s = 2.5 s and the first token of each, then 3 decode steps.
    s = shape(prompts=2, group=1, prompt_tokens=0)
    profile = (
        context_profile("torch", device="NVIDIA H100 80GB HBM3")
        if engine == "torch on a GPU"
        else context_profile(engine)
    )
    r = simulate_step(s, [2, 4], profile, prompts=[150, 100])
    assert r.rollout_s == pytest.approx(2.5 + decode_s)
    assert r.workers[0].decode_steps == 3
    assert r.trainer_s == pytest.approx((6 + 250) * 0.001)  # the update reads each prompt
    with pytest.raises(ValueError, match="prompt lengths: give 2"):
        simulate_step(s, [2, 4], profile, prompts=[150])


OVERHEADS = Overheads(
    call_s=0.05, engine_step_s=0.01, engine_warmup_s=0.3, trainer_warmup_s=0.2, merge_s=0.4,
    merge_candidate_s=0.1,
)  # fmt: skip


@pytest.mark.parametrize("first", [False, True])
def test_overheads_are_charged_per_call_per_step_and_on_the_first_step(first: bool) -> None:
    # Worker 0: prompt 0 (2 tokens: the prefill's + 1 decode step), worker 1: prompt 1 (10
    # tokens: 9 steps). Each step costs 0.01 s more, each call 0.05 s at its end, the first
    # step's call 0.3 s at its start; its update 0.2 s more.
    profile = dataclasses.replace(flat_profile(), overheads=OVERHEADS)
    s = shape(rollout_workers=2, prompts=2, group=1)
    plain = simulate_step(s, [2, 10], flat_profile())
    r = simulate_step(s, [2, 10], profile, first=first)
    warm = 0.3 if first else 0.0
    assert [w.done_s for w in r.workers] == pytest.approx(
        [w.done_s + warm + 0.01 * w.decode_steps + 0.05 for w in plain.workers]
    )
    assert r.trainer_s == pytest.approx(plain.trainer_s + (0.2 if first else 0.0))
    assert r.merge_s == 0.0  # no harvest: no candidate to merge
    kinds = [seg.kind for seg in r.segments if seg.worker == 1]
    assert kinds == ["overhead"] * first + ["decode", "overhead"]  # empty prompts: no prefill


def test_a_step_that_harvested_pays_the_merge_of_one_candidate_per_harvested_worker() -> None:
    # 3 workers, one long answer: two run dry and are harvested, so two candidates merge.
    profile = dataclasses.replace(flat_profile(), overheads=OVERHEADS)
    s = shape(rollout_workers=3, prompts=3, group=1, harvest=HarvestSpec(idle_seconds=0.0))
    base, longtail = compare(s, [10, 2, 2], profile)
    assert base.merge_s == 0.0
    assert longtail.merge_s == pytest.approx(0.4 + 0.1)
    assert longtail.step_s == pytest.approx(
        longtail.rollout_s + longtail.trainer_s + longtail.weight_sync_s + 0.5
    )


def test_compare_baseline_has_no_sd_and_no_harvest() -> None:
    s = shape(rollout_workers=2, prompts=2, group=1, speculative=sd(1), accepted_length=3.0,
              harvest=HarvestSpec(idle_seconds=0.0))  # fmt: skip
    base, lt = compare(s, [10, 2], flat_profile())
    assert base.workers[0].speculative_steps == 0 and base.harvested_gpu_s == 0
    assert lt.workers[0].speculative_steps > 0 and lt.harvested_gpu_s > 0


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(ValueError, match="3 response lengths"):
        simulate_step(shape(), [1, 2, 3], flat_profile())
    with pytest.raises(ValueError, match="accepted_length"):
        shape(accepted_length=0.5)
    with pytest.raises(ValueError, match="max_running"):
        shape(max_running=0)


def test_simulator_imports_no_torch() -> None:
    code = (
        "import sys; import longtail_workers.sim.step, longtail_workers.sim.roofline; "
        "assert 'torch' not in sys.modules, 'the simulator must stay pure Python'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
