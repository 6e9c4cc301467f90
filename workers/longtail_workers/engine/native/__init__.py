"""The native torch engine: static batch buffers, captured steps and the speculative step.

:class:`~longtail_workers.engine.native.torch_engine.TorchEngine` implements
``engine/interface.py``'s :class:`~longtail_workers.engine.interface.RolloutEngine`; the rollout
worker (``rollout/service.py``), the profiler and the benches make it. Everything else in this
folder is its machinery (rows, steps, graphs, scheduler, sizing, the EAGLE decoder of
``specdec.py`` and the history drafter of ``history.py``). It imports the shared engine modules
(``interface``, ``sampling``, ``rejection``, ``stats``, ``sd_policy``, ``target``), never the
vLLM engine's folder (an import contract in ``pyproject.toml``).
"""
