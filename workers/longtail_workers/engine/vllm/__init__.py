"""The vLLM rollout engine: Longtail's contract, drafter and weight sync on top of vLLM.

:class:`~longtail_workers.engine.vllm.vllm_engine.VllmEngine` implements
``engine/interface.py``'s :class:`~longtail_workers.engine.interface.RolloutEngine`; the rollout
worker (``rollout/service.py``, ``rollout.engine: vllm``) and the benches make it. The other
modules are its parts: the worker extension loaded inside vLLM's processes (``vllm_ext.py``,
with the exact CPU kernels of ``vllm_cpu_kernels.py``), the policy push, the scheduler limits and
the log filter. Only this folder imports ``vllm``, and it never imports the native engine's
folder (import contracts in ``pyproject.toml``).
"""
