"""Longtail's methods inside vLLM's worker: load policy and drafter weights in place.

vLLM runs the model in a worker object (``worker_extension_cls`` mixes this class into it; the
rollout worker runs it in its own process, ``VllmEngine`` turns vLLM's multiprocessing off).
:class:`~longtail_workers.engine.vllm_engine.VllmEngine` reaches these methods with
``LLM.collective_rpc(name, args=...)``; nothing else calls them. Both loads go through
vLLM's in-place reload (``reload_weights``: checkpoint-format names, then the same kernel
post-processing as at start-up, e.g. the CPU backend's weight packing), so the engine keeps its
KV cache, scheduler and compiled state and only the weights change.

The drafter shares the target's embedding and LM head (vLLM ties them when the EAGLE checkpoint
has none, as Longtail's exports do); a drafter push therefore carries only ``fc.*`` and
``layers.0.*`` and is refused if it names anything else, so it can never overwrite the policy's
embedding (a pitfall of the public TLT code). Weights travel as safetensors bytes: vLLM's RPC
encoder turns tensors nested in a dict into lists.
"""

from __future__ import annotations

from typing import Any

from safetensors.torch import load

DRAFTER_PREFIXES = ("fc.", "layers.0.")
"""The only weight names a drafter push may carry (vLLM EAGLE-1 checkpoint names)."""


class LongtailWorkerExtension:
    """Mixed into vLLM's worker (``self`` is that worker: ``model_runner``, ``vllm_config``)."""

    model_runner: Any
    vllm_config: Any

    def longtail_load_policy(self, blob: bytes) -> int:
        """Load a full HF-named policy state dict (safetensors bytes) in place; returns the
        tensors loaded."""
        state = load(blob)
        self.reload_weights(  # type: ignore[attr-defined]  # vLLM Worker method
            weights_iterator=iter(state.items()), is_checkpoint_format=True
        )
        return len(state)

    def longtail_load_drafter(self, blob: bytes) -> int:
        """Load EAGLE-1 drafter weights (``fc.*``, ``layers.0.*``; safetensors bytes) in place;
        returns the tensors loaded."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        state = load(blob)
        stray = sorted(k for k in state if not k.startswith(DRAFTER_PREFIXES))
        if stray:
            raise ValueError(
                f"drafter push names {stray[:5]}: only fc.* and layers.0.* may be loaded "
                "(the embedding and LM head are the policy's)"
            )
        draft = self.model_runner.get_draft_model()
        if draft is None:
            raise RuntimeError("this vLLM engine has no draft model (speculative decoding off)")
        with set_current_vllm_config(self.vllm_config):
            reload_weights(
                self.vllm_config,
                draft,
                weights_iterator=iter(state.items()),
                weights_path=None,
                is_checkpoint_format=True,
            )
        return len(state)

    def longtail_exact_cpu_sampling(self) -> bool:
        """On CPU without Triton, replace vLLM's broken C++ ``expand_kernel`` fallback with an
        exact torch one (``vllm_cpu_kernels``); returns whether it did."""
        from vllm.triton_utils import HAS_TRITON
        from vllm.triton_utils.dispatcher import register_kernels

        from longtail_workers.engine import vllm_cpu_kernels as exact

        if HAS_TRITON or self.model_runner.device.type != "cpu":
            return False
        register_kernels({"vllm.v1.sample.rejection_sampler.expand_kernel": exact.expand})
        return True

    def longtail_exact_cpu_seeded_prefill(self) -> bool:
        """On CPU, make a seeded request's chunked prefill restore its generator instead of
        rewinding an offset a CPU generator does not have (``vllm_cpu_kernels``); returns
        whether it did."""
        from longtail_workers.engine.vllm_cpu_kernels import SeededChunkedPrefill

        if self.model_runner.device.type != "cpu":
            return False
        SeededChunkedPrefill(self.model_runner).install()
        return True

    def longtail_probe(self) -> dict[str, Any]:
        """What tests check: is the drafter's embedding the policy's very tensor?"""
        target = self.model_runner.get_model()
        draft = self.model_runner.get_draft_model()
        shared = None
        if draft is not None:
            shared = draft.model.embed_tokens.weight is target.model.embed_tokens.weight
        return {"hasDrafter": draft is not None, "sharedEmbedding": shared}
