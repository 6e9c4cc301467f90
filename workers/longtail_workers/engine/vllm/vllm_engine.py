"""The vLLM rollout engine: :class:`RolloutEngine` on a live ``vllm.LLM`` (rollout.engine: vllm).

Built by the rollout worker (``rollout/service.py``) when the job asks for vLLM, and by tests and
``bench/specdec_vllm.py``. The only modules that import vLLM are this one and ``vllm_ext.py``
(the methods vLLM's worker runs for us); an import contract keeps it so.

What vLLM does and what stays Longtail's:

* **Generation** is vLLM's: continuous batching, its EAGLE-1 speculative decoding (lossless
  rejection sampling) and its per-batch-size draft schedule, built from the job's
  ``speculative`` block by ``vllm_schedule.py``.
* **Policy versions** are loaded in place every step: the worker loads a version into its torch
  copy of the policy (same weight sources and checks as the torch engine), then
  :meth:`VllmEngine.policy_loaded` pushes that state into vLLM in buckets of
  ``spec.weightSync.bucketMB`` (``vllm_push.py``, ``vllm_ext``), so both hold the same version
  before the next rollout starts. All or nothing: a push that fails midway leaves the engine
  refusing to generate until a whole version has been pushed.
* **Drafter versions** trained online are hot-swapped with :meth:`VllmEngine.set_drafter`
  (exported to vLLM's EAGLE-1 names exactly; only ``fc``/``layers.0``, never the shared embedding).
* **The torch copy of the policy** stays resident: the spot drafter trainer trains against it
  (its embedding and LM head), and one forward of it over each finished answer gives what
  vLLM does not return exactly: the last-layer hidden states for drafter training and the
  log-probs of the interface's contract (temperature T, before top-p). vLLM's own
  ``processed_logprobs`` are post-top-p and, on speculative steps, not exactly the policy's
  (docs/performance.md, vLLM section), so GRPO's old log-probs come from the policy, as veRL
  recomputes them with its actor (docs/vllm.md).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

from longtail_api.policies import SpeculativeSpec
from longtail_workers.drafter.checkpoint import save_drafter
from longtail_workers.drafter.export import engine_tensors, export_drafter
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.engine.interface import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
)
from longtail_workers.engine.sampling import token_logprobs
from longtail_workers.engine.stats import RolloutMetrics, RolloutStats
from longtail_workers.engine.target import TargetModel, response_states
from longtail_workers.engine.vllm.vllm_logs import quiet_harmless_vllm_warnings
from longtail_workers.engine.vllm.vllm_push import PolicyPushError, push_policy
from longtail_workers.engine.vllm.vllm_schedule import VllmSchedule, vllm_schedule
from longtail_workers.weights.checksum import serialize_state_dict

log = logging.getLogger(__name__)
EXTENSION = "longtail_workers.engine.vllm.vllm_ext.LongtailWorkerExtension"
VllmDtype = Literal["float32", "bfloat16", "float16"]
DTYPE_NAMES: dict[torch.dtype, VllmDtype] = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}


@dataclass
class VllmEngineConfig:
    """Knobs of the vLLM engine that the RLJob does not set."""

    max_running: int = 256
    """vLLM's ``max_num_seqs``: most sequences in one engine step."""
    max_model_len: int | None = None
    """Longest prompt + answer; None: the model's ``max_position_embeddings``."""
    cpu_kv_cache_gib: int = 1
    """KV cache size on CPU (``VLLM_CPU_KVCACHE_SPACE``); unused on GPUs."""
    gpu_memory_utilization: float = 0.5
    """Share of GPU memory vLLM may take; the rest holds the torch policy copy and the
    drafter trainer."""
    threads: int | None = None
    """CPU threads of vLLM's worker (``OMP_NUM_THREADS``, unbound); None: vLLM's default."""
    recompute_tokens: int = 8192
    """Padded tokens per forward when recomputing hidden states / log-probs."""
    seed: int = 0
    """vLLM's engine seed (requests carry their own seeds)."""
    push_bucket_mb: int = 1024
    """Most MiB of policy tensors per bucket pushed into vLLM (``spec.weightSync.bucketMB``;
    a tensor larger than a bucket goes alone)."""


