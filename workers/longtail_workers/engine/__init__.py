"""Rollout engines: batched generation with adaptive, lossless speculative decoding.

The rollout worker drives an engine through ``interface.RolloutEngine``. The native backend is
``torch_engine.TorchEngine`` (CPU, tests, the tail on GPUs); a vLLM backend can implement the same
interface. Submodules are imported directly
(``from longtail_workers.engine.torch_engine import TorchEngine``) so that the pure-Python pieces
(``sd_policy``) stay importable without torch.
"""
