"""Longtail's methods inside vLLM's worker: load policy and drafter weights in place.

vLLM runs the model in a worker object (``worker_extension_cls`` mixes this class into it; the
rollout worker runs it in its own process, ``VllmEngine`` turns vLLM's multiprocessing off).
:class:`~longtail_workers.engine.vllm.vllm_engine.VllmEngine` reaches these methods with
``LLM.collective_rpc(name, args=...)``; nothing else calls them. Both loads go through
vLLM's in-place layerwise reload (checkpoint-format names, then the same kernel
post-processing as at start-up, e.g. the CPU backend's weight packing), so the engine keeps its
KV cache, scheduler and compiled state and only the weights change.

A policy version arrives in buckets (``longtail_policy_begin``, one ``longtail_policy_bucket``
per bucket, ``longtail_policy_finish``): the lifecycle vLLM's own weight-transfer engines run
(``initialize_layerwise_reload``, ``model.load_weights`` per chunk,
``finalize_layerwise_reload``). A layer is post-processed only once all of its weights are in,
whichever buckets they came in; calling ``reload_weights`` per bucket instead would
post-process a fused layer (``qkv_proj``, ``gate_up_proj``) whose shards straddle two buckets
with the missing shards' memory uninitialised (docs/vllm.md). Between begin and finish the
model is torn (layers not yet complete live on the meta device): the engine never generates
then, and a push that fails is unwound with ``longtail_policy_abort`` and the engine refuses
to generate until a whole version has been pushed (``VllmEngine``).

The drafter shares the target's embedding and LM head (vLLM ties them when the EAGLE checkpoint
has none, as Longtail's exports do); a drafter push therefore carries only ``fc.*`` and
``layers.0.*`` and is refused if it names anything else, so it can never overwrite the policy's
embedding (a pitfall of the public TLT code). Drafter weights travel as safetensors bytes;
policy buckets as ``(name, tensor)`` lists by reference: ``VllmEngine`` runs vLLM in its own
process (in-process engine core, uniprocess executor), where ``collective_rpc`` calls these
methods directly with its arguments, so a bucket is never serialised or copied on the way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from safetensors.torch import load
from torch import Tensor

DRAFTER_PREFIXES = ("fc.", "layers.0.")
"""The only weight names a drafter push may carry (vLLM EAGLE-1 checkpoint names)."""


class LongtailWorkerExtension:
    """Mixed into vLLM's worker (``self`` is that worker: ``model_runner``, ``vllm_config``)."""

    model_runner: Any
    vllm_config: Any
    _longtail_push: set[str] | None = None
    """Parameter names loaded so far by the open policy push; None: no push open."""

    def longtail_policy_begin(self) -> None:
        """Open a policy push: every layer waits for its weights (vLLM's layerwise reload)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        if self._longtail_push is not None:
            raise RuntimeError("a policy push is already open; finish or abort it first")
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self.model_runner.get_model())
        self._longtail_push = set()

    def longtail_policy_bucket(self, tensors: Sequence[tuple[str, Tensor]]) -> int:
        """Load one bucket of HF-named policy tensors into the open push; returns how many.
        A layer whose weights are all in is post-processed now, the others wait."""
        from vllm.config import set_current_vllm_config

        if self._longtail_push is None:
            raise RuntimeError("policy bucket without an open push (longtail_policy_begin)")
        with set_current_vllm_config(self.vllm_config):
            loaded = self.model_runner.get_model().load_weights(iter(tensors))
        self._longtail_push.update(loaded or ())
        return len(tensors)

    def longtail_policy_finish(self) -> int:
        """Close the push: post-process what is left (attention layers), then check that every
        parameter of the model was loaded (a missing one would hold uninitialised memory);
        returns the parameters loaded."""
        loaded = self._close_push()
        expected = {name for name, _ in self.model_runner.get_model().named_parameters()}
        missing = sorted(expected - loaded)
        if missing:
            raise RuntimeError(
                f"policy push left {len(missing)} parameters unloaded ({missing[:5]}): "
                "the pushed state dict does not cover the served model"
            )
        self.model_runner.reset_lora_state()  # what vLLM's reload_weights resets too
        self.model_runner.reset_encoder_cache()
        self.model_runner.reset_mm_cache()
        return len(loaded)

    def longtail_policy_abort(self) -> bool:
        """Unwind a failed push so the model holds real tensors again (their values a mix of
        versions: the engine must not generate until a whole version is pushed); returns
        whether a push was open."""
        if self._longtail_push is None:
            return False
        self._close_push()
        return True

    def _close_push(self) -> set[str]:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_processing

        loaded, self._longtail_push = self._longtail_push, None
        if loaded is None:
            raise RuntimeError("no policy push is open (longtail_policy_begin)")
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_processing(
                self.model_runner.get_model(), self.vllm_config.model_config
            )
        return loaded

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

        from longtail_workers.engine.vllm import vllm_cpu_kernels as exact

        if HAS_TRITON or self.model_runner.device.type != "cpu":
            return False
        register_kernels({"vllm.v1.sample.rejection_sampler.expand_kernel": exact.expand})
        return True

    def longtail_exact_cpu_seeded_prefill(self) -> bool:
        """On CPU, make a seeded request's chunked prefill restore its generator instead of
        rewinding an offset a CPU generator does not have (``vllm_cpu_kernels``); returns
        whether it did."""
        from longtail_workers.engine.vllm.vllm_cpu_kernels import SeededChunkedPrefill

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