class VllmEngine(RolloutEngine):
    """Rollout on vLLM with Longtail's online drafter (see the module text)."""

    def __init__(
        self,
        model: nn.Module,
        model_dir: str | Path,
        *,
        speculative: SpeculativeSpec | None = None,
        drafter: EagleDrafter | None = None,
        config: VllmEngineConfig | None = None,
    ) -> None:
        self.config = config or VllmEngineConfig()
        self.target = TargetModel(model)
        self.spec = speculative or SpeculativeSpec(enabled=False)
        self.model_dir = Path(model_dir)
        self._drafter = drafter  # vLLM drafts with its export; this is the torch original
        self.schedule: VllmSchedule | None = None
        self.stats = RolloutStats()
        self.metrics: RolloutMetrics | None = None
        self.running = 0
        self._torn: str | None = None  # why vLLM holds no whole policy version, or None
        self._lock = threading.Lock()  # a push never runs beside a generate
        self._tmp = tempfile.TemporaryDirectory(prefix="longtail-vllm-")
        speculative_config = None
        if self.spec.enabled:
            if drafter is None:
                raise ValueError(
                    "speculative.enabled is true but no drafter was given; pass the job's "
                    "drafter, or set speculative.enabled=false"
                )
            engine_tensors(drafter.trainable_state_dict(), "vllm")  # exact layout, or refuse
            self.schedule = vllm_schedule(self.spec, self.config.max_running)
            speculative_config = {
                "method": "eagle",
                "model": str(self._export(drafter)),
                "num_speculative_tokens": self.schedule.num_speculative_tokens,
                "num_speculative_tokens_per_batch_size": self.schedule.per_batch_size,
            }
        self.llm = self._start(speculative_config)
        if self.target.device.type == "cpu":  # vLLM parts broken on CPU: vllm_cpu_kernels.py
            self.llm.collective_rpc("longtail_exact_cpu_seeded_prefill")
            if speculative_config is not None:
                self.llm.collective_rpc("longtail_exact_cpu_sampling")

    def _export(self, drafter: EagleDrafter) -> Path:
        src = save_drafter(drafter, Path(self._tmp.name) / "drafter")
        out = Path(self._tmp.name) / "eagle"
        export_drafter(src, out, str(self.model_dir), engine="vllm", overwrite=True)
        return out

    def _start(self, speculative_config: dict[str, Any] | None) -> LLM:
        cfg = self.config
        if self.target.device.type == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.cpu_kv_cache_gib))
            if cfg.threads is not None:  # vLLM would pin its own cores; follow the role's CPUs
                os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
                os.environ.setdefault("OMP_NUM_THREADS", str(cfg.threads))
        # vLLM's engine core and worker run inside this process (one device per rollout worker,
        # so no executor processes are needed): no child process outlives a killed worker, and
        # every request of a generate() call is queued before the first engine step.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        dtype = DTYPE_NAMES.get(self.target.dtype)
        if dtype is None:
            raise ValueError(f"model.dtype: vLLM cannot run a {self.target.dtype} policy")
        quiet_harmless_vllm_warnings()  # its start-up and every push would warn (vllm_logs.py)
        return LLM(
            model=str(self.model_dir),
            dtype=dtype,
            seed=cfg.seed,
            max_num_seqs=cfg.max_running,
            max_model_len=cfg.max_model_len or self.target.max_positions,
            enforce_eager=self.target.device.type == "cpu",
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            skip_tokenizer_init=True,
            speculative_config=speculative_config,
            # accepted drafts per sequence (vLLM refuses the option without a drafter)
            per_request_spec_decode_metrics="summary" if speculative_config else "none",
            worker_extension_cls=EXTENSION,
            distributed_executor_backend="uni",
        )

    # --- weights ----------------------------------------------------------------------------

    def policy_loaded(self, bucket_bytes: int | None = None) -> None:
        """Push the torch copy's weights (just loaded by the worker) into vLLM, in place, in
        buckets of ``bucket_bytes`` (default: ``config.push_bucket_mb``). Raises
        :class:`PolicyPushError` if any bucket fails; the engine then refuses to generate
        until a later call has pushed a whole version."""
        size = bucket_bytes if bucket_bytes is not None else self.config.push_bucket_mb << 20
        if size < 1:  # refused before anything is pushed: vLLM keeps its version
            raise ValueError(f"bucket_bytes is {size}: give a positive size (weightSync.bucketMB)")
        with self._lock:
            self._torn = "a policy push is under way"
            t0 = time.perf_counter()
            try:
                buckets, nbytes = push_policy(self.llm, self.target.model.state_dict(), size)
            except PolicyPushError as exc:
                self._torn = str(exc)
                raise
            self._torn = None
        log.info(
            "policy weights loaded into vLLM (%d MB in %d buckets, %.2f s)",
            nbytes >> 20,
            buckets,
            _since(t0),
        )

    def _check_policy(self) -> None:
        if self._torn is not None:
            raise PolicyPushError(
                f"vLLM holds no whole policy version ({self._torn}); it will not generate "
                "until a whole version is pushed (policy_loaded, which the rollout worker "
                "calls when it loads the next version)"
            )

    def set_drafter(self, drafter: EagleDrafter) -> None:
        """Hot-swap ``drafter`` into the running engine (from the next :meth:`generate` on)."""
        tensors = engine_tensors(drafter.trainable_state_dict(), "vllm")
        if self.schedule is not None:
            t0 = time.perf_counter()
            self.llm.collective_rpc("longtail_load_drafter", args=(serialize_state_dict(tensors),))
            log.info("drafter weights loaded into vLLM (%.2f s)", _since(t0))
        self._drafter = drafter

    @property
    def drafter(self) -> EagleDrafter | None:
        """The drafter last given (constructor or :meth:`set_drafter`), whose export vLLM
        drafts with when speculative decoding is on; ``None`` without one."""
        return self._drafter

    def probe(self) -> dict[str, Any]:
        """vLLM worker facts tests check (drafter present, embedding shared with the policy)."""
        result: dict[str, Any] = self.llm.collective_rpc("longtail_probe")[0]
        return result

    # --- generation -------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Complete every request (see :class:`RolloutEngine`); results in request order."""
        prompts, params = self._vllm_inputs(requests)
        t0 = time.perf_counter()
        with self._lock:
            self._check_policy()
            self.running = len(requests)
            try:
                outputs = self.llm.generate(prompts, params, use_tqdm=False)
            finally:
                self.running = 0
        results = [_result(r, o.outputs[0]) for r, o in zip(requests, outputs, strict=True)]
        self._recompute(list(requests), results)
        self._record(outputs, results, time.perf_counter() - t0)
        return results

    def _vllm_inputs(
        self, requests: Sequence[GenerationRequest]
    ) -> tuple[list[TokensPrompt], list[SamplingParams]]:
        """Check ``requests`` against the model and turn them into vLLM's prompts and params."""
        for r in requests:
            r.validate(self.target.vocab_size, self.target.max_positions)
        prompts = [
            TokensPrompt(prompt_token_ids=[int(t) for t in r.prompt_token_ids]) for r in requests
        ]
        return prompts, [_sampling_params(r) for r in requests]

    def time_generate(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> tuple[float, int]:
        """``(wall-clock seconds, engine steps)`` of one bare ``LLM.generate`` of ``prompts``,
        each row making exactly ``max_tokens`` tokens (temperature 1, row ``i`` seeded ``i``, no
        stop token). For ``longtail profile --engine vllm`` (``profile/vllm_steps.py``): unlike
        :meth:`generate` it neither recomputes log-probs nor records stats, so the time is
        vLLM's alone. Steps count the prefill as one, then one per verify (or plain) step of
        the slowest row."""
        if not prompts or len(prompts) > self.config.max_running:
            raise ValueError(
                f"{len(prompts)} prompts: give 1 to max_running={self.config.max_running}"
            )
        requests = [
            GenerationRequest(list(p), max_tokens, temperature=1.0, seed=i)
            for i, p in enumerate(prompts)
        ]
        ids, params = self._vllm_inputs(requests)
        with self._lock:
            self._check_policy()
            t0 = time.perf_counter()
            outputs = self.llm.generate(ids, params, use_tqdm=False)
            seconds = _since(t0)
        return seconds, max(_engine_steps(o.outputs[0]) for o in outputs)

    @torch.no_grad()
    def _recompute(
        self, requests: list[GenerationRequest], results: list[GenerationResult]
    ) -> None:
        """One policy forward per group: hidden states (if asked) and contract log-probs."""
        order = sorted(range(len(results)), key=lambda i: _length(results[i]))
        group: list[int] = []
        for i in order:  # ascending length: the newest row is the widest of its group
            if group and _length(results[i]) * (len(group) + 1) > self.config.recompute_tokens:
                self._recompute_group([requests[j] for j in group], [results[j] for j in group])
                group = []
            group.append(i)
        if group:
            self._recompute_group([requests[j] for j in group], [results[j] for j in group])

    def _recompute_group(
        self, requests: list[GenerationRequest], results: list[GenerationResult]
    ) -> None:
        dev = self.target.device
        seqs = [(res.prompt_token_ids, res.output_token_ids) for res in results]
        states = response_states(self.target.model, seqs)  # [T, H] each
        for req, res, h in zip(requests, results, states, strict=True):
            logits = self.target.lm_head(h)[None]  # [1, T, V]
            temp = torch.tensor([req.temperature], device=dev)
            tokens = torch.tensor([res.output_token_ids], device=dev)  # [1, T]
            res.output_logprobs = token_logprobs(logits, temp, tokens)[0].tolist()
            res.hidden_states = h if req.return_hidden_states else None

    def _record(self, outputs: list[Any], results: list[GenerationResult], seconds: float) -> None:
        """Fold vLLM's per-sequence speculative stats into the same counters the torch engine
        keeps (engine steps are not visible through ``LLM.generate``: see stats.py)."""
        lengths: list[int] = []
        sd_tokens = drafted = steps = sd_steps = 0
        for out, res in zip(outputs, results, strict=True):
            m = out.outputs[0].spec_decode_metrics
            if m is None:
                steps = max(steps, len(res.output_token_ids))
                continue
            hist = list(m.histogram)  # hist[j]: verify steps in which j drafts were accepted
            row = [j + 1 for j, c in enumerate(hist) for _ in range(c)]
            res.spec_steps, res.drafted_tokens = len(row), int(m.num_draft_tokens)
            res.accepted_tokens = sum(j * c for j, c in enumerate(hist))
            row_sd = min(sum(row), len(res.output_token_ids))
            lengths += row
            sd_tokens += row_sd
            drafted += res.drafted_tokens
            steps = max(steps, len(row) + len(res.output_token_ids) - row_sd)
            sd_steps = max(sd_steps, len(row))
        tokens = sum(len(r.output_token_ids) for r in results)
        self.stats.add_sequences(
            tokens=tokens,
            sd_tokens=sd_tokens,
            drafted=drafted,
            accepted_lengths=lengths,
            seconds=seconds,
            batch_size=len(results),
            steps=steps,
            sd_steps=sd_steps,
        )
        if self.metrics is not None:
            self.metrics.observe_sequences(
                self.stats,
                tokens=tokens,
                drafted=drafted,
                accepted_lengths=lengths,
                seconds=seconds,
            )

    def close(self) -> None:
        """Stop vLLM's engine core and drop the exported drafter files."""
        shutdown = getattr(self.llm.llm_engine.engine_core, "shutdown", None)
        if shutdown is not None:
            shutdown()
        self._tmp.cleanup()


def cpu_head_sizes() -> list[int]:
    """Attention head sizes vLLM's CPU backend has kernels for (another fails at the first
    step); for ``profile/vllm_steps.py``'s early check."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return [int(n) for n in CPUAttentionBackend.get_supported_head_sizes()]


def _since(t0: float) -> float:
    return time.perf_counter() - t0


def _engine_steps(out: Any) -> int:
    """Engine steps one vLLM completion took: the prefill (its first token), one per verify
    step (``spec_decode_metrics``: ``histogram[j]`` steps accepted ``j`` drafts, so made
    ``j + 1`` tokens), one per token made without speculation."""
    n = len(out.token_ids)
    m = out.spec_decode_metrics
    if m is None:
        return n
    hist = [int(c) for c in m.histogram]
    verified = min(sum((j + 1) * c for j, c in enumerate(hist)), n)
    return sum(hist) + n - verified


def _length(res: GenerationResult) -> int:
    return len(res.prompt_token_ids) + len(res.output_token_ids) - 1


def _sampling_params(r: GenerationRequest) -> SamplingParams:
    return SamplingParams(
        temperature=r.temperature,
        top_p=r.top_p,
        seed=None if r.seed is None else r.seed % 2**63,  # None: vLLM's own random stream
        max_tokens=r.max_new_tokens,
        stop_token_ids=[int(t) for t in r.stop_token_ids],
        ignore_eos=True,  # only the request's stop tokens end it, as in the torch engine
        detokenize=False,
    )


def _result(r: GenerationRequest, out: Any) -> GenerationResult:
    tokens = [int(t) for t in out.token_ids]
    finish: FinishReason = "stop" if tokens and tokens[-1] in set(r.stop_token_ids) else "length"
    return GenerationResult(
        request_id=r.request_id,
        prompt_token_ids=[int(t) for t in r.prompt_token_ids],
        output_token_ids=tokens,
        output_logprobs=[],  # filled by VllmEngine._recompute
        finish_reason=finish,
    )
