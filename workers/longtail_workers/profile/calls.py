"""A generate call as the trainer makes it: what a rollout costs beyond the engine's own steps.

Called by :mod:`longtail_workers.profile.main` after the whole-step curves. The curves time the
engine's steps; a rollout also pays, once per generate call, the HTTP request and reply (the
answers encoded, sent and decoded: the trainer's ``RolloutPool._post`` path), the worker's
drafter refresh and its capture of every answer's hidden states for drafter training, and, per
engine step, the engine's work between the steps it times (admitting and retiring rows, moving
the last live rows into the holes, its loop). On a small model on CPU those add up to several
percent of a rollout (docs/performance.md, "Step simulator").

So the profiled model is served by a real rollout worker (``rollout/service.py``'s
``RolloutWorker`` behind its ``RolloutServer`` on a free port), and the trainer's client posts
calls of ``batch`` answers whose budgets are spread from short to long (rows retire all along,
as in a long-tailed step). A call's wall time less the sum of the engine's step records
(prefill, decode) is what the curves leave out; a long and a short call separate its per-call
part from its per-step part. The first call on the fresh engine, less the same call again, is
the engine's warm-up (buffer allocation, first-use kernels, CUDA-graph capture on a GPU): the
first RL step of a job pays it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from longtail_api.policies import DrafterTrainingSpec
from longtail_api.wirecodec import from_wire, to_wire
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import EngineConfig, TorchEngine
from longtail_workers.httpclient import http_json
from longtail_workers.profile.engine_steps import StepRecorder
from longtail_workers.rollout.control import RolloutWorker
from longtail_workers.rollout.http import ControlConfig
from longtail_workers.rollout.service import RolloutServer
from longtail_workers.wire.rollout import GENERATE_PATH, GenerateCall, GenerateReply

CALL_TIMEOUT_S = 600.0
"""One profiled call's limit (a long call of a large model on CPU takes minutes)."""


@dataclass(frozen=True)
class CallShape:
    """The calls timed: ``batch`` answers to prompts of ``prompt`` tokens, budgets spread
    geometrically from ``longest / 16`` to ``longest`` (the short call: a quarter of each)."""

    batch: int
    prompt: int
    longest: int

    def budgets(self, scale: float = 1.0) -> list[int]:
        """Each answer's ``max_new_tokens`` (no stop token: every answer runs its budget)."""
        lo, hi = self.longest / 16, self.longest
        n = max(1, self.batch - 1)
        return [max(2, round(scale * lo * (hi / lo) ** (i / n))) for i in range(self.batch)]


@dataclass(frozen=True)
class CallCosts:
    """What :func:`call_costs` measured (seconds)."""

    call_s: float
    """Per generate call beyond the engine's steps (transport, refresh, capture, assembly)."""
    step_s: float
    """Per engine step, the engine's work between the steps it times."""
    warmup_s: float
    """The first call on a fresh engine, beyond the same call on a warm one."""


def _requests(
    shape: CallShape, vocab: int, scale: float, gen: torch.Generator
) -> list[GenerationRequest]:
    prompt = torch.randint(0, vocab, (shape.prompt,), generator=gen).tolist()
    return [
        GenerationRequest(prompt, n, temperature=1.0, seed=i, request_id=f"p-{i}")
        for i, n in enumerate(shape.budgets(scale))
    ]


def _timed_call(
    url: str, recorder: StepRecorder, requests: Sequence[GenerationRequest], step: int
) -> tuple[float, float, int]:
    """``(wall s, s in the engine's step records, engine steps)`` of one call over HTTP."""
    recorder.records.clear()
    t0 = time.perf_counter()
    answer = http_json(url, to_wire(GenerateCall(step, 0, requests)), CALL_TIMEOUT_S, "POST")
    from_wire(GenerateReply, answer, "reply")  # decoded as the trainer decodes it
    wall = time.perf_counter() - t0
    inside = sum(r.latency_s for r in recorder.records)
    steps = sum(1 for r in recorder.records if r.mode != "prefill")
    return wall, inside, steps


def call_costs(
    model: nn.Module,
    drafter: EagleDrafter,
    shape: CallShape,
    repeats: int,
    gen: torch.Generator,
    training: DrafterTrainingSpec | None = None,
) -> CallCosts:
    """Serve ``model`` from a real rollout worker and time generate calls (module text)."""
    vocab = int(model.get_output_embeddings().out_features)  # type: ignore[operator]
    engine = TorchEngine(model, config=EngineConfig(max_running=max(256, shape.batch)))
    recorder = StepRecorder()
    engine.stats = recorder
    worker = RolloutWorker(
        engine,
        target_id="profile",
        name="profile-rollout",
        training=training or DrafterTrainingSpec(),  # enabled: every answer's states captured
        drafter=drafter,
        weights=None,
    )
    long, short = _requests(shape, vocab, 1.0, gen), _requests(shape, vocab, 0.25, gen)
    try:
        with RolloutServer(worker, ControlConfig(host="127.0.0.1", port=0)) as server:
            url = server.url + GENERATE_PATH
            first, _, _ = _timed_call(url, recorder, long, 1)
            timed: dict[str, list[tuple[float, float, int]]] = {"long": [], "short": []}
            for i in range(max(1, repeats)):
                timed["long"].append(_timed_call(url, recorder, long, 2 + 2 * i))
                timed["short"].append(_timed_call(url, recorder, short, 3 + 2 * i))
    finally:
        if worker.trainer is not None:
            worker.trainer.stop(timeout=5.0)
        engine.close()
    warm_long = statistics.median(w for w, _, _ in timed["long"])
    (out_l, n_l), (out_s, n_s) = (_outside(timed[k]) for k in ("long", "short"))
    step_s = max(0.0, (out_l - out_s) / (n_l - n_s)) if n_l > n_s else 0.0
    return CallCosts(
        call_s=max(0.0, out_s - step_s * n_s),
        step_s=step_s,
        warmup_s=max(0.0, first - warm_long),
    )


def _outside(calls: list[tuple[float, float, int]]) -> tuple[float, int]:
    """Median seconds outside the engine's step records, and the calls' engine steps."""
    return statistics.median(w - inside for w, inside, _ in calls), calls[0][2]
