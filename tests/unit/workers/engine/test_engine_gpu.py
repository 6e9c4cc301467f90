"""GPU checks of the native torch engine: CUDA graph replay, SD, the Triton backend, memory budget.

Run on a CUDA machine by ``bench/gpu/run.sh`` (``pytest -m gpu``); every test is marked ``gpu``
and skipped where torch sees no CUDA device, so the CPU suite only collects them. The targets are
the tiny random Qwen2s of ``tests/doubles/tiny_targets.py`` moved to the GPU, with a random
EAGLE drafter (equality tests need no useful drafts). Float32 targets with a sharp LM head keep
batched-shape rounding from flipping a greedy near-tie; the bf16 test checks that a Qwen2-1.5B
-shaped layer stack runs. ``LONGTAIL_GPU_TEST_DEVICE=cpu TRITON_INTERPRET=1`` runs them on CPU
(eagerly; CUDA-only assertions skipped) to check the tests themselves without a GPU.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import pytest
import torch
from tiny_targets import tiny_qwen2

from longtail_api.policies import SelectorSpec, SpeculativeSpec, StrategySpec
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.interface import GenerationRequest, GenerationResult
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
from longtail_workers.engine.stats import RolloutStats, StepRecord

DEVICE = torch.device(os.environ.get("LONGTAIL_GPU_TEST_DEVICE", "cuda"))
CUDA = DEVICE.type == "cuda"
VOCAB = 48
BUCKETS = (1, 2, 4, 8)
# Graph and eager engines run the same kernels, but cuBLAS may pick another algorithm inside a
# capture: a last-bits tolerance (a wrong row, position or cache slot moves log-probs far more).
LOGPROB_ABS = 1e-5

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(CUDA and not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    model = tiny_qwen2(seed=4, vocab_size=VOCAB, sharpness=30.0, dtype=torch.float32)
    return model.to(DEVICE)


@pytest.fixture(scope="module")
def drafter(target: torch.nn.Module) -> EagleDrafter:
    return EagleDrafter(target, target_id="tiny-gpu", seed=1)


def _spec(
    depths: tuple[int, ...] = (3,), selector: str = "fixed", threshold: int = 1024, warmup: int = 0
) -> SpeculativeSpec:
    """SD on from the first step by default (a low ``threshold`` switches it on once the batch
    has shrunk: the drafter then catches up on every row's response so far in one wide feed);
    ``fixed`` keeps the depth schedule independent of step timings (the bandit's reward), so two
    engines take the same steps."""
    return SpeculativeSpec(
        enabled=True,
        batch_threshold=threshold,
        warmup_steps=warmup,
        strategies=[StrategySpec(draft_depth=d) for d in depths],
        selector=SelectorSpec(type=selector, buckets=[2, 4, 8]),
    )


def _requests(n: int = 20, sampled: bool = True) -> list[GenerationRequest]:
    """Mixed prompt lengths and budgets; with ``sampled``, every other request is seeded
    sampling (some with top-p) and the rest greedy."""
    gen = torch.Generator().manual_seed(42)
    out = []
    for i in range(n):
        prompt = torch.randint(0, VOCAB, (2 + (i * 7) % 19,), generator=gen).tolist()
        budget = (1, 3, 8, 17, 30)[i % 5]
        temperature = 1.0 if sampled and i % 2 else 0.0
        top_p = 0.9 if i % 4 == 3 else 1.0
        out.append(GenerationRequest(prompt, budget, temperature, top_p, seed=i, request_id=str(i)))
    return out


def _engine(model: torch.nn.Module, drafter: EagleDrafter | None, **config: object) -> TorchEngine:
    settings: dict[str, object] = {"max_running": 6, "batch_buckets": BUCKETS} | config
    cfg = EngineConfig(**settings)  # type: ignore[arg-type]
    spec = _spec() if drafter is not None else None
    return TorchEngine(model, config=cfg, speculative=spec, drafter=drafter)


@dataclass
class _Modes(RolloutStats):
    """The engine's statistics, keeping each decoding step's mode (``plain`` or ``sd``)."""

    modes: list[str] = field(default_factory=list)

    def record(self, step: StepRecord) -> None:
        super().record(step)
        if step.mode != "prefill":
            self.modes.append(step.mode)


def _switched_on_late(engine: TorchEngine) -> bool:
    """Whether SD started after some plain steps (a last token alone is always plain)."""
    assert isinstance(engine.stats, _Modes) and "sd" in engine.stats.modes
    return engine.stats.modes[0] == "plain"


def _captured(engine: TorchEngine) -> int:
    """CUDA graphs the engine holds (an eager engine drops its step runner after a call)."""
    return engine._graphs.captured if engine._graphs is not None else 0


def _assert_same(a: list[GenerationResult], b: list[GenerationResult], tol: float) -> None:
    for x, y in zip(a, b, strict=True):
        assert y.output_token_ids == x.output_token_ids, x.request_id
        assert y.finish_reason == x.finish_reason, x.request_id
        assert y.output_logprobs == pytest.approx(x.output_logprobs, abs=tol), x.request_id


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "sd"])
def test_graph_replay_equals_eager(target, drafter, speculative: bool) -> None:
    """More requests than rows (admission and retirement), greedy and seeded sampling: the
    captured steps reproduce the eager ones on the same backend and buckets."""
    d = drafter if speculative else None
    backend = "triton" if CUDA or os.environ.get("TRITON_INTERPRET") else "torch"
    eager = _engine(target, d, cuda_graphs=False, attention_backend=backend)
    graphs = _engine(target, d, cuda_graphs=True, attention_backend=backend)
    requests = _requests()
    _assert_same(eager.generate(requests), graphs.generate(requests), LOGPROB_ABS)
    assert _captured(eager) == 0
    if CUDA:
        assert _captured(graphs) > 0
    if speculative:
        assert graphs.stats.sd_steps > 0


@pytest.mark.parametrize("threshold", [1024, 3], ids=["sd-from-start", "sd-switching-on"])
def test_sd_equals_plain_greedy_with_graphs(target, drafter, threshold: int) -> None:
    requests = _requests(sampled=False)
    plain = _engine(target, None).generate(requests)
    engine = TorchEngine(
        target,
        config=EngineConfig(max_running=6, batch_buckets=BUCKETS),
        speculative=_spec((2, 4), "bandit", threshold, warmup=2 if threshold < 1024 else 0),
        drafter=drafter,
    )
    engine.stats = _Modes()
    # SD's verify scores several positions per row in one forward: other matmul shapes than
    # a decode step's, so log-probs agree to float32 rounding, not to the last bit.
    _assert_same(plain, engine.generate(requests), 1e-4)
    assert _switched_on_late(engine) == (threshold < 1024)
    assert _captured(engine) > 0 or not CUDA


def _history_spec(drafter: str, threshold: int = 1024) -> SpeculativeSpec:
    """One ``drafter`` strategy (``history`` or ``hybrid``) at depth 3, from the first step."""
    spec = _spec(threshold=threshold, warmup=0 if threshold == 1024 else 2)
    spec.strategies = [StrategySpec(draft_depth=3, drafter=drafter)]  # type: ignore[arg-type]
    spec.history.hybrid_min_match = 3
    return spec


@pytest.mark.parametrize("kind", ["history", "hybrid"])
def test_history_drafts_replay_equals_eager(target, drafter, kind: str) -> None:
    """The history proposals staged on the host (pinned buffer, non-blocking copy) are what
    the captured step reads, as the eager one does; every prompt is asked twice (a group)."""
    requests = _requests() * 2
    runs = []
    for graphs in (False, True):
        cfg = EngineConfig(max_running=6, batch_buckets=BUCKETS, cuda_graphs=graphs)
        learned = drafter if kind == "hybrid" else None
        engine = TorchEngine(target, config=cfg, speculative=_history_spec(kind), drafter=learned)
        runs.append((engine, engine.generate(requests)))
    (eager, a), (graphs, b) = runs
    _assert_same(a, b, LOGPROB_ABS)
    assert graphs.stats.source_sd_tokens["history"] > 0
    assert _captured(eager) == 0 and (_captured(graphs) > 0 or not CUDA)


@pytest.mark.parametrize("threshold", [1024, 3], ids=["sd-from-start", "sd-switching-on"])
def test_history_sd_without_a_drafter_equals_plain_greedy_with_graphs(target, threshold) -> None:
    requests = _requests(sampled=False) * 2
    plain = _engine(target, None).generate(requests)
    cfg = EngineConfig(max_running=6, batch_buckets=BUCKETS)
    engine = TorchEngine(target, config=cfg, speculative=_history_spec("history", threshold))
    engine.stats = _Modes()
    _assert_same(plain, engine.generate(requests), 1e-4)
    assert _switched_on_late(engine) == (threshold < 1024)
    assert engine.stats.source_mean_accepted_length("history") > 1.0
    assert _captured(engine) > 0 or not CUDA


@pytest.mark.skipif(
    not (CUDA or os.environ.get("TRITON_INTERPRET")), reason="the Triton backend needs CUDA"
)
def test_triton_backend_equals_torch_backend(target, drafter) -> None:
    requests = _requests(sampled=False)
    runs = [
        TorchEngine(
            target,
            config=EngineConfig(max_running=6, batch_buckets=BUCKETS, attention_backend=b),
            speculative=_spec(),
            drafter=drafter,
        )
        for b in ("torch", "triton")
    ]
    torch_out, triton_out = (e.generate(requests) for e in runs)
    _assert_same(torch_out, triton_out, 1e-4)
    assert runs[1].backend == "triton" and runs[1].stats.sd_steps > 0


def test_memory_stays_within_the_cache_budget() -> None:
    """With ``kv_cache_gb`` the engine caps its rows to the budget: ``buffer_bytes`` stays below
    it, and the peak device memory during ``generate`` grows by at most the budget plus
    ``slack``: the CUDA graph pool (each captured step's intermediates, small for this model),
    the per-step activations and logits, and cuBLAS workspaces (one per stream, and a capture
    runs on a side stream). Without the cap the engine would take a row per request, several
    times budget + slack, so the bound still tells the cap from its absence."""
    budget_gb, slack = 0.1, 256 << 20
    shape = {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "intermediate_size": 512}
    model = tiny_qwen2(
        seed=2, vocab_size=512, sharpness=10.0, max_position_embeddings=4096, **shape
    )
    model = model.to(DEVICE)
    drafter = EagleDrafter(model, target_id="tiny-budget", seed=3)
    cfg = EngineConfig(max_running=64, max_model_len=4096, kv_cache_gb=budget_gb)
    engine = TorchEngine(model, config=cfg, speculative=_spec(), drafter=drafter)
    gen = torch.Generator().manual_seed(0)
    requests = [
        GenerationRequest(torch.randint(0, 512, (50 + i,), generator=gen).tolist(), 40, seed=i)
        for i in range(32)
    ]
    if CUDA:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    results = engine.generate(requests)
    assert all(len(r.output_token_ids) == 40 for r in results)
    assert 0 < engine.buffer_bytes <= budget_gb * 2**30
    assert engine.row_shape is not None and engine.row_shape.capacity < len(requests)
    if CUDA:
        growth = torch.cuda.max_memory_allocated() - base
        assert growth <= budget_gb * 2**30 + slack, f"peak grew by {growth / 2**20:.0f} MiB"


@pytest.fixture(scope="module")
def qwen2_shaped() -> torch.nn.Module:
    """Qwen2-1.5B's layer shape (hidden 1536, 12 query and 2 KV heads of 128, its vocabulary)
    with 2 layers, bf16."""
    model = tiny_qwen2(seed=0, vocab_size=151936, hidden_size=1536, num_layers=2, num_heads=12,
                       num_kv_heads=2, intermediate_size=8960, dtype=torch.bfloat16,
                       max_position_embeddings=4096)  # fmt: skip
    return model.to(DEVICE)


@pytest.mark.skipif(not CUDA, reason="a bf16 1536-wide model is a GPU workload")
@pytest.mark.parametrize(
    "mode, short",
    [("plain", 24), ("sd-from-start", 24), ("sd-switching-on", 24), ("sd-switching-on", 100)],
    ids=["plain", "sd-from-start", "catch-up-24", "catch-up-100"],
)
def test_bf16_qwen2_shape_runs_with_graphs_and_triton(qwen2_shaped, mode: str, short: int) -> None:
    """Plain and speculative steps, captured, on the Triton backend. ``sd-switching-on``: SD
    starts when the two answers of ``short`` tokens end, and the drafter first catches up on
    about ``short`` pairs of every remaining row in one eager feed through the Triton kernel (a
    query tile that wide): the path a rollout takes when its batch shrinks to the threshold."""
    gen = torch.Generator().manual_seed(1)
    budgets = [short] * 2 + [short + 40] * 4
    prompts = [torch.randint(0, 151936, (100 + 37 * i,), generator=gen).tolist() for i in range(6)]
    requests = [
        GenerationRequest(p, n, temperature=0.0 if i % 2 else 1.0, seed=i)
        for i, (p, n) in enumerate(zip(prompts, budgets, strict=True))
    ]
    spec = {"plain": None, "sd-from-start": _spec((3, 5), "bandit"),
            "sd-switching-on": _spec((3, 5), "bandit", threshold=4, warmup=1)}[mode]  # fmt: skip
    drafter = EagleDrafter(qwen2_shaped, target_id="qwen2-1.5b-shape", seed=0) if spec else None
    cfg = EngineConfig(max_running=8, max_model_len=1024)
    engine = TorchEngine(qwen2_shaped, config=cfg, speculative=spec, drafter=drafter)
    engine.stats = _Modes()
    results = engine.generate(requests)
    assert engine.backend == "triton" and _captured(engine) > 0
    assert [len(r.output_token_ids) for r in results] == budgets
    assert all(math.isfinite(x) for r in results for x in r.output_logprobs)
    if spec is None:
        assert engine.stats.sd_steps == 0
    else:
        assert _switched_on_late(engine) == (mode == "sd-switching-on")
