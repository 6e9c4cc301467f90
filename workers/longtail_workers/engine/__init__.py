"""Rollout engines: batched generation with adaptive, lossless speculative decoding.

The rollout worker drives an engine through ``interface.RolloutEngine``. Two backends implement
it, each in its own folder: ``native/`` (``TorchEngine``: CPU, tests, the tail on GPUs) and
``vllm/`` (``VllmEngine``, ``rollout.engine: vllm``); neither imports the other. The modules at
this level are what both share or what callers use whatever the backend: the contract
(``interface``), sampling and the lossless acceptance rule (``sampling``, ``rejection``), the
statistics (``stats``), the SD policy (``sd_policy``) and the target model wrapper
(``target``). Submodules are imported directly
(``from longtail_workers.engine.native.torch_engine import TorchEngine``) so that the pure-Python
pieces (``sd_policy``) stay importable without torch.
"""
